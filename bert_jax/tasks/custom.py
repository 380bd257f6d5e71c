"""Tasks from your own files: single-text or text-pair classification, regression and token
tagging, read from CSV, TSV or JSON-lines files with named columns.

The run config names the columns (``text_column``, ``text_pair_column``, ``label_column``)
and the format (``file_format``; by default the file's extension: .csv, .tsv, .jsonl/.json).
Classification and tagging labels are whatever strings the training file holds: without
``labels`` in the config they are inferred from train (sorted) and written back into the run
config, which is stored with the model, so ``evaluate`` and ``predict`` use the same ids. A
label at evaluation that train did not have is an error naming file and line.

Tagging rows hold the words and their tags: JSON lists in JSON lines, whitespace-separated
strings in CSV/TSV (as many tags as words). Each word's tag goes on its first sub-token (as
CoNLL-2003 in ``ner.py``). Prediction files repeat every input row with a ``prediction``
column (key in JSON lines).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import re
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from bert_jax import fileio, storage
from bert_jax.errors import BertJaxError
from bert_jax.tasks import metrics as M
from bert_jax.tasks.base import (
    ExampleList,
    Features,
    RowProblems,
    Task,
    parse_score,
    resolve_file,
    text_features,
)
from bert_jax.tasks.conlleval import conlleval
from bert_jax.tasks.ner import featurize_ner, words_from_token_labels
from bert_jax.tasks.tsv import column_count_problem, read_tsv_header
from bert_jax.textio import open_text

# task name -> kind
CUSTOM_KINDS = {"custom_classification": "classification",
                "custom_regression": "regression",
                "custom_tagging": "token_classification"}
FORMATS = ("csv", "tsv", "jsonl")
_EXTENSIONS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl",
               ".ndjson": "jsonl"}
PREDICTION_COLUMN = "prediction"
_BIO = re.compile(r"^(O|[BIES]-.+)$")


@dataclasses.dataclass(frozen=True)
class CustomExample:
    """One row. ``label``: a label string, a float (regression) or None (unlabelled)."""

    guid: str
    text_a: str
    text_b: str | None
    label: str | float | None
    row: dict[str, Any]  # the original row, written back with the prediction


@dataclasses.dataclass(frozen=True)
class TaggingExample:
    """One tagging row: its words and their tags (None when unlabelled)."""

    guid: str
    words: tuple[str, ...]
    labels: tuple[str, ...] | None
    row: dict[str, Any]


def file_format(path: str, configured: str = "") -> str:
    """``configured`` if set, else the format of ``path``'s extension."""
    if configured:
        if configured not in FORMATS:
            raise BertJaxError(f"file_format={configured!r}: choose one of {', '.join(FORMATS)}")
        return configured
    ext = os.path.splitext(path)[1].lower()
    if ext not in _EXTENSIONS:
        raise BertJaxError(f"{path}: cannot tell the format from the extension {ext!r}; name "
                           "it .csv, .tsv or .jsonl or set --config.file_format")
    return _EXTENSIONS[ext]


def read_rows(path: str, fmt: str) -> tuple[list[str] | None, Iterator[tuple[int, dict]]]:
    """(header or None for JSON lines, iterator of (1-based line, {column: value}))."""
    if not storage.isfile(path):
        raise BertJaxError(f"{path}: no such file")
    if fmt == "jsonl":
        return None, _jsonl_rows(path)
    if fmt == "tsv":
        header, lines = read_tsv_header(path, "empty file (expected a header row)")

        def tsv_rows():
            for number, fields in lines:
                if fields == [""]:
                    continue
                problem = column_count_problem(header, fields)
                if problem:
                    raise BertJaxError(f"{path}:{number}: {problem}")
                yield number, dict(zip(header, fields, strict=True))

        return header, tsv_rows()
    with open_text(path, newline="") as f:
        reader = csv.reader(f)
        try:
            header = next(reader)
        except StopIteration:
            raise BertJaxError(f"{path}: empty file (expected a header row)") from None
        rows = []
        for fields in reader:
            if not fields:
                continue
            if len(fields) != len(header):
                raise BertJaxError(f"{path}:{reader.line_num}: expected {len(header)} "
                                   f"comma-separated columns as in the header, found "
                                   f"{len(fields)}")
            rows.append((reader.line_num, dict(zip(header, fields, strict=True))))
    return header, iter(rows)


def _jsonl_rows(path: str) -> Iterator[tuple[int, dict]]:
    with open_text(path) as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise BertJaxError(f"{path}:{number}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise BertJaxError(f"{path}:{number}: expected a JSON object per line")
            yield number, row


def parse_labels(value: str) -> tuple[str, ...]:
    """The config's ``labels``: ``a,b,c`` or a JSON list; empty -> ()."""
    value = (value or "").strip()
    if not value:
        return ()
    if value.startswith("["):
        try:
            labels = json.loads(value)
        except json.JSONDecodeError as e:
            raise BertJaxError(f"labels={value!r}: not a JSON list ({e.msg})") from None
        return tuple(str(x) for x in labels)
    return tuple(x.strip() for x in value.split(","))


def _sorted_labels(labels) -> tuple[str, ...]:
    """Numbers in numeric order (0, 1, 2, 10), everything else alphabetically."""
    def key(x):
        try:
            return (0, float(x), x)
        except ValueError:
            return (1, 0.0, x)
    return tuple(sorted(labels, key=key))


def _words(value, where: str, what: str) -> tuple[str, ...]:
    if isinstance(value, list):
        return tuple(str(v) for v in value)
    if isinstance(value, str):
        return tuple(value.split())
    raise BertJaxError(f"{where}: {what} must be a list or a whitespace-separated string")


class CustomTask(Task):
    """A task on your own files, configured by the run config (see the module docstring)."""

    splits = ("train", "dev", "test")
    eval_splits = ("dev",)
    _files = {split: tuple(f"{split}{ext}" for ext in (".csv", ".tsv", ".jsonl"))
              for split in ("train", "dev", "test")}

    def __init__(self, name: str, config):
        if name not in CUSTOM_KINDS:
            raise BertJaxError(f"unknown custom task {name!r}; one of {sorted(CUSTOM_KINDS)}")
        if config is None:
            raise BertJaxError(f"task {name} is read from your files: it needs the run config "
                               "(text_column, label_column, ...); use experiments/custom.py")
        self.name = name
        self.kind = CUSTOM_KINDS[name]
        self.config = config
        self.text_column = config.text_column
        self.text_pair_column = config.text_pair_column or None
        self.label_column = config.label_column
        if not self.text_column:
            raise BertJaxError(f"{name}: set --config.text_column (the column with the text"
                               f"{' words' if self.kind == 'token_classification' else ''})")
        if not self.label_column:
            raise BertJaxError(f"{name}: set --config.label_column (the column with the label)")
        if self.kind == "token_classification" and self.text_pair_column:
            raise BertJaxError(f"{name}: text_pair_column does not apply to tagging")
        self.labels = parse_labels(config.labels) if self.kind != "regression" else ()
        self.label_keys = ("labels",) if self.kind == "regression" else ("label_ids",)
        self._read: dict[str, tuple[str, list[str] | None]] = {}  # split -> (format, header)

    @property
    def main_metric(self) -> str:  # type: ignore[override]
        if self.kind == "regression":
            return "corr"
        if self.kind == "token_classification" and self._is_bio():
            return "f1"
        return "accuracy"

    def _is_bio(self) -> bool:
        return bool(self.labels) and all(_BIO.match(x) for x in self.labels)

    # ---- reading ---------------------------------------------------------------------------
    def read(self, split, data_dir=None, files=None, on_error="raise") -> ExampleList:
        path = resolve_file(split, self._files, data_dir, files)
        fmt = file_format(path, self.config.file_format)
        header, rows = read_rows(path, fmt)
        self._read[split] = (fmt, header)
        needed = [self.text_column] + ([self.text_pair_column] if self.text_pair_column else [])
        if header is not None:
            missing = [c for c in needed if c not in header]
            if missing:
                raise BertJaxError(f"{path}:1: no column {missing[0]!r}; the header has "
                                   f"{header}")
            if self.label_column not in header and split == "train":
                raise BertJaxError(f"{path}:1: no label column {self.label_column!r}; the "
                                   f"header has {header}")
        infer = split == "train" and not self.labels and self.kind != "regression"
        allowed = set(self.labels)
        problems = RowProblems(on_error)
        examples: list = []
        seen: set[str] = set()
        for number, row in rows:
            where = f"{path}:{number}"
            absent = [c for c in needed if c not in row]
            if absent:
                raise BertJaxError(f"{where}: no column {absent[0]!r} in this row; it has "
                                   f"{sorted(row)}")
            has_label = self.label_column in row
            if not has_label and split == "train":
                raise BertJaxError(f"{where}: no label column {self.label_column!r} in this "
                                   f"row; it has {sorted(row)}")
            example = self._example(split, len(examples), row, has_label, where, problems,
                                    None if infer else allowed)
            if example is None:
                continue
            if infer:
                labels = example.labels if self.kind == "token_classification" \
                    else [example.label]
                seen.update(labels or ())
            examples.append(example)
        if infer:
            if not seen:
                raise BertJaxError(f"{path}: no labelled rows to learn the label set from")
            self.labels = _sorted_labels(seen)
            self.config.labels = json.dumps(list(self.labels), ensure_ascii=False)
        if split == "train" and self.kind != "regression" and len(self.labels) < 2:
            raise BertJaxError(f"{path}: only one label ({list(self.labels)}); a classifier "
                               "needs at least two")
        return problems.finish(examples, path)

    def _example(self, split, n, row, has_label, where, problems, allowed):
        guid = f"{split}-{n}"
        if self.kind == "token_classification":
            words = _words(row[self.text_column], where, f"column {self.text_column!r}")
            if not words:
                problems.report(where, f"no words in column {self.text_column!r}")
                return None
            tags = None
            if has_label:
                tags = _words(row[self.label_column], where, f"column {self.label_column!r}")
                if len(tags) != len(words):
                    problems.report(where, f"{len(words)} words but {len(tags)} tags in "
                                    f"column {self.label_column!r}")
                    return None
                unknown = [t for t in tags if allowed is not None and t not in allowed]
                if unknown:
                    problems.report(where, self._unknown(unknown[0]))
                    return None
            return TaggingExample(guid, words, tags, row)
        label = None
        if has_label:
            raw = row[self.label_column]
            raw = "" if raw is None else str(raw).strip()
            if not raw:
                problems.report(where, f"empty label in column {self.label_column!r}")
                return None
            if self.kind == "regression":
                label = parse_score(raw)
                if label is None:
                    problems.report(where, f"label {raw!r} in column {self.label_column!r} is "
                                    "not a number")
                    return None
            else:
                if allowed is not None and raw not in allowed:
                    problems.report(where, self._unknown(raw))
                    return None
                label = raw
        text_b = str(row[self.text_pair_column]) if self.text_pair_column else None
        return CustomExample(guid, str(row[self.text_column]), text_b, label, row)

    def _unknown(self, label: str) -> str:
        return (f"label {label!r} in column {self.label_column!r} is not one of the training "
                f"labels {list(self.labels)}")

    # ---- features --------------------------------------------------------------------------
    def featurize(self, examples, tokenizer, max_seq_length, **opts) -> Features:
        if opts:
            raise BertJaxError(f"{self.name}: unknown featurize options {sorted(opts)}")
        if self.kind == "token_classification":
            return featurize_ner(examples, tokenizer, max_seq_length, self.labels)
        return text_features(examples, tokenizer, max_seq_length, self.kind, self.labels)

    # ---- predictions -----------------------------------------------------------------------
    def postprocess(self, features, model_outputs, examples, **opts) -> list:
        out = np.asarray(model_outputs)
        if self.kind == "token_classification":
            return words_from_token_labels(features, np.argmax(out, axis=-1), examples,
                                           self.labels)
        if self.kind == "regression":
            return [float(x) for x in out.reshape(len(examples))]
        return [self.labels[i] for i in np.argmax(out, axis=-1)]

    def metrics(self, predictions, examples) -> dict[str, float]:
        golds = [e.labels if self.kind == "token_classification" else e.label
                 for e in examples]
        if any(g is None for g in golds):
            raise BertJaxError(f"{self.name}: examples without labels cannot be scored")
        if self.kind == "regression":
            mse = float(np.mean((np.asarray(predictions) - np.asarray(golds)) ** 2))
            return {**M.correlations(predictions, golds), "mse": mse}
        if self.kind == "token_classification":
            flat_p = [t for sent in predictions for t in sent]
            flat_g = [t for sent in golds for t in sent]
            out = {"accuracy": M.accuracy(flat_p, flat_g),
                   "macro_f1": macro_f1(flat_p, flat_g, self.labels)}
            if self._is_bio():
                scores = conlleval(golds, predictions)
                out.update({k: scores[k] for k in ("precision", "recall", "f1")})
            return out
        return {"accuracy": M.accuracy(predictions, golds),
                "macro_f1": macro_f1(predictions, golds, self.labels)}

    def write_predictions(self, predictions, examples, output_dir, split) -> list[str]:
        """``predictions.<split>.<csv|tsv|jsonl>``: every input row plus ``prediction``."""
        if len(predictions) != len(examples):
            raise BertJaxError(f"{self.name}: {len(predictions)} predictions for "
                               f"{len(examples)} examples")
        fmt, header = self._read.get(split, ("jsonl", None))
        storage.makedirs(output_dir)
        path = storage.join(output_dir, f"predictions.{split}.{fmt}")
        tagging = self.kind == "token_classification"
        f = io.StringIO(newline="")
        if fmt == "jsonl":
            for ex, pred in zip(examples, predictions, strict=True):
                f.write(json.dumps({**ex.row, PREDICTION_COLUMN: pred},
                                   ensure_ascii=False) + "\n")
        else:
            columns = [*(header or []), PREDICTION_COLUMN]
            rows = [[*(str(ex.row.get(c, "")) for c in header or []),
                     " ".join(pred) if tagging else
                     (f"{pred:.6g}" if self.kind == "regression" else pred)]
                    for ex, pred in zip(examples, predictions, strict=True)]
            if fmt == "csv":
                writer = csv.writer(f)
                writer.writerow(columns)
                writer.writerows(rows)
            else:
                f.write("\t".join(columns) + "\n")
                for r in rows:
                    f.write("\t".join(r) + "\n")
        fileio.atomic_write(path, f.getvalue())
        return [path]


def macro_f1(preds: Sequence[str], golds: Sequence[str], labels: Sequence[str]) -> float:
    """Unweighted mean of the per-label F1 over the labels that occur in gold or predictions."""
    scores = []
    for label in labels:
        tp = sum(p == label and g == label for p, g in zip(preds, golds, strict=True))
        fp = sum(p == label and g != label for p, g in zip(preds, golds, strict=True))
        fn = sum(p != label and g == label for p, g in zip(preds, golds, strict=True))
        if tp + fp + fn:
            scores.append(2 * tp / (2 * tp + fp + fn))
    return float(np.mean(scores)) if scores else 0.0
