"""TFRecord framing without tensorflow: byte for byte what TensorFlow's writer writes."""

import pytest

from bert_jax.data import records


def test_frame_matches_tensorflows_writer(tmp_path):
    tf = pytest.importorskip("tensorflow")
    data = [b"", b"x", b"record " * 300, bytes(range(256))]
    path = str(tmp_path / "tf.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        for d in data:
            w.write(d)
    assert b"".join(records.frame(d) for d in data) == open(path, "rb").read()
    ours = tmp_path / "ours.tfrecord"
    ours.write_bytes(b"".join(records.frame(d) for d in data))
    assert list(records.iter_records(str(ours))) == data
