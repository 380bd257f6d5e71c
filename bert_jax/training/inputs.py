"""Per-process pretraining batches for the loop, from one of three sources.

``data.source="auto"`` (the default) takes the source from what ``data.directory`` holds
(:func:`resolve_source`); synthetic data is used only when asked for by name.

* ``tfrecord``: ``bert_jax.data.pipeline`` (tf.data; every batch masked afresh, i.e.
  RoBERTa's dynamic masking) over the output of
  ``bert-jax create-pretraining-data``;
* ``materialized``: ``bert_jax.data.materialize.MaterializedBatches`` (pre-masked numpy
  batches, no tensorflow; for benchmarks and exact replays);
* ``synthetic``: random token ids from a fixed seed (tests, benchmarks, smoke runs).

Every source yields this process's rows as numpy dicts and has a JSON-serializable
``state()`` from which it is rebuilt at exactly the next batch after a restart.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from bert_jax import storage
from bert_jax.data.mask_settings import MaskSettings
from bert_jax.errors import BertJaxError

MASK_ID = 4  # BERT's special ids: [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4
FIRST_REGULAR_ID = 5


class SyntheticBatches:
    """Deterministic random MLM/NSP batches: batch ``n`` depends only on (seed, n, process).

    Each sequence has a random length, [CLS]/[SEP] framing, two segments, and
    ``max_predictions`` (or 15% of its length, if fewer) masked positions whose original ids
    are the labels.
    """

    def __init__(self, batch_size: int, seq_len: int, max_predictions: int, vocab_size: int,
                 *, seed: int = 0, process_index: int = 0, step: int = 0):
        if vocab_size <= FIRST_REGULAR_ID:
            raise BertJaxError(f"synthetic data needs vocab_size > {FIRST_REGULAR_ID}")
        self.batch_size, self.seq_len = batch_size, seq_len
        self.max_predictions, self.vocab_size = max_predictions, vocab_size
        self.seed, self.process_index, self.step = seed, process_index, step

    def state(self) -> dict[str, Any]:
        return {"source": "synthetic", "step": self.step}

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([self.seed, self.process_index, self.step])
        self.step += 1
        b, s, p = self.batch_size, self.seq_len, self.max_predictions
        lengths = rng.integers(max(8, s // 2), s + 1, size=b)
        ids = rng.integers(FIRST_REGULAR_ID, self.vocab_size, size=(b, s)).astype(np.int32)
        positions = np.arange(s)[None, :]
        mask = (positions < lengths[:, None]).astype(np.int32)
        split = lengths // 2
        segment_ids = ((positions >= split[:, None]) & (mask == 1)).astype(np.int32)
        ids[:, 0] = 2
        ids[np.arange(b), lengths - 1] = 3
        ids[np.arange(b), split] = 3
        ids = ids * mask
        mlm_positions = np.zeros((b, p), np.int32)
        mlm_ids = np.zeros((b, p), np.int32)
        mlm_weights = np.zeros((b, p), np.float32)
        for row in range(b):
            count = min(p, max(1, int(round(MaskSettings.mask_rate * lengths[row]))))
            chosen = np.sort(rng.choice(np.arange(1, lengths[row] - 1), count, replace=False))
            mlm_positions[row, :count] = chosen
            mlm_ids[row, :count] = ids[row, chosen]
            mlm_weights[row, :count] = 1.0
            ids[row, chosen] = MASK_ID
        return {"input_ids": ids, "input_mask": mask, "segment_ids": segment_ids,
                "masked_lm_positions": mlm_positions, "masked_lm_ids": mlm_ids,
                "masked_lm_weights": mlm_weights,
                "next_sentence_labels": rng.integers(0, 2, size=b).astype(np.int32)}


def resolve_source(data) -> str:
    """The data source a run uses: ``data.source`` when set, else what ``data.directory``
    holds (``metadata.json``: TFRecord shards; ``manifest.json``: materialized batches).

    Synthetic data is never a fallback: it must be named, and then no directory may be given
    (a directory that would be ignored is an error, not a silent switch to random ids)."""
    from bert_jax.data.materialize import MANIFEST_JSON
    from bert_jax.data.metadata import METADATA_JSON

    source, directory = data.source, data.directory
    if source == "synthetic":
        if directory:
            raise BertJaxError(
                f"data.source='synthetic' trains on random token ids and would ignore "
                f"data.directory={directory!r}; drop --config.data.source=synthetic (or set "
                "it to auto) to train on that directory")
        return source
    if source not in ("auto", "tfrecord", "materialized"):
        raise BertJaxError(f"data.source={source!r}: expected auto, tfrecord, materialized or "
                           "synthetic")
    if not directory:
        raise BertJaxError(
            "no training data: set --config.data.directory=DIR (the output of `bert-jax "
            "create-pretraining-data` or `bert-jax materialize-batches`), or "
            "--config.data.source=synthetic to train on random token ids (smoke tests only)")
    if not storage.isdir(directory):
        raise BertJaxError(f"data.directory={directory!r}: no such directory")
    found = [kind for kind, marker in (("tfrecord", METADATA_JSON),
                                       ("materialized", MANIFEST_JSON))
             if storage.exists(storage.join(directory, marker))]
    if not found:
        raise BertJaxError(
            f"data.directory={directory!r} holds neither {METADATA_JSON} (TFRecord shards from "
            f"`bert-jax create-pretraining-data`) nor {MANIFEST_JSON} (batches from "
            "`bert-jax materialize-batches`)")
    if source == "auto":
        return found[0]
    if source not in found:
        marker = METADATA_JSON if found[0] == "tfrecord" else MANIFEST_JSON
        raise BertJaxError(f"data.source={source!r}, but data.directory={directory!r} holds "
                           f"{found[0]} data ({marker}); drop --config.data.source to use "
                           "what is there")
    return source


def describe_source(data) -> str:
    """One line for the log saying exactly what the run trains on."""
    if data.source == "synthetic":
        return ("data: SYNTHETIC random token ids (data.source='synthetic'); the model learns "
                "nothing about language. Point --config.data.directory at real data instead.")
    kind = {"tfrecord": "TFRecord shards", "materialized": "materialized batches"}[data.source]
    return f"data: {kind} from {storage.abspath(data.directory)}"


def examples_per_row(config) -> int:
    """Example slots per row of packed training data, 0 for unpacked data: pair shards
    written with ``create-pretraining-data --pack`` (their metadata says how many), batches
    materialized from them (their manifest), or document shards with
    ``data.max_examples_per_row`` > 0. Materialized evaluation batches
    (``data.eval_directory``) must be packed alike."""
    from bert_jax.data import materialize, pipeline
    from bert_jax.data.metadata import METADATA_JSON, load_metadata

    data = config.data
    requested = int(data.get("max_examples_per_row", 0))
    has_metadata = bool(data.directory) and storage.exists(
        storage.join(data.directory, METADATA_JSON))
    has_manifest = bool(data.directory) and storage.exists(
        storage.join(data.directory, materialize.MANIFEST_JSON))
    materialized = data.source == "materialized" or (
        data.source == "auto" and has_manifest and not has_metadata)
    if data.source == "synthetic" or materialized or not has_metadata:
        if requested:
            raise BertJaxError(f"data.max_examples_per_row={requested} packs document shards "
                               f"(TFRecord data.directory), not data.source={data.source!r}")
        if not (materialized and has_manifest):
            return 0  # resolve_source names a missing folder
        k = materialize.examples_per_row(materialize.load_manifest(data.directory))
        eval_dir = data.get("eval_directory")
        if eval_dir and storage.exists(storage.join(eval_dir, materialize.MANIFEST_JSON)):
            eval_k = materialize.examples_per_row(materialize.load_manifest(eval_dir))
            if eval_k != k:
                raise BertJaxError(
                    f"data.eval_directory={eval_dir!r} holds batches with {eval_k} example "
                    f"slots per row, data.directory={data.directory!r} {k} (0: unpacked); "
                    "materialize both from the same kind of data")
        return k
    k = pipeline.examples_per_row(load_metadata(data.directory), requested)
    if k and data.source not in ("auto", "tfrecord"):
        raise BertJaxError(f"{data.directory}: packed rows are read from TFRecord shards "
                           f"(data.source=tfrecord), not data.source={data.source!r}")
    return k


def check_vocab(config, model_vocab_size: int, tokenizer) -> None:
    """The model's vocabulary must be the tokenizer's: a mismatch trains rows no id reaches
    (or ids with no row) and surfaces much later, at fill-mask or fine-tuning."""
    if tokenizer is None or tokenizer.vocab_size == model_vocab_size:
        return
    origin = ("--config.model.vocab_size" if config.model.vocab_size is not None
              else f"the {config.model.preset!r} preset")
    raise BertJaxError(
        f"data.tokenizer={config.data.tokenizer!r} has {tokenizer.vocab_size} entries, but the "
        f"model's vocab_size is {model_vocab_size} (from {origin}); set "
        f"--config.model.vocab_size={tokenizer.vocab_size} or use the matching tokenizer")


def check_eval_data(config) -> None:
    """Evaluation needs held-out data; say so before training rather than after it."""
    if config.eval_steps <= 0 or config.data.source != "tfrecord":
        return  # synthetic and materialized sources always have evaluation batches
    from bert_jax.data.metadata import load_metadata

    meta = load_metadata(config.data.directory)
    if not meta.eval_files or sum(meta.eval_examples) == 0:
        raise BertJaxError(
            f"{config.data.directory}: no held-out split (metadata.json lists no eval "
            "shards), so evaluation cannot run; recreate the data with `bert-jax "
            "create-pretraining-data ... --holdout-fraction 0.05`, or train without "
            "evaluation with --config.eval_steps=0")


def make_batches(config, split: str, *, batch_size: int, vocab_size: int, process_index: int,
                 process_count: int, state: dict[str, Any] | None = None, tokenizer=None):
    """The configured source for ``split`` (train | eval), this process's ``batch_size``
    rows per batch, resumed from ``state`` when given. ``tokenizer`` (tfrecord) is checked
    against the data and supplies word starts for whole-word masking."""
    data = config.data
    if data.source == "auto":
        data.source = resolve_source(data)
    if data.source != "tfrecord" and _masking_mode(data) != "token":
        raise BertJaxError(f"data.masking={_masking_mode(data)!r} masks tfrecord data as it is "
                           f"read; data.source={data.source!r} brings its own masks (set "
                           "data.masking=token)")
    if data.source == "synthetic":
        seed = data.seed + (0 if split == "train" else 1_000_003)
        step = int(state["step"]) if state else 0
        return SyntheticBatches(batch_size, data.max_seq_length, data.max_predictions_per_seq,
                                vocab_size, seed=seed, process_index=process_index, step=step)
    if not data.directory:
        raise BertJaxError(f"data.source={data.source!r} needs --config.data.directory")
    if data.source == "materialized":
        from bert_jax.data.materialize import MaterializedBatches

        step = int(state["step"]) if state else 0
        directory = data.eval_directory if split == "eval" and data.eval_directory \
            else data.directory
        return MaterializedBatches(directory, start_step=step, process_index=process_index,
                                   process_count=process_count,
                                   repeat=data.repeat and split == "train")
    if data.source == "tfrecord":
        from bert_jax.data.pipeline import PretrainingIterator

        return PretrainingIterator.from_data_dir(
            data.directory, per_host_batch_size=batch_size,
            max_predictions_per_seq=data.max_predictions_per_seq, seq_len=data.max_seq_length,
            tokenizer=tokenizer, split=split, state=state, mask=mask_settings(data),
            seed=data.seed + (0 if split == "train" else 1),
            process_index=process_index, process_count=process_count,
            shuffle_buffer=data.shuffle_buffer, pairing=data.pairing,
            short_seq_prob=data.short_seq_prob, examples_per_row=examples_per_row(config))
    raise BertJaxError(f"data.source={data.source!r}: expected tfrecord, materialized or "
                       "synthetic")


def mask_settings(data):
    """The pipeline's MaskSettings of a run's ``data`` section (a key a stored config of an
    older run lacks keeps the pipeline's default)."""
    present = {name: data[key] for name, key in (
        ("span_p", "span_p"), ("max_span", "max_span"),
        ("basic_fraction", "basic_masking_fraction"),
        ("mask_token_fraction", "mask_token_fraction"),
        ("random_token_fraction", "random_token_fraction")) if key in data}
    return MaskSettings(masking=_masking_mode(data), mask_rate=data.masked_lm_prob, **present)


def _masking_mode(data) -> str:
    """``data.masking``, with the older ``whole_word_masking`` switch meaning whole_word."""
    mode = data.get("masking", "token")
    if data.whole_word_masking and mode == "token":
        return "whole_word"
    return mode


class DataWaitInterrupted(Exception):
    """A stop was requested (SIGTERM/SIGINT) while the loop waited for a batch."""


class DataStalled(BertJaxError):
    """No batch arrived within the configured ``data.wait_timeout_s``."""


# tf.data's errors for a shard that is damaged (DataLoss, InvalidArgument), gone (NotFound),
# replaced by a folder (FailedPrecondition) or unreadable (PermissionDenied).
_DATA_ERRORS = ("DataLossError", "InvalidArgumentError", "NotFoundError",
                "FailedPreconditionError", "PermissionDeniedError")


def _shard_problem(path: str) -> str | None:
    """Why ``path`` cannot be read as a TFRecord shard, or None."""
    from bert_jax import storage
    from bert_jax.data.records import iter_records

    try:
        if not storage.exists(path):
            return "missing (deleted while the run read it?)"
        if storage.isdir(path):
            return "is a directory, not a shard"
        for _ in iter_records(path):
            pass
    except ValueError as e:
        return str(e).split(": ", 1)[-1]
    except OSError as e:
        return e.strerror or str(e)
    return None


def data_failure(what: str, error: BaseException, files) -> BertJaxError:
    """One BertJaxError for a reader failure, naming the shard and what is wrong with it: the
    shard the error names, else the first of ``files`` that fails a check (framing and
    checksums)."""
    detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    detail = re.sub(r"\{\{[^}]*\}\}\s*|\s*\[Op:[^\]]*\].*$", "", detail).strip()
    files = list(files or ())
    named = [f for f in files if f in detail]
    for path in named or files:
        problem = _shard_problem(path)
        if problem is not None:
            return BertJaxError(f"the {what} data is damaged: {path}: {problem}")
    return BertJaxError(f"the {what} data is damaged: {detail[:300]}")


class Prefetcher:
    """Reads batches on a background thread, ``depth`` ahead, each paired with the source's
    state *after* it, so a checkpoint at step n records exactly where batch n+1 starts.

    Waiting for a batch never hangs: after ``timeout_s`` seconds (0: no limit) it raises
    :class:`DataStalled`, and when ``interrupted()`` turns true it raises
    :class:`DataWaitInterrupted`."""

    _END = object()
    _POLL_S = 0.2

    def __init__(self, source, transform, depth: int = 2, *, timeout_s: float = 0.0,
                 interrupted: Callable[[], bool] | None = None, what: str = "training"):
        self._source, self._transform = source, transform
        self.timeout_s, self.interrupted, self._what = timeout_s, interrupted, what
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="prefetch")
        self._thread.start()

    def _run(self) -> None:
        try:
            for batch in self._source:
                item = (self._transform(batch), self._source.state())
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
            self._queue.put(self._END)
        except BaseException as e:  # surfaced in the consumer
            if type(e).__name__ in _DATA_ERRORS or isinstance(e, OSError) or (
                    isinstance(e, ValueError) and "record" in str(e)):
                # tf.data (or the bucket reader) failing on a shard: a data problem, not a
                # program error
                e = data_failure(self._what, e, getattr(self._source, "files", None))
            self._queue.put(e)

    def __iter__(self):
        return self

    def __next__(self):
        started = time.monotonic()
        while True:
            try:
                item = self._queue.get(timeout=self._POLL_S)
                break
            except queue.Empty:
                if self.interrupted is not None and self.interrupted():
                    raise DataWaitInterrupted() from None
                if self.timeout_s and time.monotonic() - started > self.timeout_s:
                    raise DataStalled(
                        f"no {self._what} batch arrived within data.wait_timeout_s="
                        f"{self.timeout_s:g} s: the input pipeline is stalled (check that the "
                        "data files are complete and readable, or raise the timeout)") from None
        if item is self._END:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def release_source(self) -> None:
        """Drops the reference to the source once closed, so that its owner decides when a
        source that is slow to destroy (a tf.data iterator) goes."""
        if not self._thread.is_alive():
            self._source = None
