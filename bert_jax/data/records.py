"""TFRecord files as tf.data datasets, on local disk or in a bucket.

Local files are read by TensorFlow's own ``TFRecordDataset``. Files in a bucket are read by
this module through the storage layer (``bert_jax.storage``: large ranged reads, the same
client the rest of the project uses), framed and CRC-checked here, and handed to tf.data in
blocks of records: TensorFlow's ``gs://`` client cannot be pointed at another endpoint, so
it could never be tested against a server, whereas this reader is exercised by the suite
against fake-gcs-server exactly as it runs against Cloud Storage.

A TFRecord frame is ``uint64 length | uint32 masked CRC32C(length) | data | uint32 masked
CRC32C(data)`` (little-endian).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence

from bert_jax import storage

_HEADER = 12
_FOOTER = 4
_MASK_DELTA = 0xA282EAD8
# Records handed to tf.data per generator call: the Python cost per record stays small.
BLOCK_RECORDS = 512
# Bytes asked of the server per request: large ranged reads keep the per-request latency of an
# object store off the per-record path.
CHUNK_BYTES = 16 << 20


def _masked_crc(data: bytes) -> int:
    import google_crc32c

    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
    """One record framed as a TFRecord file holds it (no tensorflow needed)."""
    length = struct.pack("<Q", len(data))
    return (length + struct.pack("<I", _masked_crc(length)) + data
            + struct.pack("<I", _masked_crc(data)))


def iter_records(path: str, *, check_crc: bool = True,
                 chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The records of one TFRecord file, in order, read in ``chunk_bytes`` requests and
    framed from memory. A cut-off or corrupted frame raises ValueError naming the file and
    the byte offset."""
    size = storage.getsize(path)
    buffer, pos, offset = b"", 0, 0  # offset: file position of buffer[pos]
    read_to = 0  # file position of the buffer's end

    def have(n: int) -> bool:
        nonlocal buffer, pos, read_to
        while len(buffer) - pos < n:
            if read_to >= size:
                return False
            end = min(size, read_to + max(chunk_bytes, n))
            buffer, pos = buffer[pos:] + storage.read_range(path, read_to, end), 0
            read_to = end
        return True

    while True:
        if not have(1):
            return
        if not have(_HEADER):
            raise ValueError(f"{path}: truncated record header at byte {offset}")
        header = buffer[pos:pos + _HEADER]
        (length,) = struct.unpack("<Q", header[:8])
        if check_crc and struct.unpack("<I", header[8:])[0] != _masked_crc(header[:8]):
            raise ValueError(f"{path}: corrupted record at byte {offset} (length checksum)")
        if not have(_HEADER + length + _FOOTER):
            raise ValueError(f"{path}: truncated record at byte {offset}")
        data = buffer[pos + _HEADER:pos + _HEADER + length]
        footer = buffer[pos + _HEADER + length:pos + _HEADER + length + _FOOTER]
        if check_crc and struct.unpack("<I", footer)[0] != _masked_crc(data):
            raise ValueError(f"{path}: corrupted record at byte {offset} (data checksum)")
        pos += _HEADER + length + _FOOTER
        offset += _HEADER + length + _FOOTER
        yield data


def _blocks(path: bytes | str) -> Iterator[list[bytes]]:
    path = path.decode() if isinstance(path, bytes) else path
    block: list[bytes] = []
    for record in iter_records(path):
        block.append(record)
        if len(block) == BLOCK_RECORDS:
            yield block
            block = []
    if block:
        yield block


def file_records(path):
    """A dataset of one file's serialized records; ``path`` is a string or a scalar string
    tensor (as ``interleave`` passes it)."""
    import tensorflow as tf

    if isinstance(path, str) and not storage.is_remote(path):
        return tf.data.TFRecordDataset(path)
    if isinstance(path, str):
        path = tf.constant(path)
    return tf.data.Dataset.from_generator(
        _blocks, args=(path,),
        output_signature=tf.TensorSpec([None], tf.string)).unbatch()


def records(files: Sequence[str]):
    """A dataset of the serialized records of ``files``, file after file."""
    import tensorflow as tf

    files = [str(f) for f in files]
    if not any(storage.is_remote(f) for f in files):
        return tf.data.TFRecordDataset(files)
    return tf.data.Dataset.from_tensor_slices(files).flat_map(file_records)


def reader_for(files: Sequence[str]):
    """The per-file dataset constructor to ``interleave`` over ``files``' names."""
    import tensorflow as tf

    if any(storage.is_remote(str(f)) for f in files):
        return file_records
    return tf.data.TFRecordDataset
