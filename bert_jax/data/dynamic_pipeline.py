"""tf.data pipeline over document shards: sentence pairs made afresh each epoch, then masked.

All hosts load every document of the split (:func:`~bert_jax.data.documents.load_document_table`)
and see one global stream of examples:

* Epoch ``e`` is the plan :func:`~bert_jax.data.pairing.make_plan` draws with
  ``numpy.random.default_rng([seed, e, 0])`` (NotNext partners from any document of the
  split), in the order of a permutation drawn with ``default_rng([seed, e, 1])``. Epochs follow
  each other without a gap; their sizes differ a little (the chunking is random).
* Global batch ``step`` is positions ``[step * G, (step + 1) * G)`` of that stream
  (``G = process_count * per_host_batch_size``) and host ``i`` takes rows
  ``[i * B, (i + 1) * B)`` of it: hosts are disjoint, and the union of the hosts' batches is
  the one-host stream with batch ``G``, whatever the number of hosts.
* The example at a position is a pure function of (seed, epoch, position in the epoch); the
  iterator state stores the epoch and position of the next global batch, so a run resumed
  from it (on the same or another number of hosts, with the same global batch) sees exactly
  the examples it would have seen. Without them, positions are counted from epoch 0.
* Each host batch is made in numpy inside the pipeline (``tf.numpy_function``, parallel
  calls) and masked with :func:`~bert_jax.data.masking.mask_batch` exactly as the pair-shard
  pipeline does: seed ``fold_in((seed, process_index), step)``.

Packing (``examples_per_row`` = k > 0): the positions of an epoch are packed *rows* instead
of examples, and everything above holds with "row" for "example" (G rows a global batch,
state = epoch and row position). The rows are fixed when the epoch is drawn: the examples, at
their natural lengths and in the epoch's shuffled order, are cut into consecutive groups of
``_PACK_GROUP``; each group is placed by :func:`~bert_jax.data.packing.pack_lengths` (at most
k a row, seed ``mix_seed(seed, epoch, group)``), and the epoch's rows are put in the order of
a permutation from ``default_rng([seed, epoch, 2])``. So every example of the epoch lies in
exactly one row, a row is a pure function of (seed, epoch, row position), and batches carry
nothing over to the next: a resumed run rebuilds the same rows (the alternative, filling each
batch greedily from the example stream, would make a batch's content depend on every batch
before it and the state on a carried remainder). Rows are laid out with
:func:`~bert_jax.data.packing.pack_features` (``example_ids``, ``position_ids``,
``cls_positions``, per-slot labels and weights, as packed pair shards give) and masked per
token like any row, so every masked position lies inside one example.
"""

from __future__ import annotations

import bisect
import collections
import threading
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from bert_jax.data.documents import DocumentTable
from bert_jax.data.mask_settings import MaskSettings
from bert_jax.data.masking import MaskingConfig, make_tables, mask_batch, mix_seed
from bert_jax.data.packing import pack_features, pack_lengths
from bert_jax.data.pairing import PAIRINGS, Plan, example_lengths, make_plan, materialize
from bert_jax.errors import BertJaxError

_CACHED_EPOCHS = 3
# Packing: examples placed together (consecutive in the epoch's shuffled order). Large
# enough that best-fit leaves almost no room unused, small enough to bound one placement.
_PACK_GROUP = 1 << 16
# host_packed_batch's arrays, in order.
PACKED_ARRAYS = ("input_ids", "segment_ids", "example_ids", "position_ids", "cls_positions",
                 "next_sentence_labels", "example_slots")


class Epoch(NamedTuple):
    """One epoch of the stream. Unpacked, position ``p`` is plan row ``order[p]``; packed,
    position ``p`` is the row of plan rows ``order[row_offsets[p]:row_offsets[p + 1]]``."""

    plan: Plan
    order: np.ndarray  # int64: plan rows in stream order
    row_offsets: np.ndarray | None  # int64 [rows + 1]; None when unpacked

    @property
    def size(self) -> int:
        """The epoch's positions: examples, or packed rows."""
        return len(self.order) if self.row_offsets is None else len(self.row_offsets) - 1


def _ranges(first: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The concatenation of ``arange(first[i], first[i] + sizes[i])`` over i."""
    return np.repeat(first - (np.cumsum(sizes) - sizes), sizes) + np.arange(int(sizes.sum()))


class DocumentStream:
    """The global stream of one split: plans per epoch (cached), host batches by step.
    ``examples_per_row`` > 0: the stream's positions are packed rows (module docstring)."""

    def __init__(self, table: DocumentTable, *, pairing: str, seq_len: int,
                 short_seq_prob: float, seed: int, cls_id: int, sep_id: int, pad_id: int,
                 per_host_batch_size: int, process_index: int = 0, process_count: int = 1,
                 start_step: int = 0, start_epoch: int = 0, start_position: int = 0,
                 examples_per_row: int = 0):
        if pairing not in PAIRINGS:
            raise BertJaxError(f"pairing {pairing!r}: expected one of {PAIRINGS}")
        if not 0 <= process_index < process_count:
            raise BertJaxError(f"process_index {process_index} not in [0, {process_count})")
        if per_host_batch_size < 1:
            raise BertJaxError(f"per_host_batch_size {per_host_batch_size}: must be >= 1")
        if isinstance(examples_per_row, bool) or not isinstance(examples_per_row, int) \
                or examples_per_row < 0:
            raise BertJaxError(f"examples_per_row {examples_per_row!r}: expected an integer "
                               ">= 0 (0: one example a row)")
        self.examples_per_row = examples_per_row
        self.table, self.pairing, self.seq_len = table, pairing, seq_len
        self.short_seq_prob, self.seed = short_seq_prob, seed
        self.cls_id, self.sep_id, self.pad_id = cls_id, sep_id, pad_id
        self.batch, self.global_batch = per_host_batch_size, per_host_batch_size * process_count
        self.host_offset = process_index * per_host_batch_size
        # Anchor: global batch ``start_step`` begins at ``start_position`` of ``start_epoch``.
        self.start_step, self.start_epoch = start_step, start_epoch
        self._bounds = [-start_position]  # stream offset of each epoch's start, from the anchor
        self._cache: collections.OrderedDict[int, Epoch] = collections.OrderedDict()
        self._lock = threading.Lock()
        # The next epoch, drawn in a background thread while this one is read: on a large
        # corpus drawing an epoch takes seconds to a minute (docs/tpu.md, "The host side"),
        # which would otherwise stall the pipeline at every epoch boundary.
        self._ahead: dict[int, tuple[threading.Thread, list]] = {}

    def epoch(self, epoch: int) -> Epoch:
        """(plan, order, row_offsets) of ``epoch`` (see :class:`Epoch`)."""
        with self._lock:
            return self._epoch(epoch)

    def _epoch(self, epoch: int) -> Epoch:
        if epoch in self._cache:
            self._cache.move_to_end(epoch)
            return self._cache[epoch]
        ahead = self._ahead.pop(epoch, None)
        if ahead is not None:
            ahead[0].join()
        entry = ahead[1][0] if ahead is not None and ahead[1] else self._draw(epoch)
        self._cache[epoch] = entry
        while len(self._cache) > _CACHED_EPOCHS:
            self._cache.popitem(last=False)
        following = epoch + 1
        if following not in self._cache and following not in self._ahead:
            result: list = []  # the thread's Epoch; empty if it failed (drawn again then)
            thread = threading.Thread(target=lambda: result.append(self._draw(following)),
                                      name=f"epoch-{following}-plan", daemon=True)
            self._ahead = {following: (thread, result)}  # an older one is not needed
            thread.start()
        return entry

    def _draw(self, epoch: int) -> Epoch:
        """``epoch``'s plan, order and packed rows: a pure function of (seed, epoch)."""
        plan = make_plan(self.table, self.pairing, self.seq_len, self.short_seq_prob,
                         np.random.default_rng([self.seed, epoch, 0]))
        order = np.random.default_rng([self.seed, epoch, 1]).permutation(plan.num_examples)
        if self.examples_per_row:
            return Epoch(plan, *self._pack(plan, order, epoch))
        return Epoch(plan, order, None)

    def _pack(self, plan: Plan, order: np.ndarray, epoch: int
              ) -> tuple[np.ndarray, np.ndarray]:
        """(plan rows in row order, row offsets) of ``epoch``'s packed rows (module doc)."""
        lengths = example_lengths(plan)[order]
        rows: list[np.ndarray] = []
        for group, start in enumerate(range(0, len(order), _PACK_GROUP)):
            placed = pack_lengths(lengths[start:start + _PACK_GROUP], self.seq_len,
                                  self.examples_per_row, seed=mix_seed(self.seed, epoch, group))
            rows.extend(row + start for row in placed)
        shuffled = np.random.default_rng([self.seed, epoch, 2]).permutation(len(rows))
        rows = [rows[i] for i in shuffled]
        sizes = np.fromiter((len(row) for row in rows), np.int64, len(rows))
        return order[np.concatenate(rows)], np.append(0, np.cumsum(sizes))

    def _locate(self, offset: int) -> tuple[int, int]:
        """(epoch, position) of stream ``offset`` counted from the anchor (lock held)."""
        while len(self._bounds) == 1 or offset >= self._bounds[-1]:
            epoch = self.start_epoch + len(self._bounds) - 1
            self._bounds.append(self._bounds[-1] + self._epoch(epoch).size)
            if self._bounds[1] < 0:
                what = "rows" if self.examples_per_row else "examples"
                raise BertJaxError(f"data position {-self._bounds[0]} is past the end of epoch "
                                   f"{self.start_epoch} ({self._bounds[1] - self._bounds[0]} "
                                   f"{what}): the state does not belong to this data")
        k = bisect.bisect_right(self._bounds, offset) - 1
        return self.start_epoch + k, offset - self._bounds[k]

    def epoch_size(self, epoch: int) -> int:
        """Positions of ``epoch``: examples, or packed rows."""
        return self.epoch(epoch).size

    def position(self, step: int) -> tuple[int, int]:
        """(epoch, position) where global batch ``step`` begins."""
        with self._lock:
            return self._locate((step - self.start_step) * self.global_batch)

    def host_rows(self, step: int, limit_epoch: int | None = None
                  ) -> list[tuple[int, np.ndarray]]:
        """This host's rows of global batch ``step``, as (epoch, positions) groups; with
        ``limit_epoch``, positions past that epoch's end are left out."""
        first = (step - self.start_step) * self.global_batch + self.host_offset
        groups = []
        with self._lock:
            offset, end = first, first + self.batch
            while offset < end:
                epoch, pos = self._locate(offset)
                if limit_epoch is not None and epoch > limit_epoch:
                    break
                size = self._epoch(epoch).size
                take = min(end - offset, size - pos)
                groups.append((epoch, np.arange(pos, pos + take)))
                offset += take
        return groups

    def host_pair_rows(self, step, limit_epoch: int = -1):
        """int64 [b] A start, A length, B start, B length and int32 [b] labels of this host's
        rows of global batch ``step`` (nsp/sop plans: two pieces per example)."""
        parts = []
        for epoch, positions in self.host_rows(int(step),
                                               None if limit_epoch < 0 else int(limit_epoch)):
            plan, order, _ = self.epoch(epoch)
            rows = order[positions]
            lo, hi = plan.piece_lo.reshape(-1, 2)[rows], plan.piece_hi.reshape(-1, 2)[rows]
            parts.append((lo[:, 0], hi[:, 0] - lo[:, 0], lo[:, 1], hi[:, 1] - lo[:, 1],
                          plan.labels[rows].astype(np.int32)))
        if not parts:
            return tuple(np.zeros(0, np.int64) for _ in range(4)) + (np.zeros(0, np.int32),)
        return tuple(np.concatenate(p) for p in zip(*parts, strict=True))

    def host_batch(self, step, limit_epoch: int = -1):
        """int32 input_ids [b, seq_len], segment_ids [b, seq_len], labels [b] of this host's
        rows of global batch ``step`` (b < B only at the end of a single epoch)."""
        parts = []
        for epoch, positions in self.host_rows(int(step),
                                               None if limit_epoch < 0 else int(limit_epoch)):
            plan, order, _ = self.epoch(epoch)
            parts.append(materialize(self.table, plan, order[positions], self.seq_len,
                                     self.cls_id, self.sep_id, self.pad_id))
        if not parts:
            return (np.zeros((0, self.seq_len), np.int32), np.zeros((0, self.seq_len), np.int32),
                    np.zeros(0, np.int32))
        return tuple(np.concatenate(p) for p in zip(*parts, strict=True))

    def host_packed_batch(self, step, limit_epoch: int = -1):
        """This host's packed rows of global batch ``step`` (``examples_per_row`` > 0), the
        arrays of ``PACKED_ARRAYS``: int32 [b, seq_len] input_ids, segment_ids, example_ids,
        position_ids; int32 [b, k] cls_positions, next_sentence_labels; float32 [b, k]
        example_slots (the filled slots)."""
        parts, rows, count = [], [], 0
        for epoch, positions in self.host_rows(int(step),
                                               None if limit_epoch < 0 else int(limit_epoch)):
            plan, order, offsets = self.epoch(epoch)
            sizes = offsets[positions + 1] - offsets[positions]
            examples = order[_ranges(offsets[positions], sizes)]
            parts.append(materialize(self.table, plan, examples, self.seq_len, self.cls_id,
                                     self.sep_id, self.pad_id))
            rows.extend(np.split(np.arange(count, count + len(examples)), np.cumsum(sizes)[:-1]))
            count += len(examples)
        if parts:
            ids, segs, labels = (np.concatenate(p) for p in zip(*parts, strict=True))
        else:
            ids = segs = np.zeros((0, self.seq_len), np.int32)
            labels = np.zeros(0, np.int32)
        packed = pack_features({"input_ids": ids, "segment_ids": segs,
                                "input_mask": ids != self.pad_id, "next_sentence_labels": labels},
                               rows, self.examples_per_row,
                               per_example_keys=("next_sentence_labels",))
        return tuple(packed[key] for key in PACKED_ARRAYS)


def make_document_dataset(stream: DocumentStream, masking: MaskingConfig, *, seed: int,
                          process_index: int, start_step: int = 0, repeat: bool = True):
    """A ``tf.data.Dataset`` of masked batches (the pair-shard pipeline's BATCH_KEYS; packed
    rows add its PACKED_BATCH_KEYS and next_sentence_labels [b, k], as packed pair shards
    do)."""
    import tensorflow as tf

    tables = make_tables(masking)
    seq_len = stream.seq_len
    if repeat:
        steps = tf.data.Dataset.range(start_step, np.iinfo(np.int64).max)
        limit = -1
    else:
        epoch, position = stream.position(start_step)
        remaining = stream.epoch_size(epoch) - position
        steps = tf.data.Dataset.range(
            start_step, start_step + -(-remaining // stream.global_batch))
        limit = epoch
    base_seed = tf.constant([mix_seed(seed, 3), process_index], tf.int64)
    pad_id = stream.pad_id

    def pair_in_tf(step):
        """[CLS] A [SEP] B [SEP] laid out with TF ops (no Python per batch beyond the row
        lookup); the same layout as :func:`bert_jax.data.pairing.materialize`."""
        a_lo, len_a, b_lo, len_b, labels = tf.numpy_function(
            lambda s: stream.host_pair_rows(s, limit), [step], (tf.int64,) * 4 + (tf.int32,),
            stateful=False)
        a_lo, len_a, b_lo, len_b = (tf.reshape(x, [-1, 1]) for x in (a_lo, len_a, b_lo, len_b))
        column = tf.range(seq_len, dtype=tf.int64)[None, :]
        in_b = column >= len_a + 2
        source = tf.where(in_b, b_lo - 2 - len_a, a_lo - 1) + column
        ids = tf.cast(tf.gather(tokens, tf.clip_by_value(source, 0, num_tokens - 1)), tf.int32)
        end = len_a + len_b + 2  # the last [SEP]; the plan truncated pairs to seq_len
        ids = tf.where((column == len_a + 1) | (column == end), stream.sep_id, ids)
        ids = tf.where(column == 0, stream.cls_id, ids)
        ids = tf.where(column > end, pad_id, ids)
        segs = tf.cast(in_b & (column <= end), tf.int32)
        return (step, tf.ensure_shape(ids, [None, seq_len]),
                tf.ensure_shape(segs, [None, seq_len]), tf.ensure_shape(labels, [None]))

    def pair(step):
        ids, segs, labels = tf.numpy_function(
            lambda s: stream.host_batch(s, limit), [step], (tf.int32, tf.int32, tf.int32),
            stateful=False)
        return (step, tf.ensure_shape(ids, [None, seq_len]),
                tf.ensure_shape(segs, [None, seq_len]), tf.ensure_shape(labels, [None]))

    def pack(step):
        """Packed rows of whole examples, laid out in numpy."""
        arrays = tf.numpy_function(
            lambda s: stream.host_packed_batch(s, limit), [step],
            (tf.int32,) * (len(PACKED_ARRAYS) - 1) + (tf.float32,), stateful=False)
        k = stream.examples_per_row
        a = {key: tf.ensure_shape(value, [None, seq_len if key in (
            "input_ids", "segment_ids", "example_ids", "position_ids") else k])
            for key, value in zip(PACKED_ARRAYS, arrays, strict=True)}
        packing = {"example_ids": a["example_ids"], "position_ids": a["position_ids"],
                   "cls_positions": a["cls_positions"],
                   "next_sentence_weights": a["example_slots"]}
        return step, a["input_ids"], a["segment_ids"], a["next_sentence_labels"], packing

    def mask(step, ids, segs, labels, packing=None):
        batch_seed = tf.random.experimental.stateless_fold_in(base_seed, step, alg="philox")
        # Specials ([CLS], [SEP]) and padding are never chosen, and whole words and spans
        # start afresh at each example (example_ids): every masked unit of a packed row lies
        # inside one example.
        masked, positions, lm_ids, weights = mask_batch(
            ids, batch_seed, masking, tables, None, (packing or {}).get("example_ids"))
        return {"input_ids": masked,
                "input_mask": tf.cast(ids != pad_id, tf.int32),
                "segment_ids": segs,
                "masked_lm_positions": positions,
                "masked_lm_ids": lm_ids,
                "masked_lm_weights": weights,
                "next_sentence_labels": labels,
                **(packing or {})}

    # Pairs are laid out with TF ops (parallel, no GIL); examples whose number of pieces
    # varies, and packed rows, in numpy. Masking is a separate parallel stage.
    if stream.examples_per_row:
        ds = steps.map(pack, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    elif stream.pairing in ("nsp", "sop"):
        tokens = tf.constant(stream.table.tokens)
        num_tokens = int(stream.table.tokens.shape[0])
        ds = steps.map(pair_in_tf, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    else:
        ds = steps.map(pair, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.prefetch(8)
    ds = ds.map(mask, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if not repeat:
        ds = ds.filter(lambda b: tf.shape(b["input_ids"])[0] > 0)
    ds = ds.prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.deterministic = True
    return ds.with_options(options)


class DocumentPretrainingIterator(Iterator[dict[str, np.ndarray]]):
    """Numpy batches of :func:`make_document_dataset` with a resumable position.

    ``state()`` holds the step, the epoch and position of the next global batch, and the
    pipeline's identity; ``DocumentPretrainingIterator(table, ..., state=s)`` continues exactly
    there (another ``process_count`` with the same global batch included). ``examples_per_row``
    > 0 packs up to that many examples into each row (positions count rows; module doc).
    """

    def __init__(self, table: DocumentTable, *, per_host_batch_size: int, seq_len: int,
                 max_predictions_per_seq: int, vocab_size: int, special_ids, mask_id: int,
                 cls_id: int, sep_id: int, pad_id: int, pairing: str = "nsp",
                 short_seq_prob: float = 0.1, word_start_mask: np.ndarray | None = None,
                 mask: MaskSettings = MaskSettings(), seed: int = 0, process_index: int = 0,
                 process_count: int = 1, start_step: int = 0, repeat: bool = True,
                 state: dict | None = None, examples_per_row: int = 0):
        self._identity_fields = {"seed": seed, "process_index": process_index,
                                 "process_count": process_count,
                                 "per_host_batch_size": per_host_batch_size,
                                 "pairing": pairing, "examples_per_row": examples_per_row}
        epoch, position = 0, 0
        if state is not None:
            self._check_state(state)
            start_step = int(state["step"])
            if "epoch" in state:
                epoch, position = int(state["epoch"]), int(state["position"])
        anchor_step = start_step if state is not None and "epoch" in state else 0
        self.stream = DocumentStream(
            table, pairing=pairing, seq_len=seq_len, short_seq_prob=short_seq_prob, seed=seed,
            cls_id=cls_id, sep_id=sep_id, pad_id=pad_id,
            per_host_batch_size=per_host_batch_size, process_index=process_index,
            process_count=process_count, start_step=anchor_step, start_epoch=epoch,
            start_position=position, examples_per_row=examples_per_row)
        # Knowledge units exist only in pair shards (annotated on finished examples).
        if mask.masking == "knowledge":
            raise BertJaxError("data.masking='knowledge' reads the unit_ids of pair shards "
                               "(create-pretraining-data --format pairs --knowledge-units); "
                               "document shards have none")
        masking = mask.masking_config(vocab_size=vocab_size, special_ids=special_ids,
                                      mask_id=mask_id, max_predictions=max_predictions_per_seq,
                                      word_start_mask=word_start_mask)
        self.step = start_step
        self._dataset = make_document_dataset(self.stream, masking, seed=seed,
                                              process_index=process_index,
                                              start_step=start_step, repeat=repeat)
        self._iterator = iter(self._dataset.as_numpy_iterator())

    def _check_state(self, state: dict) -> None:
        # States saved before a field existed: the pairing configured now, unpacked rows.
        saved = {"pairing": self._identity_fields["pairing"], "examples_per_row": 0, **state}
        diff = {k: (saved.get(k), v) for k, v in self._identity_fields.items()
                if saved.get(k) != v}
        if diff or "step" not in state:
            raise BertJaxError(f"data iterator state {state} does not match this pipeline "
                               f"(saved vs now: {diff})")

    def state(self) -> dict[str, Any]:
        """The position to resume from: the next batch to be returned."""
        epoch, position = self.stream.position(self.step)
        return {"step": self.step, "epoch": epoch, "position": position,
                **self._identity_fields}

    def __next__(self) -> dict[str, np.ndarray]:
        batch = next(self._iterator)
        self.step += 1
        return batch


def open_document_iterator(meta, files, *, per_host_batch_size: int,
                           max_predictions_per_seq: int, seq_len: int | None,
                           state: dict | None, pairing: str, short_seq_prob: float,
                           mask: MaskSettings, word_start_mask: np.ndarray | None, seed: int,
                           process_index: int, process_count: int, examples_per_row: int,
                           repeat: bool = True) -> DocumentPretrainingIterator:
    """The iterator over document shards ``files`` described by ``meta`` (metadata.json);
    ``repeat=False``: one epoch, its last batch possibly short."""
    from bert_jax.data.documents import load_document_table

    if not seq_len:
        raise BertJaxError(f"{meta.directory}: document shards need seq_len "
                           "(config.data.max_seq_length)")
    special = meta.special_ids
    table = load_document_table(files, meta.vocab_size)
    return DocumentPretrainingIterator(
        table, state=state, per_host_batch_size=per_host_batch_size, seq_len=seq_len,
        max_predictions_per_seq=max_predictions_per_seq, vocab_size=meta.vocab_size,
        special_ids=[special[k] for k in ("pad", "unk", "cls", "sep", "mask")],
        mask_id=special["mask"], cls_id=special["cls"], sep_id=special["sep"],
        pad_id=special["pad"], pairing=pairing, short_seq_prob=short_seq_prob, mask=mask,
        word_start_mask=word_start_mask, seed=seed, process_index=process_index,
        process_count=process_count, examples_per_row=examples_per_row, repeat=repeat)
