"""One killed process makes the job fail fast with a clear message instead of hanging: the
survivor of a 2-process run whose peer gets SIGKILL mid-run exits non-zero within a bounded
time (``BERT_JAX_HEARTBEAT_TIMEOUT_SECONDS``), naming the lost peer.

Two ways out, depending on where the survivor waits when its peer dies: a collective that
fails as a Python error reaches the loop, which prints its message and exits with
``EXIT_LOST_PEER``; a collective that just waits is ended by jax's coordination service once
the peer misses its heartbeats ("Terminating process ... tasks are unhealthy (stopped sending
heartbeats): <id>", SIGABRT)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from bert_jax.training.loop import EXIT_LOST_PEER

from .helpers import RUN_S, launched, pretrain_command, time_limit

pytestmark = pytest.mark.multiprocess

# The survivor must be gone this long after the kill: the heartbeat timeout (20 s) plus the
# coordination service's detection and the process's exit, with room for a loaded machine;
# a hang (what this guards against) never ends.
SURVIVOR_DEADLINE_S = time_limit(180)


def wait_for_steps(metrics, procs, steps: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(metrics):
            with open(metrics) as f:
                if sum(1 for _ in f) >= steps:
                    return
        assert all(p.poll() is None for p in procs), "a process ended before the kill"
        time.sleep(0.2)
    raise AssertionError(f"{steps} steps were not logged within {timeout}s")


@pytest.mark.parametrize("killed", [1, 0])  # 0 also hosts the coordination service
def test_survivor_exits_fast_with_a_clear_message(tmp_path, killed):
    logs = tmp_path / "logs"
    logs.mkdir()
    cmd = pretrain_command(tmp_path / "run", "--config.model.num_hidden_layers=1",
                           "--config.data.source=synthetic",
                           "--config.model.vocab_size=64", "--config.global_batch_size=8",
                           "--config.num_train_steps=100000",
                           "--config.checkpoint.every_steps=100000")
    # 20 s: a process starved of CPU while both compile on a loaded machine must not be
    # taken for dead before the kill.
    with launched([cmd, cmd], LOGDIR=str(logs),
                  BERT_JAX_HEARTBEAT_TIMEOUT_SECONDS="20") as procs:
        wait_for_steps(tmp_path / "run" / "metrics.jsonl", procs, steps=3,
                       timeout=time_limit(RUN_S))
        os.kill(procs[killed].pid, signal.SIGKILL)
        killed_at = time.monotonic()
        survivor = procs[1 - killed]
        try:
            rc = survivor.wait(timeout=SURVIVOR_DEADLINE_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the survivor still runs {SURVIVOR_DEADLINE_S}s after its "
                                 "peer was killed") from None
        elapsed = time.monotonic() - killed_at
    output = (logs / f"{1 - killed}.log").read_text()
    readable = "\n".join(line for line in output.splitlines()
                         if not line.startswith("    @") and "[Gloo]" not in line)
    if rc == EXIT_LOST_PEER:
        assert f"process {1 - killed} of 2: lost contact with another process" in output
        assert "Restart all processes with the same command" in output
    else:
        assert rc == -signal.SIGABRT, readable[-3000:]
        assert "the JAX distributed service detected fatal errors" in output
        lost = "stopped sending heartbeats):\n" + str(killed)
        assert lost in output or "coordination service" in output, readable[-3000:]
    print(f"survivor {1 - killed} exited (status {rc}) {elapsed:.1f}s after process {killed} "
          "was killed")
