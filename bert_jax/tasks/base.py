"""The Task interface shared by GLUE, SQuAD, CoNLL-2003 NER and SWAG.

A task turns files into examples (``read``), examples into fixed-shape numpy features for the
model (``featurize``), model outputs back into predictions in the dataset's own terms
(``postprocess``), scores them as the official scorer does (``metrics``) and writes them in the
format a leaderboard or a scorer script expects (``write_predictions``). The training loop only
needs this interface and ``input_keys``/``label_keys``.
"""

from __future__ import annotations

import abc
import itertools
import json
import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from bert_jax import storage
from bert_jax.errors import BertJaxError
from bert_jax.fileio import atomic_write

KINDS = ("classification", "regression", "token_classification", "span", "multiple_choice")
IGNORE_INDEX = -100  # label id of positions that carry no loss (specials, padding, sub-tokens)
INPUT_KEYS = ("input_ids", "input_mask", "segment_ids")

Features = dict[str, np.ndarray]

log = logging.getLogger(__name__)


class ExampleList(list):
    """A list of examples that also remembers which input rows were skipped, and why."""

    def __init__(self, items=(), skipped: Sequence[str] = ()):
        super().__init__(items)
        self.skipped = list(skipped)


class RowProblems:
    """Collects malformed-input problems: raises on the first one when strict, else counts them.

    ``on_error="raise"`` (the default everywhere) stops at the first bad row with a
    ``BertJaxError`` naming ``file:line``; ``"skip"`` drops the row and records the message.
    """

    def __init__(self, on_error: str = "raise"):
        if on_error not in ("raise", "skip"):
            raise BertJaxError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.on_error = on_error
        self.skipped: list[str] = []

    def report(self, where: str, message: str) -> None:
        text = f"{where}: {message}"
        if self.on_error == "raise":
            raise BertJaxError(f"{text} (read with on_error='skip' to skip and count bad rows)")
        self.skipped.append(text)

    def finish(self, examples: list, source: str) -> ExampleList:
        if self.skipped:
            log.warning("%s: skipped %d malformed rows; first: %s", source, len(self.skipped),
                        self.skipped[0])
        return ExampleList(examples, self.skipped)


def resolve_file(split: str, filenames: dict[str, Sequence[str]], data_dir: str | None,
                 files: str | None, subdirs: Sequence[str] = ()) -> str:
    """Finds the file of ``split``: ``files`` if given, else a known name under ``data_dir``.

    ``filenames[split]`` lists candidate names; each is tried in ``data_dir`` and in
    ``data_dir/<subdir>`` (so both a task folder and the GLUE root folder work).
    """
    if files is not None:
        if not storage.isfile(files):
            raise BertJaxError(f"{files}: no such file")
        return files
    if split not in filenames:
        raise BertJaxError(f"unknown split {split!r}; expected one of {sorted(filenames)}")
    if data_dir is None:
        raise BertJaxError("pass data_dir (the dataset folder) or files (the file of the split)")
    tried = []
    for folder in (data_dir, *(storage.join(data_dir, s) for s in subdirs)):
        for name in filenames[split]:
            path = storage.join(folder, name)
            if storage.isfile(path):
                return path
            tried.append(path)
    raise BertJaxError(f"no file for split {split!r}; tried: {', '.join(tried)}")


def pad_rows(rows: Sequence[Sequence[int]], length: int, value: int) -> np.ndarray:
    """Right-pads int rows to ``length``: [N, length] int32."""
    out = np.full((len(rows), length), value, dtype=np.int32)
    lengths = np.fromiter((len(row) for row in rows), np.int64, len(rows))
    if len(rows) and lengths.max() > length:
        raise ValueError(f"row of {lengths.max()} > {length}")
    total = int(lengths.sum())
    if total:  # one vectorised fill: row-major order of the mask is the rows' order
        out[np.arange(length)[None, :] < lengths[:, None]] = np.fromiter(
            itertools.chain.from_iterable(rows), np.int32, total)
    return out


def encode_inputs(encodings, tokenizer, max_seq_length: int) -> Features:
    """Encodings -> input_ids, input_mask, segment_ids, each [N, max_seq_length] int32."""
    ids = pad_rows([e.input_ids for e in encodings], max_seq_length, tokenizer.pad_id)
    mask = pad_rows([[1] * len(e.input_ids) for e in encodings], max_seq_length, 0)
    segs = pad_rows([e.segment_ids for e in encodings], max_seq_length, 0)
    return {"input_ids": ids, "input_mask": mask, "segment_ids": segs}


def text_features(examples, tokenizer, max_seq_length: int, kind: str,
                  labels: Sequence[str]) -> Features:
    """Features of single texts or text pairs (``e.text_a``, ``e.text_b``; pairs truncated
    longest-first to fit with [CLS]/[SEP]) plus ``example_index``, and the targets when every
    example has a label: ``labels`` float32 scores for ``kind`` regression, else ``label_ids``
    (the index of each label in ``labels``)."""
    encodings = [tokenizer.encode(e.text_a, e.text_b, max_length=max_seq_length)
                 for e in examples]
    feats = encode_inputs(encodings, tokenizer, max_seq_length)
    feats["example_index"] = np.arange(len(examples), dtype=np.int32)
    if examples and all(e.label is not None for e in examples):
        if kind == "regression":
            feats["labels"] = np.array([e.label for e in examples], dtype=np.float32)
        else:
            index = {label: i for i, label in enumerate(labels)}
            feats["label_ids"] = np.array([index[e.label] for e in examples], np.int32)
    return feats


def parse_score(raw: str) -> float | None:
    """A regression label as a finite float, or None (not a number, NaN or infinite)."""
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def write_json(path: str, obj: Any) -> str:
    """Writes JSON (NaN/inf become null, as strict JSON readers require); returns the path."""
    def clean(x):
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        if isinstance(x, (float, np.floating)):
            return float(x) if math.isfinite(x) else None
        if isinstance(x, np.integer):
            return int(x)
        return x

    atomic_write(path, json.dumps(clean(obj), indent=2, ensure_ascii=False) + "\n")
    return path


class Task(abc.ABC):
    """One fine-tuning task. See docs/tasks.md for the data formats and feature keys."""

    name: str
    kind: str
    labels: tuple[str, ...] = ()
    main_metric: str
    splits: tuple[str, ...] = ("train", "dev", "test")
    eval_splits: tuple[str, ...] = ("dev",)
    input_keys: tuple[str, ...] = INPUT_KEYS
    label_keys: tuple[str, ...] = ()
    # The tensorflow-datasets name of the dataset (``read_tfds(task.tfds_name, split)``).
    tfds_name: str | None = None

    @property
    def num_labels(self) -> int:
        """Width of the head's output: classes, 1 (regression / choice score) or 2 (span)."""
        if self.kind in ("classification", "token_classification"):
            return len(self.labels)
        if self.kind == "span":
            return 2
        return 1

    @abc.abstractmethod
    def read(self, split: str, data_dir: str | None = None, files: str | None = None,
             on_error: str = "raise") -> ExampleList:
        """Reads a split from local files in the dataset's original distribution format."""

    @abc.abstractmethod
    def featurize(self, examples: Sequence, tokenizer, max_seq_length: int, **opts) -> Features:
        """Examples -> dict of fixed-shape numpy arrays (model inputs, labels, decode info)."""

    @abc.abstractmethod
    def postprocess(self, features: Features, model_outputs, examples: Sequence, **opts):
        """Model outputs (numpy logits) -> predictions in the dataset's terms."""

    @abc.abstractmethod
    def metrics(self, predictions, examples: Sequence) -> dict[str, float]:
        """Scores predictions against the gold labels of ``examples`` as the official scorer."""

    @abc.abstractmethod
    def write_predictions(self, predictions, examples: Sequence, output_dir: str,
                          split: str) -> list[str]:
        """Writes predictions as the leaderboard / scorer expects; returns the paths written."""
