"""The storage layer against a real Cloud Storage JSON-API server (fake-gcs-server)."""

import json
import os
import socket
import subprocess
import sys

import pytest

from bert_jax import fileio, storage
from bert_jax.errors import BertJaxError


def test_files_and_directories_in_a_bucket(bucket, tmp_path):
    base = f"{bucket}/run"
    assert not storage.exists(base) and not storage.isdir(base)
    fileio.atomic_write_json(storage.join(base, "config.json"), {"a": 1})
    fileio.atomic_write(storage.join(base, "sub/deeper/x.bin"), lambda f: f.write(b"\0\1"))
    assert storage.isdir(base) and storage.isfile(f"{base}/config.json")
    assert not storage.isfile(base) and not storage.isdir(f"{base}/config.json")
    assert storage.listdir(base) == ["config.json", "sub"]
    assert json.loads(storage.read_text(f"{base}/config.json")) == {"a": 1}
    assert storage.getsize(f"{base}/sub/deeper/x.bin") == 2
    assert list(storage.walk(base)) == [
        (base, ["sub"], ["config.json"]), (f"{base}/sub", ["deeper"], []),
        (f"{base}/sub/deeper", [], ["x.bin"])]
    assert storage.glob(f"{base}/*.json") == [f"{base}/config.json"]
    assert storage.glob(f"{base}/sub/*/x.*") == [f"{base}/sub/deeper/x.bin"]
    local = storage.localize(base)
    assert sorted(os.listdir(local)) == ["config.json", "sub"]
    with pytest.raises(BertJaxError, match="is a directory"):
        fileio.atomic_write(f"{base}/sub", "x")
    with pytest.raises(BertJaxError, match="not a directory"):
        fileio.check_output_path(f"{base}/config.json", directory=True)
    storage.rmtree(base)
    assert not storage.exists(f"{base}/config.json")


def test_replace_directory_commits_through_its_marker(bucket):
    target = f"{bucket}/data"
    with fileio.replace_directory(target, marker="metadata.json") as tmp:
        for name in ("a.tfrecord", "b.tfrecord", "metadata.json"):
            with open(os.path.join(tmp, name), "w") as f:
                f.write(f"old {name}")
    with pytest.raises(RuntimeError), fileio.replace_directory(target, marker="metadata.json") \
            as tmp:
        raise RuntimeError("killed before publishing")
    assert storage.read_text(f"{target}/a.tfrecord") == "old a.tfrecord"
    with fileio.replace_directory(target, marker="metadata.json") as tmp:
        for name in ("a.tfrecord", "metadata.json"):
            with open(os.path.join(tmp, name), "w") as f:
                f.write(f"new {name}")
    assert storage.listdir(target) == ["a.tfrecord", "metadata.json"]  # b removed
    assert storage.read_text(f"{target}/metadata.json") == "new metadata.json"


def test_publish_order_marker_last(bucket, tmp_path, monkeypatch):
    """A publish that dies after deleting the marker leaves an uncommitted directory."""
    target = f"{bucket}/data"
    (tmp_path / "metadata.json").write_text("1")
    (tmp_path / "a").write_text("1")
    fileio.publish_directory(str(tmp_path), target, marker="metadata.json")
    uploads = []
    real = storage.upload_tree

    def dying(local_dir, url, exclude=None):
        uploads.append(exclude)
        raise OSError("killed")

    monkeypatch.setattr(storage, "upload_tree", dying)
    with pytest.raises(OSError):
        fileio.publish_directory(str(tmp_path), target, marker="metadata.json")
    monkeypatch.setattr(storage, "upload_tree", real)
    assert uploads == ["metadata.json"]
    assert not storage.exists(f"{target}/metadata.json")  # readers refuse it, never mix


def test_bucket_lock_is_exclusive_and_taken_over_when_stale(bucket, capsys):
    workdir = f"{bucket}/run"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        storage.put_bytes(f"{workdir}/{fileio.LOCK_FILE}", json.dumps(
            {"pid": holder.pid, "host": socket.gethostname()}).encode())
        with pytest.raises(BertJaxError, match=f"in use by process {holder.pid} on"):
            fileio.WorkdirLock(workdir).acquire()
    finally:
        holder.kill()
        holder.wait()
    lock = fileio.WorkdirLock(workdir, heartbeat_s=0.1)
    lock.acquire()
    assert "taking over the stale lock" in capsys.readouterr().err
    assert json.loads(storage.read_text(f"{workdir}/.lock"))["pid"] == os.getpid()
    # Another process is refused while the holder lives and touches the lock.
    other = subprocess.run(
        [sys.executable, "-c", "import sys; from bert_jax import fileio; "
         "fileio.WorkdirLock(sys.argv[1]).acquire()", workdir],
        capture_output=True, text=True, timeout=120)
    assert other.returncode != 0 and f"in use by process {os.getpid()}" in other.stderr
    lock.release()
    assert not storage.exists(f"{workdir}/.lock")
    # Another host's lock holds until it is older than stale_after_s.
    storage.put_bytes(f"{workdir}/.lock", json.dumps({"pid": 1, "host": "far"}).encode())
    with pytest.raises(BertJaxError, match="far"):
        fileio.WorkdirLock(workdir, stale_after_s=3600).acquire()
    lock = fileio.WorkdirLock(workdir, stale_after_s=0.0)
    lock.acquire()
    assert "has not touched it" in capsys.readouterr().err
    lock.release()


def test_two_racers_for_a_stale_lock_one_wins(bucket):
    url = f"{bucket}/run/.lock"
    storage.put_bytes(url, b"{}")
    _, generation, _ = storage.read_with_generation(url)
    assert storage.write_if_generation(url, b"1", generation) is not None
    assert storage.write_if_generation(url, b"2", generation) is None
    assert storage.read_text(url) == "1"
    assert storage.write_if_generation(url, b"3", 0) is None


def test_missing_bucket_and_unreachable_server(gcs, monkeypatch):
    with pytest.raises(BertJaxError, match="gs://no-such-bucket-x: no such bucket"):
        storage.exists("gs://no-such-bucket-x/run")
    with pytest.raises(BertJaxError, match="s3:// paths are not supported"):
        storage.exists("s3://bucket/run")


def test_tries_of_a_request_come_from_the_environment(monkeypatch):
    monkeypatch.delenv("BERT_JAX_STORAGE_TRIES", raising=False)
    assert storage.remote_tries() == storage.REMOTE_RETRIES == 3
    monkeypatch.setenv("BERT_JAX_STORAGE_TRIES", " 1 ")
    assert storage.remote_tries() == 1
    for bad in ("0", "-2", "three", "1.5"):
        monkeypatch.setenv("BERT_JAX_STORAGE_TRIES", bad)
        with pytest.raises(BertJaxError, match=f"BERT_JAX_STORAGE_TRIES='{bad}': expected"):
            storage.remote_tries()


def test_an_unreachable_server_is_tried_the_set_number_of_times(monkeypatch):
    """A fresh process against a closed port: each try waits about 1, 2, 4, ... s before the
    next, so 1 try answers within seconds where gcsfs's own 6 take about 30 s."""
    code = ("import time; import gcsfs; from bert_jax import storage\n"
            "from bert_jax.errors import BertJaxError\n"
            "start = time.monotonic()\n"
            "try: storage.exists('gs://bkt/x')\n"
            "except BertJaxError as e: print(round(time.monotonic() - start, 1), e)\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, STORAGE_EMULATOR_HOST=f"http://127.0.0.1:{port}",
               BERT_JAX_STORAGE_TRIES="1")
    for key in ("TENSORSTORE_GCS_HTTP_URL", "GOOGLE_AUTH_TOKEN_FOR_TESTING"):
        env.pop(key, None)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    seconds, message = done.stdout.split(" ", 1)
    assert "cannot reach the storage server" in message, done.stdout + done.stderr
    assert float(seconds) < 1.0  # no wait between tries: there is only one


def test_tfrecords_from_a_bucket_match_tensorflow_and_name_damage(bucket, tmp_path):
    import tensorflow as tf

    from bert_jax.data import records

    path = str(tmp_path / "a.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        for i in range(300):
            w.write(f"record {i} ".encode() * (i % 7 + 1))
    want = [r.numpy() for r in tf.data.TFRecordDataset(path)]
    storage.upload(path, f"{bucket}/a.tfrecord")
    url = f"{bucket}/a.tfrecord"
    # Small chunks: frames straddle the ranged reads.
    assert list(records.iter_records(url, chunk_bytes=97)) == want
    assert [r.numpy() for r in records.records([url, url])] == want + want
    raw = bytearray(open(path, "rb").read())
    raw[40] ^= 1  # inside the second record's data (the first frame is 25 bytes)
    storage.put_bytes(f"{bucket}/bad.tfrecord", bytes(raw))
    with pytest.raises(ValueError, match=r"bad.tfrecord: corrupted record at byte 25 \(data"):
        list(records.iter_records(f"{bucket}/bad.tfrecord"))
    storage.put_bytes(f"{bucket}/cut.tfrecord", bytes(raw[:-3]))
    with pytest.raises(ValueError, match=r"cut.tfrecord: truncated record at byte \d+"):
        list(records.iter_records(f"{bucket}/cut.tfrecord", check_crc=False))
    with storage.open_read(url, block_size=64) as f:  # buffered ranged reads
        assert f.read() == open(path, "rb").read()
