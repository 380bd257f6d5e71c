"""Length bucketing: batches of a few static sequence lengths instead of every batch padded to
``max_seq_length``.

Each feature row's length is one past its last attended position (``input_mask``; multiple
choice: the longest choice). The bucket lengths are powers of two from a minimum up to
``max_seq_length`` (which is always the last). A batch plan takes the rows in a given order,
groups them by the smallest bucket that holds them (keeping the order within a bucket), cuts
each bucket into full batches, and carries a bucket's remainder into the next longer bucket, so
an epoch has exactly ``ceil(rows / batch_size)`` batches (as without bucketing) and only the
last one is partly padding. Every row appears in exactly one batch. A batch's arrays are cut to
its bucket length; a masked BERT's outputs at attended positions do not depend on the padding
after them, so bucketing changes the work done, not the results (up to float rounding).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from bert_jax.errors import BertJaxError


def bucket_lengths(max_seq_length: int, min_length: int) -> tuple[int, ...]:
    """Powers of two ``min_length, 2*min_length, ...`` below ``max_seq_length``, then
    ``max_seq_length``; ``min_length`` 0 (or >= max_seq_length): one bucket."""
    if min_length < 0:
        raise BertJaxError(f"length_bucket_min={min_length} must be >= 0")
    if min_length == 0 or min_length >= max_seq_length:
        return (max_seq_length,)
    if min_length % 8:
        raise BertJaxError(f"length_bucket_min={min_length} must be a multiple of 8 (the "
                           "attention kernels tile sequences by 8 or 16)")
    out, length = [], min_length
    while length < max_seq_length:
        out.append(length)
        length *= 2
    return (*out, max_seq_length)


def keep_worthwhile(buckets: Sequence[int], lengths: np.ndarray, passes: int,
                    min_sequences: int) -> tuple[int, ...]:
    """``buckets`` without the shorter ones that would see fewer than ``min_sequences``
    sequences (rows that fit them, times ``passes`` over the data): each bucket length costs
    its own compiled programs, which a small task does not win back. A dropped bucket's rows
    join the next longer bucket; the longest (``max_seq_length``) always stays."""
    buckets = tuple(buckets)
    if min_sequences <= 0 or len(buckets) == 1:
        return buckets
    counts = np.bincount(np.searchsorted(np.asarray(buckets), np.asarray(lengths)),
                         minlength=len(buckets))
    kept, carried = [], 0
    for length, count in zip(buckets[:-1], counts[:-1], strict=True):
        carried += int(count)
        if carried * passes >= min_sequences:
            kept.append(length)
            carried = 0
    return (*kept, buckets[-1])


def row_lengths(input_mask: np.ndarray) -> np.ndarray:
    """[N] one past the last attended position of each row (over all choices)."""
    mask = np.asarray(input_mask).reshape(input_mask.shape[0], -1, input_mask.shape[-1]) > 0
    attended = mask.any(axis=1)  # [N, S]
    last = attended.shape[1] - np.argmax(attended[:, ::-1], axis=1)
    return np.where(attended.any(axis=1), last, 1).astype(np.int64)


@dataclasses.dataclass(frozen=True)
class PlannedBatch:
    rows: np.ndarray  # feature row indices, len <= batch_size (the real rows)
    seq_len: int  # the bucket length the batch's arrays are cut to


def plan_batches(lengths: np.ndarray, buckets: Sequence[int], order: np.ndarray,
                 batch_size: int) -> list[PlannedBatch]:
    """Batches of the rows in ``order`` grouped by bucket (see the module docstring)."""
    buckets = tuple(buckets)
    bucket_of = np.searchsorted(np.asarray(buckets), np.asarray(lengths)[order])
    if len(order) and bucket_of.max() >= len(buckets):
        raise BertJaxError(f"a row is longer ({int(np.max(lengths))}) than the longest bucket "
                           f"{buckets[-1]}")
    batches, carry = [], np.empty(0, np.int64)
    for b, length in enumerate(buckets):
        rows = np.concatenate([carry, np.asarray(order)[bucket_of == b]]).astype(np.int64)
        full = len(rows) // batch_size * batch_size
        batches += [PlannedBatch(rows[s:s + batch_size], length)
                    for s in range(0, full, batch_size)]
        carry = rows[full:]
    if len(carry):
        batches.append(PlannedBatch(carry, buckets[-1]))
    return batches


def shuffled(batches: list[PlannedBatch], seed: int, epoch: int) -> list[PlannedBatch]:
    """The batches in an order drawn from (seed, epoch): short and long batches interleave."""
    perm = np.random.default_rng([seed, epoch, 1]).permutation(len(batches))
    return [batches[i] for i in perm]


def gather(features: Mapping[str, np.ndarray], keys: Sequence[str], batch: PlannedBatch,
           batch_size: int, max_seq_length: int) -> tuple[dict[str, np.ndarray], int]:
    """(arrays of the batch's rows cut to its length, real rows). A short batch is padded with
    copies of its first row; ``example_weight`` (1 real, 0 padding) is not added here."""
    index, real = batch.rows, len(batch.rows)
    if real < batch_size:
        index = np.concatenate([index, np.full(batch_size - real, index[0])])
    out = {}
    for k in keys:
        value = np.asarray(features[k])[index]
        if value.ndim >= 2 and value.shape[-1] == max_seq_length:
            value = value[..., :batch.seq_len]
        out[k] = value
    return out, real


def pad_sequence_outputs(value: np.ndarray, max_seq_length: int) -> np.ndarray:
    """[B, L, ...] outputs of a bucket of length L -> [B, max_seq_length, ...] (zeros after)."""
    missing = max_seq_length - value.shape[1]
    if missing <= 0:
        return value
    widths = [(0, 0), (0, missing)] + [(0, 0)] * (value.ndim - 2)
    return np.pad(value, widths)
