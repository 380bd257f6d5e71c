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
