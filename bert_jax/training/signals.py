"""SIGTERM/SIGINT during training: a flag the loop checks between steps, and an immediate
exit while there is nothing to save.

Python runs signal handlers only between bytecodes of the main thread, so a handler alone
waits out an XLA compilation or a blocked read. :class:`Preemption` also registers a wakeup
pipe that a watcher thread reads: while the loop marks itself ``idle`` (the state equals the
checkpoint it restored: before the first step has run), a signal ends the process at once.
Otherwise the loop sees ``requested`` at the next step or data wait, saves and exits.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable

import jax
import numpy as np

from bert_jax.startup import wakeup_signals


class Preemption:
    """Context manager: SIGTERM (and SIGINT, when ``catch_interrupt``) set ``requested``."""

    def __init__(self, on_idle_exit: Callable[[], None] | None = None):
        self.requested = False
        self.signal_name: str | None = None
        self.idle = False
        self._on_idle_exit = on_idle_exit
        self._previous: dict[int, object] = {}
        self._previous_fd = None
        self._pipe: tuple[int, int] | None = None

    def __enter__(self) -> Preemption:
        if threading.current_thread() is not threading.main_thread():
            return self  # not the main thread: leave signals alone
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._handle)
        read, write = os.pipe()
        os.set_blocking(write, False)
        self._pipe = (read, write)
        self._previous_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        threading.Thread(target=self._watch, args=(read,), daemon=True,
                         name="signal-watch").start()
        return self

    def _handle(self, signum, frame) -> None:
        self.requested = True
        self.signal_name = signal.Signals(signum).name

    def _watch(self, read_fd: int) -> None:
        for signum in wakeup_signals(read_fd):
            if self.idle:
                name = signal.Signals(signum).name if signum in (15, 2) else "signal"
                sys.stderr.write(f"{name}: nothing new to save since the restored checkpoint; "
                                 "exiting\n")
                sys.stderr.flush()
                if self._on_idle_exit is not None:
                    self._on_idle_exit()
                os._exit(128 + signum)

    def __exit__(self, *exc) -> bool:
        if self._pipe is not None:
            signal.set_wakeup_fd(self._previous_fd if self._previous_fd is not None else -1)
            for fd in self._pipe:
                os.close(fd)
            self._pipe = None
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}
        return False

    def agreed(self) -> bool:
        """All processes must stop at the same step: any process's request stops all."""
        if jax.process_count() == 1:
            return self.requested
        from jax.experimental import multihost_utils

        flags = multihost_utils.process_allgather(np.int32(self.requested))
        return bool(np.max(flags))
