"""SIGTERM/SIGINT are honoured while the main thread is stuck in a long native call (an XLA
compilation, a blocked read) before the first step: nothing to save, the process exits at
once and releases the workdir lock."""

import os
import signal
import subprocess
import sys

import pytest

CHILD = """
import ctypes, sys
from bert_jax.training.signals import Preemption

with Preemption(on_idle_exit=lambda: print("lock released", flush=True)) as preemption:
    preemption.idle = True
    print("ready", flush=True)
    libc = ctypes.CDLL(None)
    while True:  # a native call that never looks at Python's signal flags
        libc.sleep(3600)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_while_idle_exits_at_once(signum):
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "JAX_PLATFORMS": "cpu"}
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "ready"
        child.send_signal(signum)
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 128 + signum
    assert "lock released" in out
    assert f"{signal.Signals(signum).name}: nothing new to save" in err


def _user_environment():
    """A user's environment: jax picks its platforms (libtpu probes for a TPU), without the
    test suite's TPU settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_")
           and k not in ("JAX_PLATFORMS", "ALLOW_MULTIPLE_LIBTPU_LOAD")}
    env["PYTHONPATH"] = os.getcwd()
    return env


STARTUP_CHILD = """
import ctypes, sys
from bert_jax import fileio, startup

startup.install()
lock = fileio.WorkdirLock(sys.argv[1])
lock.acquire()
if sys.argv[2] == "after_backends":
    startup.backends_ready()  # may install a native SIGTERM handler (libtpu)
print("ready", flush=True)
libc = ctypes.CDLL(None)
while True:
    libc.sleep(3600)
"""


@pytest.mark.parametrize("phase", ["before_backends", "after_backends"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_during_start_up_is_one_line(tmp_path, signum, phase):
    """Any moment of start-up, before or after the accelerator backends (whose native
    handler would print a stack trace and die by the signal): one line, 128 + signal, the
    lock released and the workdir folder it created removed."""
    env = _user_environment()
    workdir = tmp_path / "new" / "w"
    child = subprocess.Popen([sys.executable, "-c", STARTUP_CHILD, str(workdir), phase],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "ready"
        child.send_signal(signum)
        _, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 128 + signum, err
    assert "stack trace" not in err and "Traceback" not in err, err
    assert err.count(f"{signal.Signals(signum).name}: exiting at once; nothing new was "
                     "saved") == 1, err
    assert not (tmp_path / "new").exists()


def test_pretrain_signalled_in_start_up_exits_with_one_line(tmp_path):
    """The CLI itself: SIGTERM once the run has printed its first line (backends up, data
    and compilation ahead)."""
    from tests.training.helpers import EXPERIMENT, SMALL

    env = _user_environment()
    child = subprocess.Popen(
        [sys.executable, "-m", "bert_jax.cli", "pretrain", "--config", f"{EXPERIMENT}:tiny",
         *SMALL, "--workdir", str(tmp_path / "w")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout.readline()
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == 128 + signal.SIGTERM, err
    assert "stack trace" not in err and "Traceback" not in err, err
    assert len([line for line in err.splitlines() if line.startswith("SIGTERM")]) == 1, err
    assert not (tmp_path / "w" / ".lock").exists()
