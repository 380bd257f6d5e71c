"""Serializes ``tf.train.Example`` protos of int64 features without importing tensorflow.

Example-creation workers run in separate processes; importing tensorflow in each of them costs
seconds and hundreds of MB, and only a few bytes of protobuf wire format are needed:
``Example{features=1: Features{feature=1: map<string, Feature>}}``,
``Feature{int64_list=3: Int64List{value=1: packed varints}}`` (``bert_jax/protowire.py``).
"""

from __future__ import annotations

from bert_jax.protowire import varint as _varint


class ExampleEncoder:
    """Encodes dicts of non-negative int lists; varints of small values come from a table."""

    def __init__(self, table_size: int):
        self._table = [_varint(v) for v in range(table_size)]

    def _packed(self, values: list[int]) -> bytes:
        table = self._table
        n = len(table)
        return b"".join(table[v] if 0 <= v < n else _varint(v) for v in values)

    def entry(self, key: str, values) -> bytes:
        """One ``Features.feature`` map entry: ``key`` -> Int64List(values); entries
        concatenated are a Features body (:meth:`example` wraps them)."""
        packed = self._packed(values)
        int64_list = b"\x0a" + _varint(len(packed)) + packed
        feature = b"\x1a" + _varint(len(int64_list)) + int64_list
        key_bytes = key.encode()
        entry = (b"\x0a" + _varint(len(key_bytes)) + key_bytes
                 + b"\x12" + _varint(len(feature)) + feature)
        return b"\x0a" + _varint(len(entry)) + entry

    @staticmethod
    def example(body: bytes) -> bytes:
        """An Example from concatenated :meth:`entry` bytes."""
        return b"\x0a" + _varint(len(body)) + body

    def encode(self, features: dict[str, list[int]]) -> bytes:
        return self.example(b"".join(self.entry(k, v) for k, v in features.items()))
