"""Two jax.distributed processes on localhost (CPU, gloo collectives) train, checkpoint and
resume through the real CLI."""

import json
import os
import socket
import subprocess
import sys

import pytest
from xla_env import cpu_flags

from .helpers import EXPERIMENT, SMALL
from .test_checkpointing import train_losses

pytestmark = pytest.mark.multiprocess


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_two_processes(workdir, steps):
    port = _free_port()
    procs = []
    for pid in range(2):
        env = dict(os.environ, BERT_JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                   BERT_JAX_NUM_PROCESSES="2", BERT_JAX_PROCESS_ID=str(pid),
                   XLA_FLAGS=cpu_flags(2), JAX_PLATFORMS="cpu")
        cmd = [sys.executable, "-m", "bert_jax", "pretrain", "--config", f"{EXPERIMENT}:tiny",
               "--workdir", str(workdir), *SMALL, "--config.log_every=1",
               "--config.checkpoint.every_steps=2", "--config.eval_steps=2",
               "--config.eval_every=2", "--config.optimizer.decay_steps=100",
               "--config.parallel.mesh.data=2", "--config.parallel.mesh.fsdp=-1",
               f"--config.num_train_steps={steps}"]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out
    return outputs


def test_two_process_run_trains_checkpoints_and_resumes(tmp_path):
    first = _run_two_processes(tmp_path, 4)
    summary = json.loads(first[0].strip().splitlines()[-1])
    assert summary["step"] == 4 and "eval_mlm_accuracy" in summary
    assert sorted(os.listdir(tmp_path / "checkpoints"))[-1] == "4"
    second = _run_two_processes(tmp_path, 6)
    assert f"resumed from {tmp_path}/checkpoints/4" in second[0]
    losses = train_losses(tmp_path)
    assert sorted(losses) == list(range(1, 7))
    assert all(v == v and v < 20 for v in losses.values())
