"""No hang: shards are checked against metadata.json when loaded, a stalled source turns
into an error after data.wait_timeout_s, and a stop request ends a data wait."""

import os
import threading

import pytest

from bert_jax.data.metadata import load_metadata
from bert_jax.data.output import staged_data_directory
from bert_jax.data.shards import count_records
from bert_jax.errors import BertJaxError
from bert_jax.training.inputs import DataStalled, DataWaitInterrupted, Prefetcher
from tests.data.helpers import write_shards


@pytest.fixture()
def shards(tmp_path):
    write_shards(str(tmp_path / "data"), num_examples=40, num_shards=2)
    return tmp_path / "data"


def test_zero_byte_shard_under_stale_metadata(shards):
    first = shards / "train-00000-of-00002.tfrecord"
    open(first, "w").close()
    with pytest.raises(BertJaxError, match=r"train-00000-of-00002.tfrecord: empty \(0 bytes\)"):
        load_metadata(str(shards))


def test_truncated_shard_is_named(shards):
    second = shards / "train-00001-of-00002.tfrecord"
    assert count_records(str(second)) == (20, True)
    with open(second, "r+b") as f:
        f.truncate(os.path.getsize(second) - 7)
    with pytest.raises(BertJaxError, match=r"00001-of-00002.tfrecord: 19 complete records and a "
                                           r"cut-off tail, .* lists 20"):
        load_metadata(str(shards))


def test_recorded_sizes_catch_truncation(tmp_path):
    out = tmp_path / "out"
    with staged_data_directory(str(out)) as staging:
        write_shards(staging, num_examples=10, num_shards=1)
    shard = out / "train-00000-of-00001.tfrecord"
    assert load_metadata(str(out)).raw["splits"]["train"]["shards"][0]["bytes"] == \
        os.path.getsize(shard)
    with open(shard, "ab") as f:
        f.write(b"\0")
    with pytest.raises(BertJaxError, match=r"bytes, .*metadata.json records"):
        load_metadata(str(out))


def test_staged_output_keeps_old_data_and_refuses_foreign_directory(tmp_path):
    out = tmp_path / "out"
    with staged_data_directory(str(out)) as staging:
        write_shards(staging, num_examples=10, num_shards=1)
    before = (out / "metadata.json").read_text()
    with pytest.raises(RuntimeError), staged_data_directory(str(out)) as staging:
        write_shards(staging, num_examples=20, num_shards=1)
        raise RuntimeError("killed while writing")
    assert (out / "metadata.json").read_text() == before
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "wiki.txt").write_text("text")
    with pytest.raises(BertJaxError, match="not pretraining data.*wiki.txt"), \
            staged_data_directory(str(corpus)):
        pass
    assert (corpus / "wiki.txt").exists()


class _Blocked:
    """A source whose next batch never comes (a hung read)."""

    def __init__(self):
        self.release = threading.Event()

    def __iter__(self):
        return self

    def __next__(self):
        self.release.wait()
        raise StopIteration

    def state(self):
        return {}


def test_stalled_source_raises_after_timeout():
    source = _Blocked()
    prefetch = Prefetcher(source, lambda b: b, timeout_s=0.3)
    with pytest.raises(DataStalled, match="data.wait_timeout_s=0.3"):
        next(prefetch)
    source.release.set()
    prefetch.close()


def test_stop_request_ends_a_data_wait():
    source = _Blocked()
    requested = threading.Event()
    prefetch = Prefetcher(source, lambda b: b, interrupted=requested.is_set)
    threading.Timer(0.2, requested.set).start()
    with pytest.raises(DataWaitInterrupted):
        next(prefetch)
    source.release.set()
    prefetch.close()


class DataLossError(Exception):
    """Stands in for tensorflow's error on a record whose checksum fails."""


class _Corrupt:
    def __iter__(self):
        return self

    def __next__(self):
        raise DataLossError("corrupted record at 1234")

    def state(self):
        return {}


def test_corrupt_record_is_one_data_error():
    prefetch = Prefetcher(_Corrupt(), lambda b: b)
    with pytest.raises(BertJaxError, match="training data is damaged: corrupted record at 1234"):
        next(prefetch)
    prefetch.close()


def _flip_middle_byte(path):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))


def _replace_with_directory(path):
    os.remove(path)
    os.mkdir(path)


@pytest.mark.parametrize("damage", [os.remove, _replace_with_directory, _flip_middle_byte])
def test_shard_damaged_mid_run_is_one_error_naming_it(shards, damage):
    """A shard deleted, replaced by a folder or corrupted after the run checked it: one
    BertJaxError naming the shard (not a tensorflow traceback)."""
    from bert_jax.data.pipeline import PretrainingIterator

    source = PretrainingIterator.from_data_dir(str(shards), per_host_batch_size=4,
                                               max_predictions_per_seq=5, seq_len=32,
                                               shuffle_buffer=4)
    second = shards / "train-00001-of-00002.tfrecord"
    damage(second)
    prefetch = Prefetcher(source, lambda b: b)
    with pytest.raises(BertJaxError, match=r"training data is damaged: .*"
                                           r"train-00001-of-00002.tfrecord: "):
        for _ in range(200):  # several epochs: every shard is opened again
            next(prefetch)
    prefetch.close()
