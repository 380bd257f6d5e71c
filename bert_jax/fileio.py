"""Atomic, non-destructive outputs and the workdir lock, on local disk and in buckets.

* :func:`atomic_write` writes a file through a temporary sibling, ``fsync`` and
  ``os.replace``: a reader sees the old file or the new one, never a half-written one. In a
  bucket it is one object upload, which is atomic by itself.
* :func:`replace_directory` builds a directory under a temporary sibling name and swaps it in
  only when complete; the old directory is removed only after the new one is in place, so a
  crash at any moment leaves a complete old or a complete new directory (plus, at worst, a
  ``.old-*``/``.tmp-*`` sibling that the next write removes). A bucket has no rename: the
  new contents are built in a local staging directory and published by write-then-commit:
  the directory's *marker* object (``metadata.json`` of a data directory, ``config.json`` of
  a model) is deleted first, every other file uploaded and stale objects removed, and the
  marker uploaded last. Readers trust a directory only through its marker, so a crash leaves
  the old directory or an uncommitted one that readers refuse, never a mix they accept.
* :class:`WorkdirLock` keeps two runs off one workdir: ``WORKDIR/.lock`` holds the owner's
  pid and host, and the owner touches it every ``heartbeat_s`` seconds; a second run fails
  naming them. A lock left by a dead process on this host, or not touched for
  ``stale_after_s`` seconds (a run on a host that is gone), is taken over with a warning. In
  a bucket the lock is an object created only if absent (``ifGenerationMatch=0``), touched
  and taken over by rewrites conditional on the generation seen.
* Files follow the user's umask (0644 typically), atomic or not.
"""

from __future__ import annotations

import contextlib
import errno
import io
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

from bert_jax import storage
from bert_jax.errors import BertJaxError

LOCK_FILE = ".lock"


def move_contents_aside(workdir: str) -> str | None:
    """Moves everything in ``workdir`` but its lock into a new sibling ``WORKDIR.replaced-N``
    (the first free N) and returns that path; None when there is nothing to move."""
    workdir = storage.abspath(workdir)
    if not storage.isdir(workdir):
        return None
    entries = [e for e in storage.listdir(workdir) if e != LOCK_FILE]
    if not entries:
        return None
    number = 1
    while storage.exists(f"{workdir}.replaced-{number}"):
        number += 1
    aside = f"{workdir}.replaced-{number}"
    storage.makedirs(aside)
    for entry in entries:
        storage.move(storage.join(workdir, entry), storage.join(aside, entry))
    return aside


def move_contents_back(aside: str, workdir: str) -> None:
    """Undoes :func:`move_contents_aside` (a run rejected before it wrote anything)."""
    for entry in storage.listdir(aside):
        storage.move(storage.join(aside, entry), storage.join(workdir, entry))
    storage.rmtree(aside)


def _umask() -> int:
    """The process's umask, read without changing it where the system says it (Linux)."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


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


def check_output_path(path: str, *, directory: bool, probe: bool = True) -> None:
    """BertJaxError if ``path`` cannot be written as a file (``directory=False``) or a
    directory: an existing entry of the other kind, a parent that is a file, or (``probe``)
    a nearest existing folder that refuses a new entry (read-only, no permission, /proc). For
    a URL: also that its bucket exists and answers. Commands call this before any work."""
    if storage.is_remote(path):
        path = storage.abspath(path)
        storage.check_reachable(path)
        if directory and storage.isfile(path):
            raise BertJaxError(f"{path}: exists and is not a directory; choose another output "
                               "path")
        if not directory and storage.isdir(path):
            raise BertJaxError(f"{path}: is a directory; give a file name for the output")
        return
    path = os.path.abspath(storage.check_local(path))
    if directory and os.path.exists(path) and not os.path.isdir(path):
        raise BertJaxError(f"{path}: exists and is not a directory; choose another output path")
    if not directory and os.path.isdir(path):
        raise BertJaxError(f"{path}: is a directory; give a file name for the output")
    parent = os.path.dirname(path)
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if parent and not os.path.isdir(parent):
        raise BertJaxError(f"{path}: {parent} is a file, not a directory")
    if probe and parent:
        try:  # the only reliable test (root passes access(2) checks that writes then fail)
            fd, tmp = tempfile.mkstemp(prefix=".bert-jax-probe.", dir=parent)
            os.close(fd)
            os.remove(tmp)  # local: the probe just made
        except OSError as e:
            raise BertJaxError(f"{path}: cannot be written ({parent}: "
                               f"{e.strerror or type(e).__name__})") from None


def atomic_write(path: str, data: str | bytes | Callable[[Any], None], *,
                 encoding: str = "utf-8") -> str:
    """Writes ``data`` (text, bytes, or a function given the open binary file) to ``path``
    atomically; returns ``path``. The file gets the mode the umask gives new files."""
    if storage.is_remote(path):
        path = storage.abspath(path)
        check_output_path(path, directory=False)
        if callable(data):
            buffer = io.BytesIO()
            data(buffer)
            data = buffer.getvalue()
        storage.put_bytes(path, data.encode(encoding) if isinstance(data, str) else data)
        return path
    path = os.path.abspath(path)
    check_output_path(path, directory=False, probe=False)
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                                   dir=directory)
    except OSError as e:  # named by the output's path, not a temporary name
        raise BertJaxError(f"{path}: cannot be written ({e.strerror or e})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode(encoding) if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600
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
def replace_directory(path: str, *, marker: str | None = None) -> Iterator[str]:
    """``with replace_directory(path) as tmp:`` write the new contents into ``tmp`` (a local
    directory); on a clean exit ``tmp`` becomes ``path`` (the old ``path`` is removed only
    afterwards); on an error ``tmp`` is removed and ``path`` is untouched. For a URL,
    ``marker`` names the file readers trust (see the module docstring)."""
    if storage.is_remote(path):
        path = storage.abspath(path)
        check_output_path(path, directory=True)
        tmp = tempfile.mkdtemp(prefix="bert-jax-staging-")
        try:
            yield tmp
            publish_directory(tmp, path, marker=marker)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    path = os.path.abspath(path)
    check_output_path(path, directory=True)
    parent, name = os.path.split(path)
    os.makedirs(parent, exist_ok=True)
    _remove_leftovers(path)
    tmp = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; the result is an ordinary directory
    try:
        yield tmp
        _fsync_tree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    swap_in(tmp, path)


def publish_directory(local_dir: str, url: str, *, marker: str | None = None) -> None:
    """Write-then-commit of a complete local directory to the prefix ``url``: the marker
    object goes first, then the files are uploaded, objects the new contents do not have are
    deleted, and the marker is uploaded last."""
    if marker is not None and storage.exists(storage.join(url, marker)):
        storage.remove(storage.join(url, marker))
    old = set()
    if storage.isdir(url):
        for directory, _, files in storage.walk(url):
            old.update(storage.relpath(storage.join(directory, f), url) for f in files)
    new = set(storage.upload_tree(local_dir, url, exclude=marker))
    for rel in sorted(old - new - {marker}):
        storage.remove(storage.join(url, rel))
    if marker is not None and os.path.exists(os.path.join(local_dir, marker)):
        storage.upload(os.path.join(local_dir, marker), storage.join(url, marker))


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


# The locks this process holds, released by a signal that ends the process at once.
_HELD_LOCKS: set[WorkdirLock] = set()


def release_held_locks() -> None:
    """Releases every workdir lock this process holds (a process exiting on a signal)."""
    for lock in list(_HELD_LOCKS):
        with contextlib.suppress(Exception):
            lock.release()


class WorkdirLock:
    """``WORKDIR/.lock`` (pid, host) for the life of a run; see the module docstring."""

    def __init__(self, workdir: str, *, heartbeat_s: float = 30.0,
                 stale_after_s: float = 300.0):
        workdir = storage.abspath(workdir)
        self.path = storage.join(workdir, LOCK_FILE)
        self.heartbeat_s, self.stale_after_s = heartbeat_s, stale_after_s
        self._held = False
        self._stop = threading.Event()
        self._file = _BucketLockFile(self.path) if storage.is_remote(workdir) else \
            _LocalLockFile(self.path)
        # The outermost folder the lock creates (a new workdir and any missing parents):
        # removed again at release if the run left no file in it, so that a run rejected
        # after taking the lock leaves the filesystem as it found it.
        self._created: str | None = None
        if not storage.is_remote(workdir):
            missing = None
            folder = workdir
            while not os.path.lexists(folder):  # local: where the lock starts creating
                missing, folder = folder, os.path.dirname(folder)
            self._created = missing

    def acquire(self) -> None:
        me = {"pid": os.getpid(), "host": socket.gethostname()}
        for _ in range(3):
            if self._file.create(me):
                self._start_holding()
                return
            owner, seen = self._file.read()
            if owner == me:  # already held by this process: the outer holder releases it
                return
            if owner is not None and not self._stale(owner, seen):
                raise BertJaxError(
                    f"{storage.dirname(self.path)}: in use by process {owner['pid']} on "
                    f"{owner['host']} ({self.path}); wait for it to finish or stop it. "
                    "If that process is gone, remove the lock file")
            detail = ("unreadable lock file" if owner is None else
                      f"process {owner['pid']} on {owner['host']} is gone"
                      if owner["host"] == me["host"] else
                      f"process {owner['pid']} on {owner['host']} has not touched it for "
                      f"{self.stale_after_s:g} s")
            print(f"warning: taking over the stale lock {self.path} ({detail})",
                  file=sys.stderr, flush=True)
            if self._file.take_over(me, seen):
                self._start_holding()
                return
        raise BertJaxError(f"{self.path}: could not take the workdir lock")

    def _start_holding(self) -> None:
        """Marks the lock held and starts its heartbeat."""
        self._held = True
        _HELD_LOCKS.add(self)
        self._stop.clear()
        threading.Thread(target=self._heartbeat, daemon=True, name="workdir-lock").start()

    def _stale(self, owner: dict[str, Any], seen: dict[str, Any]) -> bool:
        if owner["host"] == socket.gethostname():
            return not _pid_alive(owner["pid"])
        return time.time() - seen["mtime"] > self.stale_after_s

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            with contextlib.suppress(OSError, BertJaxError):
                self._file.touch()

    def release(self) -> None:
        self._stop.set()
        _HELD_LOCKS.discard(self)
        if self._held:
            owner, _ = self._file.read()
            if owner == {"pid": os.getpid(), "host": socket.gethostname()}:
                self._file.delete()
                self._remove_created_if_empty()
        self._held = False

    def _remove_created_if_empty(self) -> None:
        """Removes the folders the lock created when the run wrote no file into them."""
        if self._created is None or not os.path.isdir(self._created):  # local: see __init__
            return
        for _, _, files in os.walk(self._created):  # local: see __init__
            if files:
                return
        with contextlib.suppress(OSError):
            shutil.rmtree(self._created)  # local: only empty folders the lock made

    def __enter__(self) -> WorkdirLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> bool:
        self.release()
        return False


def _parse_owner(raw: bytes) -> dict[str, Any] | None:
    try:
        owner = json.loads(raw.decode("utf-8"))
        return {"pid": int(owner["pid"]), "host": str(owner["host"])}
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None


class _LocalLockFile:
    """The lock on a local disk: ``O_EXCL`` creation, the file's mtime as heartbeat."""

    def __init__(self, path: str):
        self.path = path

    def create(self, owner: dict[str, Any]) -> bool:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(owner, f)
        return True

    def read(self) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
            return _parse_owner(raw), {"mtime": os.path.getmtime(self.path)}
        except OSError:
            return None, {"mtime": 0.0}

    def take_over(self, owner: dict[str, Any], seen: dict[str, Any]) -> bool:
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path)
        return self.create(owner)

    def touch(self) -> None:
        os.utime(self.path)

    def delete(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path)


class _BucketLockFile:
    """The lock in a bucket: an object created only if absent (``ifGenerationMatch=0``); the
    heartbeat and a takeover rewrite it only if its generation is still the one seen, so two
    runs racing for a stale lock cannot both win. Object times are the server's."""

    def __init__(self, url: str):
        self.url = url
        self._generation: int | None = None

    def _write(self, owner: dict[str, Any], if_generation_match: int) -> bool:
        generation = storage.write_if_generation(self.url, json.dumps(owner).encode(),
                                                     if_generation_match)
        if generation is None:
            return False
        self._generation = generation
        return True

    def create(self, owner: dict[str, Any]) -> bool:
        storage.check_reachable(self.url)
        return self._write(owner, 0)

    def read(self) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        found = storage.read_with_generation(self.url)
        if found is None:
            return None, {"mtime": 0.0, "generation": 0}
        raw, generation, updated = found
        return _parse_owner(raw), {"mtime": updated, "generation": generation}

    def take_over(self, owner: dict[str, Any], seen: dict[str, Any]) -> bool:
        return self._write(owner, int(seen.get("generation") or 0))

    def touch(self) -> None:
        owner, seen = self.read()
        if owner is not None and self._generation is not None:
            self._write(owner, self._generation)

    def delete(self) -> None:
        if self._generation is not None:
            storage.delete_if_generation(self.url, self._generation)
