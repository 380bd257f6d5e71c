"""A checkpoint written by N processes restores with M processes, in both directions: 1
process (this test process, FSDP over 8 devices) trains uninterrupted; its early checkpoint is
resumed by 2 processes through the CLI (1 -> 2), and theirs by 1 process again (2 -> 1), each
continuing exactly as the run that was never stopped. Same-count resume on the tf.data
pipeline, whose iterator state names the process.

The 2-process runs of both tests share one launch: each process runs the CLI's pretrain
several times, one run after another (a run that resumes an earlier one's workdir restores
its checkpoint from disk)."""

from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import pytest
from training.helpers import without_keys

from bert_jax.checkpoint import store
from bert_jax.training.config import load_config
from bert_jax.training.loop import train_and_evaluate

from .helpers import (
    EXPERIMENT,
    RUN_S,
    SMALL,
    pretrain_args,
    run_all,
    split_runs,
    train_losses,
    worker_command,
)

# One launch serves both tests: xdist keeps them on one worker.
pytestmark = [pytest.mark.multiprocess, pytest.mark.xdist_group("checkpoint_resharding")]

# One layer: checkpoints hold and restore every layer alike.
ONE_LAYER = ("--config.model.num_hidden_layers=1",)
# Materialized batches: the same global batches on any process count, so a resumed run can
# match the uninterrupted one exactly.
MATERIALIZED = ("--config.data.source=materialized", "--config.model.vocab_size=64",
                "--config.global_batch_size=24", "--config.checkpoint.every_steps=2")
FSDP = ("--config.parallel.mesh.data=1", "--config.parallel.mesh.fsdp=-1")
# TFRecord shards through tf.data: data over the 2 processes, FSDP within each.
TFRECORD = ("--config.data.source=tfrecord", "--config.global_batch_size=8",
            "--config.checkpoint.every_steps=2", "--config.parallel.mesh.data=2",
            "--config.parallel.mesh.fsdp=-1")


def step_params(workdir, step: int) -> dict:
    """Parameters saved at ``step``, as numpy, restored with no target tree: a checkpoint
    written by other processes (another topology) loads on this one."""
    params_dir = store.resolve(f"{workdir}/checkpoints/{step}")[1]
    return store.load_params(params_dir)


def in_process(workdir, *overrides: str) -> dict:
    overrides = (*ONE_LAYER, *overrides)
    return train_and_evaluate(
        load_config(f"{EXPERIMENT}:tiny", [*without_keys(SMALL, overrides), *overrides]),
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


@pytest.fixture(scope="module")
def runs(materialized, pretraining_data, tmp_path_factory) -> dict:
    """The uninterrupted materialized run (1 process, 6 steps) and, in one launch of 2
    processes: that run resumed from its step-2 checkpoint up to step 4; a TFRecord run of 2
    steps with an evaluation; the TFRecord run resumed up to step 3. Workdirs and outputs."""
    root = tmp_path_factory.mktemp("resharding")
    full, resumed, tfrecord = root / "full", root / "resumed", root / "tfrecord"
    data = (f"--config.data.directory={materialized}", *MATERIALIZED)
    assert in_process(full, *data, *FSDP, "--config.num_train_steps=6")["step"] == 6
    stopped_at(full, resumed, 2)
    data_dir, vocab = pretraining_data
    tf_data = (*ONE_LAYER, *TFRECORD, f"--config.data.directory={data_dir}",
               f"--config.data.tokenizer={vocab}")
    launch = [pretrain_args(resumed, *ONE_LAYER, *data, "--config.num_train_steps=4"),
              pretrain_args(tfrecord, *tf_data, "--config.num_train_steps=2",
                            "--config.eval_steps=1", "--config.eval_every=2"),
              pretrain_args(tfrecord, *tf_data, "--config.num_train_steps=3")]
    outputs = run_all([worker_command("pretrain", json.dumps(launch))] * 2, timeout=2 * RUN_S)
    return {"full": full, "resumed": resumed, "tfrecord": tfrecord,
            "outputs": split_runs(outputs[0])}


def test_checkpoint_resumes_on_more_and_on_fewer_processes(runs, materialized, capsys):
    """1 process (FSDP over 8 devices) trains 6 steps; its step-2 checkpoint resumed by 2
    processes (2 devices each) gives steps 3 and 4, and their step-4 checkpoint resumed by 1
    process gives steps 5 and 6: the losses and the final parameters of the uninterrupted
    run exactly."""
    full, resumed, output = runs["full"], runs["resumed"], runs["outputs"][0]
    # 1 -> 2 processes.
    assert f"resumed from {resumed}/checkpoints/2" in output
    assert "resuming a run of 1 processes on 2" in output
    # 2 -> 1 process.
    capsys.readouterr()
    result = in_process(resumed, f"--config.data.directory={materialized}", *MATERIALIZED,
                        *FSDP, "--config.num_train_steps=6")
    assert result["step"] == 6
    assert "resuming a run of 2 processes on 1" in capsys.readouterr().out
    want, got = train_losses(full), train_losses(resumed)
    assert sorted(want) == sorted(got) == list(range(1, 7))
    np.testing.assert_allclose([got[s] for s in range(3, 7)], [want[s] for s in range(3, 7)],
                               rtol=1e-4)
    # The resumed runs started from exactly the saved parameters and end where the
    # uninterrupted run ends.
    for a, b in zip(jax.tree.leaves(step_params(resumed, 6)),
                    jax.tree.leaves(step_params(full, 6)), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_tfrecord_run_resumes_on_the_same_and_another_process_count(runs, pretraining_data):
    """2 processes (data over the processes, FSDP within each) train, evaluate on the
    held-out shard and checkpoint; 2 processes resume, then 1."""
    workdir, (_, first, second) = runs["tfrecord"], runs["outputs"]
    summary = json.loads(first.strip().splitlines()[-1])
    assert summary["step"] == 2 and "eval_mlm_accuracy" in summary
    # Every process restores the data position (the checkpoint holds process 0's iterator
    # state) and continues; the first run saved step 2 only, the second its last step.
    assert f"resumed from {workdir}/checkpoints/2" in second
    assert json.loads(second.strip().splitlines()[-1])["step"] == 3
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) \
        == ["2", "3"]
    data_dir, vocab = pretraining_data
    result = in_process(workdir, *TFRECORD, f"--config.data.directory={data_dir}",
                        f"--config.data.tokenizer={vocab}", "--config.num_train_steps=4")
    assert result["step"] == 4
    assert sorted(train_losses(workdir)) == [1, 2, 3, 4]
