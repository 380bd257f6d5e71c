"""Protocol-buffer wire format and TFRecord framing, written without tensorflow or protobuf.

bert-jax writes two kinds of TensorFlow files from processes that should not pay for importing
tensorflow (seconds and hundreds of MB): ``tf.train.Example`` records (data creation workers)
and TensorBoard event files (every training and fine-tuning run). Both need only a few message
fields: tags, varints, length-delimited payloads and fixed-width floats, and, for a record
file, each record framed as ``length, masked CRC-32C of the length, data, masked CRC-32C of the
data`` (TFRecord).
"""

from __future__ import annotations

import struct

# wire types
VARINT, FIXED64, BYTES, FIXED32 = 0, 1, 2, 5


def varint(value: int) -> bytes:
    """``value`` (non-negative) as a base-128 varint."""
    if value < 0:
        raise ValueError(f"negative value {value} for a varint field")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def key(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def field_varint(number: int, value: int) -> bytes:
    """A varint field (int32, int64 with a non-negative value, enum, bool)."""
    return key(number, VARINT) + varint(value)


def field_bytes(number: int, payload: bytes | str) -> bytes:
    """A length-delimited field: bytes, a UTF-8 string or an encoded sub-message."""
    if isinstance(payload, str):
        payload = payload.encode("utf-8")
    return key(number, BYTES) + varint(len(payload)) + payload


def field_double(number: int, value: float) -> bytes:
    return key(number, FIXED64) + struct.pack("<d", value)


def field_float(number: int, value: float) -> bytes:
    return key(number, FIXED32) + struct.pack("<f", value)


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), the checksum of TFRecord files."""
    crc = 0xFFFFFFFF
    table = _TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(data: bytes) -> bytes:
    """``data`` framed as one TFRecord record."""
    length = struct.pack("<Q", len(data))
    return (length + struct.pack("<I", masked_crc32c(length)) + data
            + struct.pack("<I", masked_crc32c(data)))
