"""The pretraining workdir is checked before it is touched and locked while a run uses
it; its metrics.jsonl holds every step once after a resume."""

import json
import os
import socket
import subprocess
import sys

import pytest

from bert_jax import fileio
from bert_jax.checkpoint import store
from bert_jax.errors import BertJaxError
from bert_jax.runs.metrics import MetricsWriter, read_metrics
from bert_jax.training import config as config_lib
from bert_jax.training.loop import train_and_evaluate
from tests.training.helpers import small_config

RUN = ("--config.log_every=1", "--config.checkpoint.every_steps=2", "--config.eval_steps=0",
       "--config.optimizer.warmup_steps=1", "--config.num_train_steps=4")


def _snapshot(workdir):
    return {os.path.relpath(os.path.join(d, f), workdir): open(os.path.join(d, f), "rb").read()
            for d, _, files in os.walk(workdir) for f in files}


def _pretraining_workdir(workdir, config):
    """What a run leaves behind, without training: config.json and a checkpoint step."""
    store.write_config(str(workdir), config_lib.model_config(config),
                       extra={"experiment": config.to_dict()})
    os.makedirs(workdir / "checkpoints" / "2" / "params")


def test_workdir_checked_and_locked_before_it_is_touched(tmp_path):
    _pretraining_workdir(tmp_path, small_config(*RUN))
    before = _snapshot(tmp_path)
    # Another model shape or optimizer: refused before config.json is replaced.
    with pytest.raises(BertJaxError, match="model.type_vocab_size=2.*has 3"):
        train_and_evaluate(small_config(*RUN, "--config.model.type_vocab_size=3"),
                           str(tmp_path))
    with pytest.raises(BertJaxError, match="optimizer.name='adamw'.*'lamb'"):
        train_and_evaluate(small_config(*RUN, "--config.optimizer.name=lamb"), str(tmp_path))
    # A live process holds the workdir: a second run says who.
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with open(tmp_path / fileio.LOCK_FILE, "w") as f:
            json.dump({"pid": holder.pid, "host": socket.gethostname()}, f)
        with pytest.raises(BertJaxError, match=f"in use by process {holder.pid}"):
            train_and_evaluate(small_config(*RUN), str(tmp_path))
    finally:
        holder.kill()
        holder.wait()
    os.remove(tmp_path / fileio.LOCK_FILE)
    assert _snapshot(tmp_path) == before


def test_metrics_after_resume_hold_each_step_once(tmp_path):
    writer = MetricsWriter(str(tmp_path))
    for step in (1, 2, 3, 4):
        writer.write(step, {"loss": float(step)})
    writer.write(2, {"loss": 0.5}, prefix="eval")
    writer.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "spl')  # a line cut short by a kill
    # Resumed from the step-2 checkpoint: steps 3, 4 (and the cut line) are written again.
    writer = MetricsWriter(str(tmp_path), after_step=2)
    for step in (3, 4):
        writer.write(step, {"loss": float(step)})
    writer.close()
    assert [r["step"] for r in read_metrics(str(tmp_path))] == [1, 2, 3, 4]
    assert [r["step"] for r in read_metrics(str(tmp_path), "eval")] == [2]


def test_pretraining_refuses_a_fine_tuning_workdir(tmp_path):
    store.write_config(str(tmp_path), config_lib.model_config(small_config()),
                       extra={"task": "mrpc", "finetune": {}})
    before = _snapshot(tmp_path)
    with pytest.raises(BertJaxError, match="holds a fine-tuning run.*--overwrite"):
        train_and_evaluate(small_config(*RUN), str(tmp_path))
    assert _snapshot(tmp_path) == before


def test_overwrite_moves_the_old_workdir_aside_whole(tmp_path, capsys):
    """--overwrite: the fine-tuning run the workdir held is moved aside intact and named;
    the workdir then holds the pretraining run alone (no mixed workdir)."""
    workdir = tmp_path / "run"
    store.write_config(str(workdir), config_lib.model_config(small_config()),
                       extra={"task": "mrpc", "finetune": {}})
    (workdir / "metrics.json").write_text("{}")
    old = _snapshot(workdir)
    train_and_evaluate(small_config(*RUN), str(workdir), overwrite=True)
    aside = tmp_path / "run.replaced-1"
    assert f"moved the previous contents of {workdir} to {aside}" in capsys.readouterr().out
    assert _snapshot(aside) == old
    assert "metrics.json" not in os.listdir(workdir)
    _, extra = store.read_config(str(workdir))
    assert "experiment" in extra and "task" not in extra
    assert store.step_dirs(str(workdir))
