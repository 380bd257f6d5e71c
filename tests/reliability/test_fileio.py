"""Atomic writes, non-destructive directory swaps and the workdir lock."""

import json
import os
import socket
import subprocess
import sys

import pytest

from bert_jax import fileio
from bert_jax.errors import BertJaxError


def test_atomic_write_keeps_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "out.json"
    fileio.atomic_write_json(str(path), {"a": 1})

    def fail(f):
        f.write(b"{partial")
        raise OSError("disk full")

    with pytest.raises(OSError):
        fileio.atomic_write(str(path), fail)
    assert json.loads(path.read_text()) == {"a": 1}
    assert os.listdir(tmp_path) == ["out.json"]  # no temporary file left behind


def test_output_path_collisions(tmp_path):
    existing = tmp_path / "file"
    existing.write_text("x")
    with pytest.raises(BertJaxError, match="not a directory"):
        fileio.check_output_path(str(existing), directory=True)
    with pytest.raises(BertJaxError, match="is a file, not a directory"):
        fileio.atomic_write(str(existing / "out.txt"), "y")
    with pytest.raises(BertJaxError, match="is a directory"):
        fileio.atomic_write(str(tmp_path), "y")


def test_replace_directory_swaps_only_complete_contents(tmp_path):
    target = tmp_path / "out"
    with fileio.replace_directory(str(target)) as tmp:
        open(os.path.join(tmp, "a"), "w").write("old")
    with pytest.raises(RuntimeError), fileio.replace_directory(str(target)) as tmp:
        open(os.path.join(tmp, "a"), "w").write("new, half written")
        raise RuntimeError("killed")
    assert (target / "a").read_text() == "old"
    assert os.listdir(tmp_path) == ["out"]
    # A swap stopped between its two renames leaves only the old copy aside: it comes back.
    os.replace(target, tmp_path / ".out.old-123")
    with fileio.replace_directory(str(target)) as tmp:
        assert (target / "a").read_text() == "old"
        open(os.path.join(tmp, "a"), "w").write("new")
    assert (target / "a").read_text() == "new" and os.listdir(tmp_path) == ["out"]


def test_workdir_lock_names_holder_and_takes_over_stale(tmp_path, capsys):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with open(tmp_path / fileio.LOCK_FILE, "w") as f:
            json.dump({"pid": holder.pid, "host": socket.gethostname()}, f)
        with pytest.raises(BertJaxError, match=f"in use by process {holder.pid} on"):
            fileio.WorkdirLock(str(tmp_path)).acquire()
    finally:
        holder.kill()
        holder.wait()
    # The holder is gone: its lock is stale and taken over with a warning.
    lock = fileio.WorkdirLock(str(tmp_path))
    lock.acquire()
    assert "taking over the stale lock" in capsys.readouterr().err
    assert json.loads((tmp_path / fileio.LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / fileio.LOCK_FILE).exists()
    # Another host's lock (its pid means nothing here) holds while its owner touches it...
    with open(tmp_path / fileio.LOCK_FILE, "w") as f:
        json.dump({"pid": 1, "host": "another-host"}, f)
    with pytest.raises(BertJaxError, match="another-host"):
        fileio.WorkdirLock(str(tmp_path)).acquire()
    # ... and is taken over once untouched for longer than stale_after_s (that host is gone).
    old = os.path.getmtime(tmp_path / fileio.LOCK_FILE) - 3600
    os.utime(tmp_path / fileio.LOCK_FILE, (old, old))
    lock = fileio.WorkdirLock(str(tmp_path), stale_after_s=600)
    lock.acquire()
    assert "has not touched it for 600 s" in capsys.readouterr().err
    lock.release()
