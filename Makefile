# Quickstart targets. Each creates and uses a local virtualenv (.venv) by itself.
PYTHON ?= python3
VENV ?= $(CURDIR)/.venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed-$(shell cat setup.cfg pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: demo test lint bench-data clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[test]'
	rm -f $(VENV)/.installed-*; touch $(STAMP)

## make demo: raw text -> tokenizer -> pretraining data -> pretrain a tiny BERT -> fine-tune it
demo: $(STAMP)
	PATH=$(VENV)/bin:$$PATH bash scripts/demo.sh
	PATH=$(VENV)/bin:$$PATH bash scripts/demo_finetune.sh demo_workdir/pretrain

LINT_DIRS := bert_jax tests bench experiments scripts

## make test: style (ruff) on every Python folder, then the whole test suite on the CPU
## (8 simulated devices)
test: lint
	PATH=$(VENV)/bin:$$PATH $(PY) -m pytest -q -n 2 --dist loadgroup tests

lint: $(STAMP)
	$(VENV)/bin/ruff check $(LINT_DIRS)

clean:
	rm -rf $(VENV) .pytest_cache demo_workdir
