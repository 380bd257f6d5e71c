"""TensorBoard event files written without tensorflow: TensorFlow's own reader parses them,
the record framing is byte-identical to ``tf.io.TFRecordWriter``'s, and the metrics writer
mirrors each logged scalar."""

import glob
import os

import numpy as np
import pytest

from bert_jax import protowire
from bert_jax.runs.metrics import MetricsWriter
from bert_jax.runs.tensorboard import EventWriter

tf = pytest.importorskip("tensorflow")


def test_crc32c_check_value():
    assert protowire.crc32c(b"123456789") == 0xE3069283  # the CRC-32C catalogue's check value
    assert protowire.crc32c(b"") == 0


def test_record_framing_matches_tensorflow(tmp_path):
    records = [b"", b"x", bytes(range(256)) * 5]
    path = str(tmp_path / "tf.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
    with open(path, "rb") as f:
        assert f.read() == b"".join(protowire.tfrecord(r) for r in records)


def test_events_read_back_with_tensorflow(tmp_path):
    writer = EventWriter(str(tmp_path / "tb"))
    writer.scalars(0, {"train/loss": 2.5, "train/mfu": 0.125})
    writer.scalars(300, {"eval/accuracy": 0.1})
    writer.close()
    with pytest.raises(ValueError, match="non-negative"):
        EventWriter(str(tmp_path / "tb2")).scalars(-1, {"x": 1.0})
    events = list(tf.compat.v1.train.summary_iterator(writer.path))
    assert events[0].file_version == "brain.Event:2"
    read = [(e.step, {v.tag: v.simple_value for v in e.summary.value}) for e in events[1:]]
    assert read == [(0, {"train/loss": 2.5, "train/mfu": 0.125}),
                    (300, {"eval/accuracy": np.float32(0.1)})]
    assert all(e.wall_time > 1e9 for e in events)


def test_metrics_writer_mirrors_numeric_fields(tmp_path):
    metrics = MetricsWriter(str(tmp_path))
    metrics.write(5, {"loss": np.float32(1.5), "note": "text", "skipped_steps": 2})
    metrics.close()
    (path,) = glob.glob(os.path.join(tmp_path, "tensorboard", "events.out.tfevents.*"))
    (event,) = list(tf.compat.v1.train.summary_iterator(path))[1:]
    assert event.step == 5
    assert {v.tag: v.simple_value for v in event.summary.value} == {
        "train/loss": 1.5, "train/skipped_steps": 2.0}
