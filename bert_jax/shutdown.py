"""The CLI's exit, without the interpreter's teardown once the work is done.

When a command returns, everything it wrote is closed and its output printed, yet a Python
process holding jax, XLA and TensorFlow then spends seconds in finalization (module
clearing, native destructors of the runtimes' clients and thread pools), in silence after
the last line (docs/pretraining.md, "Metrics"). :func:`exit_now`
runs what was registered with :mod:`atexit` (jax's distributed shutdown among them), flushes
the standard streams and ends the process at once, unless a non-daemon thread is still
working (then the normal exit waits for it as Python always does).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading

_kept: list[object] = []


def keep_until_exit(obj) -> None:
    """Holds a reference to ``obj`` until the process ends, so that a slow destructor (a
    tf.data iterator's) never runs: :func:`exit_now` skips it."""
    _kept.append(obj)


def exit_now(code: int) -> None:
    """Ends the process with ``code`` now if nothing but daemon threads remain; returns
    otherwise (the caller then exits normally)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if any(not t.daemon and t is not threading.main_thread() and t.is_alive()
           for t in threading.enumerate()):
        return
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or broken pipe: nothing more can be said
            pass
    os._exit(code)
