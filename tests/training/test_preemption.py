"""The real CLI killed and restarted: SIGTERM saves and exits cleanly, SIGKILL loses at most
the steps since the last checkpoint, and the restarted run's losses equal an uninterrupted
run's."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from xla_env import cpu_flags

from .helpers import EXPERIMENT, SMALL, without_keys
from .test_checkpointing import train_losses

pytestmark = pytest.mark.slow

# decay_steps fixed so that runs of different lengths share one learning-rate schedule.
# One layer: a restart restores every layer alike.
RUN = [*without_keys(SMALL, ["--config.model.num_hidden_layers=1"]),
       "--config.model.num_hidden_layers=1", "--config.log_every=1",
       "--config.checkpoint.every_steps=4", "--config.eval_steps=0",
       "--config.optimizer.warmup_steps=2", "--config.optimizer.decay_steps=1000"]


# Two simulated devices: compiles faster than eight and still runs a sharded (data=2) step.
ENV = dict(os.environ, XLA_FLAGS=cpu_flags(2))


def _command(workdir, steps):
    return [sys.executable, "-m", "bert_jax", "pretrain", "--config", f"{EXPERIMENT}:tiny",
            "--workdir", str(workdir), *RUN, f"--config.num_train_steps={steps}"]


def _steps(workdir) -> list[int]:
    root = os.path.join(workdir, "checkpoints")
    return sorted(int(d) for d in os.listdir(root) if d.isdigit()) if os.path.isdir(root) \
        else []


def _start_and_signal(workdir, sig, min_checkpoint: int, timeout: float = 240.0):
    """Starts a long run, sends ``sig`` once checkpoint >= min_checkpoint exists."""
    proc = subprocess.Popen(_command(workdir, 1000), env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + timeout
    while not any(s >= min_checkpoint for s in _steps(workdir)):
        assert proc.poll() is None, proc.stdout.read()
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.05)
    proc.send_signal(sig)
    output, _ = proc.communicate(timeout=120)
    return proc.returncode, output


def test_sigterm_then_sigkill_then_restart_equals_uninterrupted(tmp_path):
    run = tmp_path / "run"
    rc, output = _start_and_signal(run, signal.SIGTERM, 4)
    assert rc == 0, output
    assert "SIGTERM: saved step" in output
    saved = _steps(run)[-1]
    assert saved >= 4 and f"saved step {saved} " in output

    # killed once the next periodic checkpoint after the resumed one is written
    rc, output = _start_and_signal(run, signal.SIGKILL, (saved // 4 + 1) * 4)
    assert rc == -signal.SIGKILL
    assert f"resumed from {run}/checkpoints/{saved}" in output

    end = _steps(run)[-1] + 4
    done = subprocess.run(_command(run, end), env=ENV, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    full = tmp_path / "full"
    subprocess.run(_command(full, end), env=ENV, check=True, capture_output=True)
    want, got = train_losses(full), train_losses(run)
    assert sorted(got) == list(range(1, end + 1)) and _steps(run)[-1] == end
    np.testing.assert_allclose([got[s] for s in sorted(got)], [want[s] for s in sorted(got)],
                               rtol=1e-6)
