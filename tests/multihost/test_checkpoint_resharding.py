"""A checkpoint written by N processes restores with M processes: 2 processes train and save
through the real CLI; 1 process (in this test process, 8 devices) and 4 processes (1 device
each) resume from it with the parameters that were saved and continue exactly as the run that
was never stopped. Same-count resume on the tf.data pipeline, whose iterator
state names the process."""

from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import pytest

from bert_jax.checkpoint import store
from bert_jax.training.config import load_config
from bert_jax.training.loop import train_and_evaluate

from .helpers import EXPERIMENT, RUN_S, SMALL, pretrain_command, run_all, train_losses

pytestmark = pytest.mark.multiprocess


def step_params(workdir, step: int) -> dict:
    """Parameters saved at ``step``, as numpy, restored with no target tree: a checkpoint
    written by other processes (another topology) loads on this one."""
    params_dir = store.resolve(f"{workdir}/checkpoints/{step}")[1]
    return store.load_params(params_dir)


def in_process(workdir, *overrides: str) -> dict:
    return train_and_evaluate(load_config(f"{EXPERIMENT}:tiny", [*SMALL, *overrides]),
                              str(workdir))


def stopped_at(run, copy, step: int) -> None:
    """``copy``: ``run``'s workdir as if it had stopped after ``step`` (later checkpoints and
    metric records removed)."""
    shutil.copytree(run, copy)
    for saved in (copy / "checkpoints").iterdir():
        if saved.name.isdigit() and int(saved.name) > step:
            shutil.rmtree(saved)
    metrics = copy / "metrics.jsonl"
    kept = [line for line in metrics.read_text().splitlines()
            if json.loads(line).get("step", 0) <= step]
    metrics.write_text("".join(line + "\n" for line in kept))


def test_two_process_checkpoint_resumes_on_one_and_four_processes(materialized, tmp_path):
    """2 processes train 6 steps; their step-4 checkpoint resumed by 1 process (FSDP over 8
    devices) and by 4 processes gives the 2-process run's steps 5 and 6 exactly."""
    data = ("--config.data.source=materialized", f"--config.data.directory={materialized}",
            "--config.model.vocab_size=64", "--config.global_batch_size=24",
            "--config.checkpoint.every_steps=2", "--config.num_train_steps=6")
    two = tmp_path / "two"
    run_all([pretrain_command(two, *data)] * 2, timeout=RUN_S)
    one, four = tmp_path / "one", tmp_path / "four"
    stopped_at(two, one, 4)
    stopped_at(two, four, 4)
    # 2 -> 1 process (FSDP over 8 devices), and 2 -> 4 processes.
    result = in_process(one, *data, "--config.parallel.mesh.data=1",
                        "--config.parallel.mesh.fsdp=-1")
    assert result["step"] == 6
    outputs = run_all([pretrain_command(four, *data)] * 4, timeout=RUN_S,
                      devices_per_process=1)
    assert f"resumed from {four}/checkpoints/4" in outputs[0]
    want = train_losses(two)
    assert sorted(want) == list(range(1, 7))
    for run in (one, four):
        got = train_losses(run)
        assert sorted(got) == list(range(1, 7))
        np.testing.assert_allclose([got[s] for s in (5, 6)], [want[s] for s in (5, 6)],
                                   rtol=1e-4)
    # The resumed runs started from exactly the saved parameters and end where the
    # uninterrupted run ends.
    expected = step_params(two, 6)
    for run in (one, four):
        for a, b in zip(jax.tree.leaves(step_params(run, 6)), jax.tree.leaves(expected),
                        strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_tfrecord_run_resumes_on_the_same_and_another_process_count(pretraining_data,
                                                                    tmp_path):
    """2 processes (data over the processes, FSDP within each) train, evaluate on the
    held-out shard and checkpoint; 2 processes resume, then 1."""
    data_dir, vocab = pretraining_data
    data = ("--config.data.source=tfrecord", f"--config.data.directory={data_dir}",
            f"--config.data.tokenizer={vocab}", "--config.global_batch_size=8",
            "--config.checkpoint.every_steps=2", "--config.parallel.mesh.data=2",
            "--config.parallel.mesh.fsdp=-1")
    first = run_all([pretrain_command(tmp_path, *data, "--config.num_train_steps=2",
                                      "--config.eval_steps=2", "--config.eval_every=2")] * 2,
                    timeout=RUN_S)
    summary = json.loads(first[0].strip().splitlines()[-1])
    assert summary["step"] == 2 and "eval_mlm_accuracy" in summary
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) \
        == ["2"]
    # Every process restores the data position (the checkpoint holds process 0's iterator
    # state) and continues.
    outputs = run_all([pretrain_command(tmp_path, *data, "--config.num_train_steps=3")] * 2,
                      timeout=RUN_S)
    assert f"resumed from {tmp_path}/checkpoints/2" in outputs[0]
    result = in_process(tmp_path, *data, "--config.num_train_steps=4")
    assert result["step"] == 4
    assert sorted(train_losses(tmp_path)) == [1, 2, 3, 4]
