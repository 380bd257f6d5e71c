"""SIGTERM and SIGINT during start-up: one line, exit status 128 + signal, locks released.

A run spends its first seconds importing, initialising the accelerator backends, reading
data and compiling, often inside native calls that never return to Python. The CLI installs
:func:`install` before importing a command, so a signal in that phase is handled like one in
the training loop's idle phase (``training/signals.py``): a watcher thread woken through
``signal.set_wakeup_fd`` prints one line, releases the workdir locks this process holds (and
the folders they created) and exits at once.

Backend initialisation installs a native failure-signal handler for SIGTERM (libtpu does,
when no handler is installed yet) that prints a native stack trace and kills the process;
installing ours first prevents that, and :func:`backends_ready` initialises the backends and
puts ours back in case a runtime replaced it anyway. The loop's own handler replaces this one once
training starts and restores it when it ends.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_state: dict[str, object] = {}


def _handle(signum, frame) -> None:  # the watcher thread does the work
    pass


def wakeup_signals(read_fd: int) -> Iterator[int]:
    """The signal numbers ``signal.set_wakeup_fd`` writes to the pipe ``read_fd`` (the last
    of each read), until the pipe is closed."""
    while True:
        try:
            data = os.read(read_fd, 16)
        except OSError:
            return
        if not data:
            return
        yield data[-1]


def _watch(read_fd: int) -> None:
    for signum in wakeup_signals(read_fd):
        if signum not in (int(s) for s in _SIGNALS):
            continue
        name = signal.Signals(signum).name
        sys.stderr.write(f"{name}: exiting at once; nothing new was saved\n")
        sys.stderr.flush()
        from bert_jax import fileio

        fileio.release_held_locks()
        os._exit(128 + signum)


def install() -> None:
    """Start-up handling of SIGTERM/SIGINT (main thread only; once per process)."""
    if "read_fd" in _state or threading.current_thread() is not threading.main_thread():
        return
    read, write = os.pipe()
    os.set_blocking(write, False)
    _state.update(read_fd=read, write_fd=write)
    _reinstall()
    threading.Thread(target=_watch, args=(read,), daemon=True, name="startup-signals").start()


def _reinstall() -> None:
    for signum in _SIGNALS:
        signal.signal(signum, _handle)
    signal.set_wakeup_fd(_state["write_fd"], warn_on_full_buffer=False)


def backends_ready() -> None:
    """Initialises jax's backends now, then restores the start-up handlers over any native
    handler the backends installed (a no-op without :func:`install`)."""
    import jax

    jax.devices()
    if "read_fd" in _state and threading.current_thread() is threading.main_thread():
        _reinstall()
