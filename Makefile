# Quickstart targets. Each creates and uses a local virtualenv (.venv) by itself.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= $(CURDIR)/.venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
CKSUM := $(shell cat setup.cfg pyproject.toml | cksum | cut -d' ' -f1)
# pip without -q: one line per package it collects, a progress bar per download.
PIP_INSTALL := $(PIP) install --disable-pip-version-check --progress-bar on
# Lines of pip's output that say nothing to a user (the editable build of this package).
PIP_CHATTER := ^ *(Installing build dependencies|Checking if build backend|Getting requirements \
to build|Preparing editable metadata|Building editable for|Created wheel for|Stored in \
directory)|^(Building wheels for collected|Successfully built)|Requirement already satisfied

# Where the demo writes (scripts/demo.sh and scripts/demo_finetune.sh read it too).
DEMO_DIR ?= demo_workdir
export DEMO_DIR

.DEFAULT_GOAL := help
.PHONY: help demo demo-docs test lint clean

## make help: this list (the default target)
help:
	@echo "bert-jax: make TARGET"
	@sed -n 's/^## make //p' $(MAKEFILE_LIST) | sed 's/^\([a-z-]*\):/  \1\t/' | expand -t 14

$(PY):
	@echo "== creating the virtualenv $(VENV)"
	@$(PYTHON) -m venv $(VENV)

# One stamp per extra: `make demo` installs the runtime + demo extra only (no torch or
# transformers); `make test` adds the test stack on top.
$(VENV)/.installed-%-$(CKSUM): setup.cfg pyproject.toml | $(PY)
	@echo "== installing bert-jax[$*] into $(VENV) (the first time takes a few minutes)"
	@$(PIP_INSTALL) -e '.[$*]' 2>&1 | grep --line-buffered -v -E "$(PIP_CHATTER)"; \
		test $${PIPESTATUS[0]} -eq 0
	@rm -f $(VENV)/.installed-$*-*; touch $@

## make demo: text -> tokenizer -> data -> pretrain a tiny BERT -> fine-tune it (CPU, ~6 min)
# DEMO_DIR=DIR writes every stage under DIR instead of demo_workdir/.
demo: $(VENV)/.installed-demo-$(CKSUM)
	PATH=$(VENV)/bin:$$PATH bash scripts/demo.sh
	PATH=$(VENV)/bin:$$PATH bash scripts/demo_finetune.sh $(DEMO_DIR)/pretrain

## make demo-docs: make demo, then write what it printed into README.md and docs/
# (the marked blocks <!-- demo:NAME --> ... <!-- /demo:NAME --> that quote it).
demo-docs: export DEMO_WRITE_DOCS = 1
demo-docs: demo

LINT_DIRS := bert_jax tests bench experiments scripts

## make test: style (ruff) on every Python folder, then the whole test suite on the CPU
# (8 simulated devices; three workers on two cores: while one waits on the processes a test
# starts, the others compute)
test: lint
	PATH=$(VENV)/bin:$$PATH $(PY) -m pytest -q -n 3 --dist loadgroup --durations=30 tests

lint: $(VENV)/.installed-test-$(CKSUM)
	$(VENV)/bin/ruff check $(LINT_DIRS)

## make clean: remove the virtualenv and the demo's outputs
clean:
	rm -rf $(VENV) .pytest_cache $(DEMO_DIR)
