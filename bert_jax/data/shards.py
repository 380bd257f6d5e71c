"""Shard files checked against ``metadata.json`` before a pipeline reads them.

tf.data over an empty or cut-short shard does not fail: it repeats nothing, or loses the
tail without a word. Every shard listed in ``metadata.json`` is therefore checked when the
metadata is loaded: it must be non-empty when it should hold examples, have the recorded
size in bytes (written by ``create-pretraining-data``), and, for data written before sizes
were recorded, hold exactly the recorded number of complete TFRecord frames.
"""

from __future__ import annotations

import struct

from bert_jax import storage
from bert_jax.errors import BertJaxError

_HEADER = 12  # uint64 length + uint32 masked CRC of the length
_FOOTER = 4  # uint32 masked CRC of the data


def count_records(path: str) -> tuple[int, bool]:
    """(complete TFRecord frames, whether the file ends exactly after the last one)."""
    size = storage.getsize(path)
    count, offset = 0, 0
    with storage.open_read(path, block_size=1 << 16) as f:
        while offset < size:
            header = f.read(_HEADER)
            if len(header) < _HEADER:
                return count, False
            (length,) = struct.unpack("<Q", header[:8])
            offset += _HEADER + length + _FOOTER
            if offset > size:
                return count, False
            f.seek(offset)
            count += 1
    return count, True


def check_shards(metadata_path: str, files: list[str], examples: list[int],
                 sizes: list[int | None]) -> None:
    """BertJaxError naming the first shard that is empty, short or of another size."""
    for path, count, size in zip(files, examples, sizes, strict=True):
        actual = storage.getsize(path)
        if count > 0 and actual == 0:
            raise BertJaxError(f"{path}: empty (0 bytes), but {metadata_path} lists {count} "
                               "examples; recreate the data with `bert-jax "
                               "create-pretraining-data`")
        if size is not None:
            if actual != size:
                raise BertJaxError(f"{path}: {actual} bytes, {metadata_path} records {size} "
                                   "(truncated or rewritten); recreate the data")
            continue
        found, complete = count_records(path)
        if not complete or found != count:
            raise BertJaxError(f"{path}: {found} complete records"
                               + ("" if complete else " and a cut-off tail")
                               + f", {metadata_path} lists {count}; recreate the data")
