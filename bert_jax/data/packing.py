"""Sequence packing: several examples per row of ``max_seq_length`` tokens, so that short
examples stop paying for padding.

``pack_lengths`` places examples into rows (best-fit decreasing: longest first, each into the
open row it fills most tightly, at most ``max_examples_per_row`` per row); ``pack_features``
builds the packed arrays from right-padded per-example features. A packed row is
left-aligned (padding at the end) and carries, besides ``input_ids``, ``input_mask`` and
``segment_ids``:

* ``example_ids`` [rows, seq] int32: 0 at padding, 1..k = the example slot of each token;
* ``position_ids`` [rows, seq] int32: positions restarting at 0 for each example;
* ``cls_positions`` [rows, k] int32: each slot's first token (0 for an empty slot);
* ``example_slots`` [rows, k] float32: 1 for a slot holding an example, 0 for an empty one;
* ``example_index`` [rows, k] int32: the packed example of each slot (-1 if empty);
* per-example values (labels) as [rows, k, ...] with zeros in empty slots.

The model confines attention to each example (``modeling/attention.py``) and reads its
per-example heads at ``cls_positions``, so a packed example's outputs equal its unpacked ones.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence

import numpy as np

PACKED_KEYS = ("example_ids", "position_ids", "cls_positions", "example_slots",
               "example_index")


def pack_lengths(lengths: Sequence[int] | np.ndarray, max_seq_length: int,
                 max_examples_per_row: int, seed: int = 0) -> list[np.ndarray]:
    """Rows of example indices: every example in exactly one row, each row's lengths summing
    to at most ``max_seq_length``, at most ``max_examples_per_row`` examples a row.

    Best-fit decreasing: examples longest first (ties in an order drawn from ``seed``), each
    into the open row with the least room that still fits it, else a new row. Deterministic
    given ``seed``. Within a row, examples keep their placement order."""
    lengths = np.asarray(lengths, np.int64)
    if max_examples_per_row < 1:
        raise ValueError(f"max_examples_per_row={max_examples_per_row} must be >= 1")
    if len(lengths) and (lengths.max() > max_seq_length or lengths.min() < 1):
        raise ValueError(f"example lengths must be in [1, {max_seq_length}], got "
                         f"[{lengths.min()}, {lengths.max()}]")
    tiebreak = np.random.default_rng(seed).permutation(len(lengths))
    order = tiebreak[np.argsort(-lengths[tiebreak], kind="stable")]
    rows: list[list[int]] = []
    open_rows: dict[int, list[int]] = {}  # room left -> rows with that room (a stack)
    rooms: list[int] = []  # sorted keys of open_rows
    for i in order.tolist():
        n = int(lengths[i])
        j = bisect.bisect_left(rooms, n)
        if j < len(rooms):
            room = rooms[j]
            stack = open_rows[room]
            r = stack.pop()
            if not stack:
                del open_rows[room]
                rooms.pop(j)
        else:
            room, r = max_seq_length, len(rows)
            rows.append([])
        rows[r].append(i)
        room -= n
        if room > 0 and len(rows[r]) < max_examples_per_row:
            if room not in open_rows:
                open_rows[room] = []
                bisect.insort(rooms, room)
            open_rows[room].append(r)
    out = [np.asarray(row, np.int64) for row in rows]
    placed = np.sort(np.concatenate(out)) if out else np.zeros(0, np.int64)
    if not np.array_equal(placed, np.arange(len(lengths))):
        raise AssertionError("packing did not place every example exactly once")
    return out


def padding_fraction(lengths: np.ndarray, rows: int, max_seq_length: int) -> float:
    """The fraction of ``rows`` x ``max_seq_length`` token slots that are padding."""
    total = rows * max_seq_length
    return 1.0 - float(np.sum(lengths)) / total if total else 0.0


def pack_features(features: Mapping[str, np.ndarray], rows: Sequence[np.ndarray],
                  max_examples_per_row: int, per_example_keys: Sequence[str] = (),
                  token_keys: Sequence[str] = ("input_ids", "segment_ids")
                  ) -> dict[str, np.ndarray]:
    """Right-padded per-example features (``input_mask`` [N, seq] marks real tokens) -> packed
    rows as the module docstring describes. ``token_keys`` ([N, seq] each) are copied token
    by token, ``input_mask`` is rebuilt; ``per_example_keys`` ([N, ...]) become
    [rows, k, ...]."""
    mask = np.asarray(features["input_mask"])
    seq_len = mask.shape[1]
    lengths = mask.sum(axis=1).astype(np.int64)
    k = max_examples_per_row
    num_rows = len(rows)
    # Per placed example: its row, slot and first column.
    row_of = np.concatenate([np.full(len(r), i) for i, r in enumerate(rows)]).astype(np.int64) \
        if num_rows else np.zeros(0, np.int64)
    examples = np.concatenate(rows) if num_rows else np.zeros(0, np.int64)
    slot = np.concatenate([np.arange(len(r)) for r in rows]).astype(np.int64) \
        if num_rows else np.zeros(0, np.int64)
    if len(slot) and slot.max() >= k:
        raise ValueError(f"a row holds more than max_examples_per_row={k} examples")
    ex_len = lengths[examples]
    ends = np.cumsum(ex_len)
    row_starts = np.zeros(num_rows + 1, np.int64)
    np.add.at(row_starts, row_of + 1, ex_len)
    row_starts = np.cumsum(row_starts)  # token offset of each row in the flat order
    first_col = ends - ex_len - row_starts[row_of]
    if len(first_col) and (first_col + ex_len).max() > seq_len:
        raise ValueError(f"a packed row exceeds {seq_len} tokens")
    # Per token of the packed order: source example, position within it, destination.
    tok_example = np.repeat(examples, ex_len)
    tok_pos = np.arange(int(ex_len.sum())) - np.repeat(ends - ex_len, ex_len)
    tok_row = np.repeat(row_of, ex_len)
    tok_col = np.repeat(first_col, ex_len) + tok_pos
    out: dict[str, np.ndarray] = {}
    for key in token_keys:
        src = np.asarray(features[key])
        dst = np.zeros((num_rows, seq_len), src.dtype)
        dst[tok_row, tok_col] = src[tok_example, tok_pos]
        out[key] = dst
    out["input_mask"] = np.zeros((num_rows, seq_len), mask.dtype)
    out["input_mask"][tok_row, tok_col] = 1
    out["example_ids"] = np.zeros((num_rows, seq_len), np.int32)
    out["example_ids"][tok_row, tok_col] = np.repeat(slot + 1, ex_len)
    out["position_ids"] = np.zeros((num_rows, seq_len), np.int32)
    out["position_ids"][tok_row, tok_col] = tok_pos
    out["cls_positions"] = np.zeros((num_rows, k), np.int32)
    out["cls_positions"][row_of, slot] = first_col
    out["example_slots"] = np.zeros((num_rows, k), np.float32)
    out["example_slots"][row_of, slot] = 1.0
    out["example_index"] = np.full((num_rows, k), -1, np.int32)
    out["example_index"][row_of, slot] = examples
    for key in per_example_keys:
        src = np.asarray(features[key])
        dst = np.zeros((num_rows, k, *src.shape[1:]), src.dtype)
        dst[row_of, slot] = src[examples]
        out[key] = dst
    return out


def unpack_outputs(values: np.ndarray, example_index: np.ndarray, num_examples: int
                   ) -> np.ndarray:
    """Per-slot outputs [rows, k, ...] -> per-example outputs [num_examples, ...] in the
    examples' original order (``example_index`` from ``pack_features``)."""
    filled = example_index >= 0
    out = np.zeros((num_examples, *values.shape[2:]), values.dtype)
    out[example_index[filled]] = values[filled]
    if np.count_nonzero(filled) != num_examples:
        raise AssertionError("packed outputs do not cover every example exactly once")
    return out
