"""Atomic, non-destructive outputs and the workdir lock.

* :func:`atomic_write` writes a file through a temporary sibling, ``fsync`` and
  ``os.replace``: a reader sees the old file or the new one, never a half-written one.
* :func:`replace_directory` builds a directory under a temporary sibling name and swaps it in
  only when complete; the old directory is removed only after the new one is in place, so a
  crash at any moment leaves a complete old or a complete new directory (plus, at worst, a
  ``.old-*``/``.tmp-*`` sibling that the next write removes).
* :class:`WorkdirLock` keeps two runs off one workdir: ``WORKDIR/.lock`` holds the owner's
  pid and host, and the owner touches it every ``heartbeat_s`` seconds; a second run fails
  naming them. A lock left by a dead process on this host, or not touched for
  ``stale_after_s`` seconds (a run on a host that is gone), is taken over with a warning.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from bert_jax.errors import BertJaxError

LOCK_FILE = ".lock"


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def check_output_path(path: str, *, directory: bool) -> None:
    """BertJaxError if ``path`` cannot be written as a file (``directory=False``) or a
    directory: an existing entry of the other kind, or a parent that is a file."""
    path = os.path.abspath(path)
    if directory and os.path.exists(path) and not os.path.isdir(path):
        raise BertJaxError(f"{path}: exists and is not a directory; choose another output path")
    if not directory and os.path.isdir(path):
        raise BertJaxError(f"{path}: is a directory; give a file name for the output")
    parent = os.path.dirname(path)
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if parent and not os.path.isdir(parent):
        raise BertJaxError(f"{path}: {parent} is a file, not a directory")


def atomic_write(path: str, data: str | bytes | Callable[[Any], None], *,
                 encoding: str = "utf-8") -> str:
    """Writes ``data`` (text, bytes, or a function given the open binary file) to ``path``
    atomically; returns ``path``."""
    path = os.path.abspath(path)
    check_output_path(path, directory=False)
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                               dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode(encoding) if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    _fsync_dir(directory)
    return path


def atomic_write_json(path: str, data: Any, **dump_kwargs: Any) -> str:
    dump_kwargs.setdefault("indent", 2)
    dump_kwargs.setdefault("sort_keys", True)
    return atomic_write(path, json.dumps(data, **dump_kwargs) + "\n")


def _remove_leftovers(path: str, keep: str | None = None) -> None:
    """Removes ``.tmp-*`` / ``.old-*`` siblings of ``path`` left by an interrupted swap."""
    parent, name = os.path.split(path)
    if not os.path.isdir(parent):
        return
    for entry in os.listdir(parent):
        if entry == keep:
            continue
        if entry.startswith(f".{name}.tmp-") or entry.startswith(f".{name}.old-"):
            if not os.path.exists(path) and entry.startswith(f".{name}.old-"):
                # The swap stopped between its two renames: the old one is the good copy.
                os.replace(os.path.join(parent, entry), path)
                continue
            shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)


@contextlib.contextmanager
def replace_directory(path: str) -> Iterator[str]:
    """``with replace_directory(path) as tmp:`` write the new contents into ``tmp``; on a
    clean exit ``tmp`` becomes ``path`` (the old ``path`` is removed only afterwards); on an
    error ``tmp`` is removed and ``path`` is untouched."""
    path = os.path.abspath(path)
    check_output_path(path, directory=True)
    parent, name = os.path.split(path)
    os.makedirs(parent, exist_ok=True)
    _remove_leftovers(path)
    tmp = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; the result is an ordinary directory
    try:
        yield tmp
        _fsync_tree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    swap_in(tmp, path)


def swap_in(new: str, path: str) -> None:
    """Moves the complete directory ``new`` to ``path``: the old ``path`` is renamed aside,
    ``new`` renamed in, and only then the old one removed."""
    path = os.path.abspath(path)
    parent, name = os.path.split(path)
    _remove_leftovers(path, keep=os.path.basename(new))
    old = None
    if os.path.exists(path):
        old = os.path.join(parent, f".{name}.old-{os.getpid()}")
        if os.path.exists(old):
            shutil.rmtree(old)
        os.replace(path, old)
    os.replace(new, path)
    _fsync_dir(parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _fsync_tree(root: str) -> None:
    for directory, _, files in os.walk(root):
        for name in files:
            try:
                fd = os.open(os.path.join(directory, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(directory)


# ---- workdir lock ---------------------------------------------------------------------------
def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as e:
        return e.errno == errno.EPERM
    return True


class WorkdirLock:
    """``WORKDIR/.lock`` (pid, host) for the life of a run; see the module docstring."""

    def __init__(self, workdir: str, *, heartbeat_s: float = 30.0,
                 stale_after_s: float = 300.0):
        self.path = os.path.join(os.path.abspath(workdir), LOCK_FILE)
        self.heartbeat_s, self.stale_after_s = heartbeat_s, stale_after_s
        self._held = False
        self._stop = threading.Event()

    def acquire(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        me = {"pid": os.getpid(), "host": socket.gethostname()}
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                owner = self._owner()
                if owner == me:  # already held by this process: the outer holder releases it
                    return
                if owner is not None and not self._stale(owner):
                    raise BertJaxError(
                        f"{os.path.dirname(self.path)}: in use by process {owner['pid']} on "
                        f"{owner['host']} ({self.path}); wait for it to finish or stop it. "
                        "If that process is gone, remove the lock file") from None
                detail = ("unreadable lock file" if owner is None else
                          f"process {owner['pid']} on {owner['host']} is gone"
                          if owner["host"] == me["host"] else
                          f"process {owner['pid']} on {owner['host']} has not touched it for "
                          f"{self.stale_after_s:g} s")
                print(f"warning: taking over the stale lock {self.path} ({detail})",
                      file=sys.stderr, flush=True)
                with contextlib.suppress(FileNotFoundError):
                    os.remove(self.path)
                continue
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(me, f)
            self._held = True
            self._stop.clear()
            threading.Thread(target=self._heartbeat, daemon=True, name="workdir-lock").start()
            return
        raise BertJaxError(f"{self.path}: could not take the workdir lock")

    def _owner(self) -> dict[str, Any] | None:
        try:
            with open(self.path, encoding="utf-8") as f:
                owner = json.load(f)
            return {"pid": int(owner["pid"]), "host": str(owner["host"])}
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _stale(self, owner: dict[str, Any]) -> bool:
        if owner["host"] == socket.gethostname():
            return not _pid_alive(owner["pid"])
        try:
            return time.time() - os.path.getmtime(self.path) > self.stale_after_s
        except OSError:
            return True

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def release(self) -> None:
        self._stop.set()
        if self._held and self._owner() == {"pid": os.getpid(), "host": socket.gethostname()}:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path)
        self._held = False

    def __enter__(self) -> WorkdirLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> bool:
        self.release()
        return False
