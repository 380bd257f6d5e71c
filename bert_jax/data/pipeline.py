"""tf.data pretraining pipeline: host split, per-epoch shuffle, batching, dynamic masking.

The stream a host sees is a deterministic function of (seed, process index/count, position):

* Host split: with at least as many shard files as hosts, host ``i`` reads files
  ``i, i + n, ...`` (sorted); otherwise every host reads all files in order and keeps examples
  ``i, i + n, ...``. Either way the hosts' examples are disjoint and together complete.
* Epoch ``e`` permutes the host's files with a stateless shuffle keyed by (seed, e), interleaves
  them and shuffles examples in a buffer seeded by (seed, e). Batches run across epoch ends, so
  nothing is dropped while repeating.
* Batch ``step`` (counted per host from 0) is masked with a stateless seed
  ``fold_in(fold_in((seed, process_index), step))``: each epoch masks differently, and the same
  (seed, step) always gives the same batch.
* Resuming at ``start_step`` skips ``start_step * batch`` examples (whole epochs by arithmetic,
  the rest by reading records, before parsing), so a resumed run continues exactly.

Batches are parsed after batching with one ``parse_example`` over fixed-length features and
masked with vectorised ops (:mod:`bert_jax.data.masking`), ``AUTOTUNE`` parallel and prefetched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from bert_jax import storage
from bert_jax.data import records
from bert_jax.data.mask_settings import MaskSettings
from bert_jax.data.masking import MaskingConfig, make_tables, mask_batch, mix_seed
from bert_jax.data.metadata import METADATA_JSON, PretrainingDataConfig, load_metadata
from bert_jax.errors import BertJaxError

BATCH_KEYS = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
              "masked_lm_weights", "next_sentence_labels")
# Packed rows (``create-pretraining-data --pack``) add these; next_sentence_labels is then
# [B, k] and next_sentence_weights marks the filled example slots.
PACKED_BATCH_KEYS = ("example_ids", "position_ids", "cls_positions", "next_sentence_weights")


@dataclasses.dataclass(frozen=True)
class HostFiles:
    """What one host reads: files, and whether it keeps every ``count``-th example of them."""

    files: list[str]
    example_stride: int  # 1 = all examples of its files; n = every n-th example
    example_offset: int
    num_examples: int  # per epoch


def split_for_host(files: Sequence[str], counts: Sequence[int], process_index: int,
                   process_count: int) -> HostFiles:
    """Disjoint, complete assignment of shard files (or examples) to hosts."""
    if not 0 <= process_index < process_count:
        raise BertJaxError(f"process_index {process_index} not in [0, {process_count})")
    order = sorted(range(len(files)), key=lambda i: files[i])
    files = [files[i] for i in order]
    counts = [counts[i] for i in order]
    if len(files) >= process_count:
        mine = list(range(process_index, len(files), process_count))
        return HostFiles([files[i] for i in mine], 1, 0, sum(counts[i] for i in mine))
    total = sum(counts)
    return HostFiles(files, process_count, process_index,
                     max(0, (total - process_index + process_count - 1) // process_count))


def resolve_files(pattern_or_files: str | Sequence[str]) -> tuple[list[str], list[int], int]:
    """Files, example counts and stored sequence length, from metadata.json where present.

    Accepts a data directory (its train split), a glob pattern or a list of files. Files not
    listed in a metadata.json beside them are counted by reading them once.
    """
    if isinstance(pattern_or_files, str):
        if storage.isdir(pattern_or_files):
            meta = load_metadata(pattern_or_files)
            return meta.train_files, meta.train_examples, meta.max_seq_length
        files = sorted(storage.glob(pattern_or_files))
        if not files:
            raise BertJaxError(f"{pattern_or_files}: no files match")
    else:
        files = [str(f) for f in pattern_or_files]
        missing = [f for f in files if not storage.exists(f)]
        if missing or not files:
            raise BertJaxError(f"pretraining files: {missing[0] if missing else 'none given'} "
                               "not found")
    known: dict[str, tuple[int, int]] = {}
    for directory in sorted({storage.dirname(storage.abspath(f)) for f in files}):
        if storage.exists(storage.join(directory, METADATA_JSON)):
            meta = load_metadata(directory)
            for split in ("train", "eval"):
                for f, c in zip(*meta.files(split), strict=True):
                    known[storage.abspath(f)] = (c, meta.max_seq_length)
    counts, lengths = [], set()
    for f in files:
        count, length = known.get(storage.abspath(f)) or _scan(f)
        counts.append(count)
        lengths.add(length)
    if len(lengths - {0}) > 1:
        raise BertJaxError(f"pretraining files have different sequence lengths {sorted(lengths)}")
    return files, counts, max(lengths)


def _scan(path: str) -> tuple[int, int]:
    """(number of records, length of input_ids) of a TFRecord file without metadata."""
    import tensorflow as tf

    count, length = 0, 0
    for record in records.file_records(path):
        if count == 0:
            example = tf.train.Example.FromString(record.numpy())
            length = len(example.features.feature["input_ids"].int64_list.value)
        count += 1
    return count, length


def make_pretraining_dataset(pattern_or_files: str | Sequence[str], *, per_host_batch_size: int,
                             seq_len: int, max_predictions_per_seq: int, vocab_size: int,
                             special_ids: Sequence[int], mask_id: int,
                             word_start_mask: np.ndarray | None = None,
                             mask: MaskSettings = MaskSettings(), seed: int = 0,
                             process_index: int = 0, process_count: int = 1,
                             shuffle_buffer: int = 10_000, start_step: int = 0,
                             repeat: bool = True, cycle_length: int = 8,
                             pad_id: int | None = None, examples_per_row: int = 0):
    """A ``tf.data.Dataset`` of masked pretraining batches for this host (see module doc).

    Each element is a dict of BATCH_KEYS: int32 [B, seq_len] ids/mask/segments, int32 [B, P]
    positions/ids, float32 [B, P] weights, int32 [B] next-sentence labels. With ``repeat=False``
    the stream is one epoch and the last batch may be smaller. ``pad_id`` defaults to
    ``special_ids[0]`` ([PAD] comes first in BERT's special-token order). ``mask`` says how
    each batch is masked; ``knowledge`` reads the examples' ``unit_ids`` feature.
    ``examples_per_row`` > 0 reads packed rows of that many example slots and adds
    ``PACKED_BATCH_KEYS`` (the masking is per token, so every masked position lies inside an
    example; knowledge units are numbered across a row, so each lies inside one example).
    """
    import tensorflow as tf

    files, counts, stored_len = resolve_files(pattern_or_files)
    if seq_len < stored_len:
        raise BertJaxError(f"seq_len {seq_len} is shorter than the stored examples "
                           f"({stored_len} tokens); recreate the data or raise seq_len")
    if per_host_batch_size < 1:
        raise BertJaxError(f"per_host_batch_size {per_host_batch_size}: must be >= 1")
    masking = mask.masking_config(vocab_size=vocab_size, special_ids=special_ids,
                                  mask_id=mask_id, max_predictions=max_predictions_per_seq,
                                  word_start_mask=word_start_mask)
    tables = make_tables(masking)
    host = split_for_host(files, counts, process_index, process_count)
    if host.num_examples == 0:
        raise BertJaxError(f"host {process_index} of {process_count} has no examples "
                           f"({sum(counts)} examples in {len(files)} files)")
    start_epoch, skip = divmod(start_step * per_host_batch_size, host.num_examples)
    if not repeat and start_epoch > 0:
        raise BertJaxError(f"start_step {start_step} is past the end of the single epoch")

    last_epoch = np.iinfo(np.int64).max if repeat else 1
    epoch_examples = _epoch_examples(host, seed=seed, shuffle_buffer=shuffle_buffer,
                                     cycle_length=cycle_length)
    ds = tf.data.Dataset.range(start_epoch, last_epoch).flat_map(epoch_examples).skip(skip)
    ds = ds.batch(per_host_batch_size, drop_remainder=repeat)
    ds = ds.enumerate(start=start_step)
    if pad_id is None:
        pad_id = masking.special_ids[0] if masking.special_ids else 0
    parse_and_mask = _parse_and_mask(masking, tables, stored_len=stored_len, seq_len=seq_len,
                                     pad_id=pad_id, examples_per_row=examples_per_row,
                                     base_seed=(mix_seed(seed, 3), process_index))
    ds = ds.map(parse_and_mask, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.deterministic = True
    return ds.with_options(options)


def _epoch_examples(host, *, seed: int, shuffle_buffer: int, cycle_length: int):
    """``epoch -> dataset`` of this host's serialized examples in that epoch's order: its
    files shuffled and interleaved, then the examples shuffled (fewer files than hosts: a
    fixed split of the examples)."""
    import tensorflow as tf

    host_files = tf.constant(host.files)
    cycle = min(cycle_length, len(host.files))

    def epoch_examples(epoch):
        if host.example_stride > 1:  # fewer files than hosts: a fixed example split
            ds = records.records(host.files).shard(host.example_stride,
                                                   host.example_offset)
        else:
            order = tf.random.experimental.stateless_shuffle(
                host_files, tf.stack([tf.constant(mix_seed(seed, 1), tf.int64), epoch]),
                alg="philox")
            ds = tf.data.Dataset.from_tensor_slices(order).interleave(
                records.reader_for(host.files), cycle_length=cycle, block_length=1,
                num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        if shuffle_buffer > 1:
            ds = ds.shuffle(shuffle_buffer, seed=tf.constant(mix_seed(seed, 2), tf.int64) + epoch,
                            reshuffle_each_iteration=False)
        return ds

    return epoch_examples


def _parse_and_mask(masking: MaskingConfig, tables, *, stored_len: int, seq_len: int, pad_id: int,
                    examples_per_row: int, base_seed: tuple[int, int]):
    """``(step, serialized examples) -> batch``: parses a batch of stored examples, pads them
    to ``seq_len`` and masks them with the step's own seed."""
    import tensorflow as tf

    base_seed = tf.constant(base_seed, tf.int64)
    features = {"input_ids": tf.io.FixedLenFeature([stored_len], tf.int64),
                "segment_ids": tf.io.FixedLenFeature([stored_len], tf.int64),
                "next_sentence_label": tf.io.FixedLenFeature([1], tf.int64)}
    if masking.knowledge:
        features["unit_ids"] = tf.io.FixedLenFeature([stored_len], tf.int64)
    k = examples_per_row
    if k:
        features.update({name: tf.io.FixedLenFeature([stored_len], tf.int64)
                         for name in ("example_ids", "position_ids")})
        features.update({name: tf.io.FixedLenFeature([k], tf.int64)
                         for name in ("cls_positions", "next_sentence_label", "example_slots")})
    per_token_names = (["unit_ids"] if masking.knowledge else []) \
        + (["example_ids", "position_ids"] if k else [])

    def parse_and_mask(step, serialized):
        parsed = tf.io.parse_example(serialized, features)
        input_ids = tf.cast(parsed["input_ids"], tf.int32)
        segment_ids = tf.cast(parsed["segment_ids"], tf.int32)
        if seq_len > stored_len:
            extra = [[0, 0], [0, seq_len - stored_len]]
            input_ids = tf.pad(input_ids, extra, constant_values=pad_id)
            segment_ids = tf.pad(segment_ids, extra)
        per_token = {}  # int32 [B, seq_len] features besides ids and segments
        for name in per_token_names:
            value = tf.cast(parsed[name], tf.int32)
            per_token[name] = tf.pad(value, extra) if seq_len > stored_len else value
        input_ids = tf.ensure_shape(input_ids, [None, seq_len])
        batch_seed = tf.random.experimental.stateless_fold_in(base_seed, step, alg="philox")
        masked, positions, ids, weights = mask_batch(
            input_ids, batch_seed, masking, tables, per_token.get("unit_ids"),
            per_token.get("example_ids"))
        batch = {"input_ids": masked,
                 "input_mask": tf.cast(input_ids != pad_id, tf.int32),
                 "segment_ids": segment_ids,
                 "masked_lm_positions": positions,
                 "masked_lm_ids": ids,
                 "masked_lm_weights": weights,
                 "next_sentence_labels": tf.cast(parsed["next_sentence_label"][:, 0], tf.int32)}
        if k:
            batch["example_ids"] = per_token["example_ids"]
            batch["position_ids"] = per_token["position_ids"]
            batch["cls_positions"] = tf.cast(parsed["cls_positions"], tf.int32)
            batch["next_sentence_labels"] = tf.cast(parsed["next_sentence_label"], tf.int32)
            batch["next_sentence_weights"] = tf.cast(parsed["example_slots"], tf.float32)
        return batch

    return parse_and_mask


def check_pairing(meta: PretrainingDataConfig, pairing: str) -> None:
    """BertJaxError unless ``pairing`` fits the shards' format (static pairing reads pair
    shards, dynamic pairing document shards)."""
    from bert_jax.data.pairing import PAIRINGS

    path = storage.join(meta.directory, METADATA_JSON)
    if pairing not in ("static", *PAIRINGS):
        raise BertJaxError(f"pairing {pairing!r}: expected 'static' or one of {PAIRINGS}")
    if meta.format == "documents" and pairing == "static":
        raise BertJaxError(f"{path}: document shards are paired in the pipeline; choose a "
                           f"pairing ({', '.join(PAIRINGS)}) instead of 'static'")
    if meta.format != "documents" and pairing != "static":
        raise BertJaxError(f"{path}: these shards hold finished {meta.mode} pairs; pairing "
                           f"{pairing!r} needs document shards (create-pretraining-data "
                           "--format documents), or use pairing 'static'")


def check_training_data(meta: PretrainingDataConfig, objective: str, pairing: str,
                        max_seq_length: int) -> None:
    """BertJaxError unless the shards, ``pairing`` and the training ``objective`` (nsp, sop,
    mlm) fit together: nsp/sop need examples labelled for that task."""
    check_pairing(meta, pairing)
    directory = meta.directory
    made = meta.mode if meta.format == "pairs" else pairing
    if objective in ("nsp", "sop") and made != objective:
        what = f"data was created in mode {made!r}" if meta.format == "pairs" \
            else f"data.pairing={made!r}"
        raise BertJaxError(f"{directory}: {what} but objective={objective!r} needs mode "
                           f"{objective!r}")
    if meta.format == "pairs" and meta.max_seq_length != max_seq_length:
        raise BertJaxError(f"{directory}: examples have max_seq_length {meta.max_seq_length}, "
                           f"config.data.max_seq_length is {max_seq_length}")


def examples_per_row(meta: PretrainingDataConfig, requested: int = 0) -> int:
    """Example slots per row of ``meta``'s data given ``requested`` (``examples_per_row``, the
    config's ``data.max_examples_per_row``): document shards pack at training time
    (``requested``; 0: one example a row); pair shards are packed, or not, when created
    (``create-pretraining-data --pack``, their metadata), and a nonzero ``requested`` must
    match them."""
    if meta.format == "documents":
        return requested
    stored = int(meta.raw["max_examples_per_row"]) if meta.raw.get("packed") else 0
    if requested and requested != stored:
        raise BertJaxError(
            f"{storage.join(meta.directory, METADATA_JSON)}: pair shards are packed when "
            f"created (create-pretraining-data --pack; these hold "
            f"{f'{stored} examples a row' if stored else 'one example a row'}); "
            f"examples_per_row (data.max_examples_per_row) = {requested} packs document "
            "shards only")
    return stored


# from_data_dir's parameter of the same name hides the function there.
_checked_examples_per_row = examples_per_row


class PretrainingIterator(Iterator[dict[str, np.ndarray]]):
    """Numpy batches from :func:`make_pretraining_dataset`, with a resumable position.

    ``state()`` is a small JSON-serializable dict; ``PretrainingIterator(..., state=s)`` with the
    same arguments continues exactly where the saved iterator stood.
    """

    def __init__(self, pattern_or_files: str | Sequence[str], *, state: dict | None = None,
                 **dataset_kwargs: Any):
        self._source = pattern_or_files
        # The shards read, to name the damaged or missing one when tf.data fails mid-run.
        self.files = [pattern_or_files] if isinstance(pattern_or_files, str) else \
            list(pattern_or_files)
        self._kwargs = dict(dataset_kwargs)
        self._kwargs.setdefault("start_step", 0)
        if state is not None:
            self._check_state(state)
            self._kwargs["start_step"] = int(state["step"])
        self.step = self._kwargs["start_step"]
        self._dataset = make_pretraining_dataset(pattern_or_files, **self._kwargs)
        self._iterator = iter(self._dataset.as_numpy_iterator())

    @classmethod
    def from_data_dir(cls, data_dir: str, *, per_host_batch_size: int,
                      max_predictions_per_seq: int, seq_len: int | None = None,
                      tokenizer=None, split: str = "train", state: dict | None = None,
                      pairing: str | None = None, short_seq_prob: float = 0.1,
                      mask: MaskSettings = MaskSettings(), seed: int = 0,
                      process_index: int = 0, process_count: int = 1,
                      shuffle_buffer: int = 10_000, examples_per_row: int = 0,
                      repeat: bool = True):
        """Reads metadata.json (checking the tokenizer if given) and fills in the vocabulary.

        ``pairing="static"`` reads pair shards; ``nsp``, ``sop``, ``full_sentences`` or
        ``doc_sentences`` pair document shards afresh every epoch (a
        :class:`~bert_jax.data.dynamic_pipeline.DocumentPretrainingIterator`); ``None``: static
        for pair shards, nsp for document shards. ``examples_per_row`` > 0 packs document
        shards' examples into rows of that many slots; pair shards are packed (or not) when
        created, and a nonzero value must match their metadata. ``shuffle_buffer`` shuffles
        pair shards' examples (document shards' epochs are whole permutations).
        ``repeat=False`` reads one epoch to its end (the last batch possibly short)."""
        meta: PretrainingDataConfig = load_metadata(data_dir)
        if pairing is None:
            pairing = "nsp" if meta.format == "documents" else "static"
        check_pairing(meta, pairing)
        word_start_mask = None
        if tokenizer is not None:
            meta.check_tokenizer(tokenizer)
            if mask.needs_words:
                word_start_mask = tokenizer.word_start_mask()
        if mask.masking == "knowledge" and not meta.raw.get("knowledge_units"):
            raise BertJaxError(f"{data_dir}: data.masking='knowledge' needs examples with unit "
                               "annotations (create them with `bert-jax create-pretraining-data "
                               "--knowledge-units`)")
        special = meta.special_ids
        files, _ = meta.files(split)
        if not files:
            raise BertJaxError(f"{data_dir}: no {split} shards")
        if meta.format == "documents":
            from bert_jax.data.dynamic_pipeline import open_document_iterator

            return open_document_iterator(
                meta, files, state=state, per_host_batch_size=per_host_batch_size,
                max_predictions_per_seq=max_predictions_per_seq, seq_len=seq_len,
                pairing=pairing, short_seq_prob=short_seq_prob, mask=mask,
                word_start_mask=word_start_mask, seed=seed, process_index=process_index,
                process_count=process_count, examples_per_row=examples_per_row, repeat=repeat)
        return cls(files, state=state, per_host_batch_size=per_host_batch_size,
                   seq_len=seq_len or meta.max_seq_length,
                   max_predictions_per_seq=max_predictions_per_seq,
                   vocab_size=meta.vocab_size, mask_id=special["mask"], pad_id=special["pad"],
                   special_ids=[special[k] for k in ("pad", "unk", "cls", "sep", "mask")],
                   word_start_mask=word_start_mask, mask=mask, seed=seed,
                   process_index=process_index, process_count=process_count,
                   shuffle_buffer=shuffle_buffer, repeat=repeat,
                   examples_per_row=_checked_examples_per_row(meta, examples_per_row))

    def _identity(self) -> dict[str, Any]:
        k = self._kwargs
        return {"seed": k.get("seed", 0), "process_index": k.get("process_index", 0),
                "process_count": k.get("process_count", 1),
                "per_host_batch_size": k["per_host_batch_size"]}

    def _check_state(self, state: dict) -> None:
        mine = self._identity()
        diff = {key: (state.get(key), v) for key, v in mine.items() if state.get(key) != v}
        if diff or "step" not in state:
            raise BertJaxError(f"data iterator state {state} does not match this pipeline "
                               f"(saved vs now: {diff})")

    def state(self) -> dict[str, Any]:
        """The position to resume from: the next batch to be returned."""
        return {"step": self.step, **self._identity()}

    def __next__(self) -> dict[str, np.ndarray]:
        batch = next(self._iterator)
        self.step += 1
        return batch
