"""The quickstart Makefile: `make` alone lists the targets, and DEMO_DIR reaches every stage
of `make demo` (run with stand-ins for bert-jax and python that log their arguments)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _make(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "-C", REPO, *args],
                          capture_output=True, text=True, env=env, timeout=120)


def test_make_alone_lists_the_targets():
    done = _make()
    assert done.returncode == 0, done.stderr
    assert "is up to date" not in done.stdout
    for target in ("help", "demo", "demo-docs", "test", "clean"):
        assert f"\n  {target} " in done.stdout, target


def _fake_venv(root, log) -> str:
    """A virtualenv whose install stamp is current and whose bert-jax and python log each
    call (python runs the demo's inline scripts for real: they write the task's files)."""
    venv = root / "venv"
    (venv / "bin").mkdir(parents=True)
    stamp = subprocess.run("cat setup.cfg pyproject.toml | cksum | cut -d' ' -f1", shell=True,
                           cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    (venv / f".installed-demo-{stamp}").touch()
    (venv / "bin" / "bert-jax").write_text(f'#!/bin/bash\necho "bert-jax $*" >> {log}\n')
    (venv / "bin" / "python").write_text(
        f'#!/bin/bash\necho "python $*" >> {log}\n'
        f'if [ "$1" = - ]; then exec {sys.executable} "$@"; fi\n')
    for name in ("bert-jax", "python"):
        (venv / "bin" / name).chmod(0o755)
    return str(venv)


def test_demo_dir_reaches_every_stage(tmp_path):
    log, out = tmp_path / "calls.log", tmp_path / "elsewhere"
    venv = _fake_venv(tmp_path, log)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEMO_")}
    done = _make("demo", f"VENV={venv}", env={**env, "DEMO_DIR": str(out)})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    calls = log.read_text().splitlines()
    commands = [c.split()[1] for c in calls if c.startswith("bert-jax ")]
    assert commands == ["train-tokenizer", "create-pretraining-data", "pretrain", "finetune"]
    for call in calls:
        if call.startswith("bert-jax "):
            paths = [a.split("=", 1)[-1] for a in call.split()[2:]
                     if "demo_workdir" in a or str(tmp_path) in a]
            assert paths and all(p.startswith(str(out)) for p in paths), call
    finetune = next(c for c in calls if c.startswith("bert-jax finetune"))
    assert f"--config.init_checkpoint={out}/pretrain" in finetune
    assert (out / "which_book_data" / "train.tsv").is_file()
    assert "demo_workdir" not in log.read_text()
