"""GLUE: readers for the original TSVs, pair featurization, metrics and submission files.

Quirks of the distribution handled here: CoLA train/dev have no header
(``source, label, star, sentence``) while CoLA test has one; MRPC starts with a byte-order mark
and names its columns ``Quality, #1 ID, #2 ID, #1 String, #2 String``; RTE, QNLI, MNLI and others
contain stray quotes (read with no quoting, see ``tsv.py``); MNLI is read by header names (train,
dev and test have different column sets); STS-B labels are float scores; test files have no label.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Iterable, Sequence

import numpy as np

from bert_jax.errors import BertJaxError
from bert_jax.fileio import atomic_write
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
from bert_jax.tasks.tsv import column_count_problem, read_tsv_header

NLI_LABELS = ("contradiction", "entailment", "neutral")
BINARY_LABELS = ("0", "1")
ENTAILMENT_LABELS = ("entailment", "not_entailment")


@dataclasses.dataclass(frozen=True)
class PairExample:
    """One GLUE example. ``label`` is a label string, a float score (STS-B) or None (test)."""

    guid: str
    text_a: str
    text_b: str | None
    label: str | float | None
    # Id written in the submission file: the file's index/id column, else the 0-based row number.
    index: str


@dataclasses.dataclass(frozen=True)
class GlueSpec:
    name: str
    folder: str  # folder name in the GLUE distribution (glue_data/<folder>/train.tsv)
    kind: str
    labels: tuple[str, ...]
    text_a: str
    text_b: str | None
    label_column: str | None
    index_column: str
    main_metric: str
    tfds_name: str
    tfds_text: tuple[str, ...]  # tfds feature names for text_a (and text_b)
    split_files: dict[str, tuple[str, ...]]
    eval_splits: tuple[str, ...] = ("dev",)
    # test split -> leaderboard file name
    submissions: dict[str, str] = dataclasses.field(default_factory=dict)
    # Headerless layout (CoLA train/dev): column positions of (label, text_a).
    headerless: tuple[int, int] | None = None
    headerless_columns: int = 0
    # Regression: the scores the task defines (STS-B: 0 to 5); a score outside is a bad row.
    label_range: tuple[float, float] | None = None


_STANDARD = {"train": ("train.tsv",), "dev": ("dev.tsv",), "test": ("test.tsv",)}


def _spec(name, folder, kind, labels, a, b, label, main, tfds_text, *, index="index",
          stem=None, **kw) -> GlueSpec:
    return GlueSpec(name=name, folder=folder, kind=kind, labels=labels, text_a=a, text_b=b,
                    label_column=label, index_column=index, main_metric=main,
                    tfds_name=f"glue/{name}", tfds_text=tfds_text,
                    split_files=kw.pop("split_files", _STANDARD),
                    submissions=kw.pop("submissions", {"test": f"{stem or folder}.tsv"}), **kw)


GLUE_SPECS: dict[str, GlueSpec] = {s.name: s for s in [
    _spec("cola", "CoLA", "classification", BINARY_LABELS, "sentence", None, "label", "mcc",
          ("sentence",), headerless=(1, 3), headerless_columns=4),
    _spec("sst2", "SST-2", "classification", BINARY_LABELS, "sentence", None, "label",
          "accuracy", ("sentence",)),
    _spec("mrpc", "MRPC", "classification", BINARY_LABELS, "#1 String", "#2 String", "Quality",
          "acc_and_f1", ("sentence1", "sentence2")),
    _spec("stsb", "STS-B", "regression", (), "sentence1", "sentence2", "score", "corr",
          ("sentence1", "sentence2"), label_range=(0.0, 5.0)),
    _spec("qqp", "QQP", "classification", BINARY_LABELS, "question1", "question2",
          "is_duplicate", "acc_and_f1", ("question1", "question2"), index="id"),
    _spec("mnli", "MNLI", "classification", NLI_LABELS, "sentence1", "sentence2", "gold_label",
          "accuracy", ("premise", "hypothesis"),
          split_files={"train": ("train.tsv",), "dev_matched": ("dev_matched.tsv",),
                       "dev_mismatched": ("dev_mismatched.tsv",),
                       "test_matched": ("test_matched.tsv",),
                       "test_mismatched": ("test_mismatched.tsv",)},
          eval_splits=("dev_matched", "dev_mismatched"),
          submissions={"test_matched": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv"}),
    _spec("qnli", "QNLI", "classification", ENTAILMENT_LABELS, "question", "sentence", "label",
          "accuracy", ("question", "sentence")),
    _spec("rte", "RTE", "classification", ENTAILMENT_LABELS, "sentence1", "sentence2", "label",
          "accuracy", ("sentence1", "sentence2")),
    _spec("wnli", "WNLI", "classification", BINARY_LABELS, "sentence1", "sentence2", "label",
          "accuracy", ("sentence1", "sentence2")),
    # The diagnostic set: test only, predicted with an MNLI model.
    _spec("ax", "diagnostic", "classification", NLI_LABELS, "sentence1", "sentence2", None,
          "accuracy", ("premise", "hypothesis"),
          split_files={"test": ("diagnostic.tsv", "AX.tsv")}, eval_splits=(),
          submissions={"test": "AX.tsv"}),
]}

# Split names of tensorflow-datasets for ours.
TFDS_SPLITS = {"dev": "validation", "dev_matched": "validation_matched",
               "dev_mismatched": "validation_mismatched"}


class GlueTask(Task):
    """A GLUE task: sentence or sentence-pair classification (STS-B: regression)."""

    def __init__(self, spec: GlueSpec):
        self.spec = spec
        self.name = spec.name
        self.kind = spec.kind
        self.labels = spec.labels
        self.main_metric = spec.main_metric
        self.splits = tuple(spec.split_files)
        self.eval_splits = spec.eval_splits
        self.tfds_name = spec.tfds_name
        self.label_keys = ("labels",) if spec.kind == "regression" else ("label_ids",)

    # ---- reading ---------------------------------------------------------------------------
    def read(self, split, data_dir=None, files=None, on_error="raise") -> ExampleList:
        path = resolve_file(split, self.spec.split_files, data_dir, files, (self.spec.folder,))
        problems = RowProblems(on_error)
        header, rows = read_tsv_header(path)
        examples: list[PairExample] = []
        if self.spec.headerless and self.spec.text_a not in header:
            for number, fields in itertools.chain([(1, header)], rows):
                ex = self._headerless_row(split, path, number, fields, len(examples), problems)
                if ex is not None:
                    examples.append(ex)
            return problems.finish(examples, path)
        columns = {name: i for i, name in enumerate(header)}
        needed = [self.spec.text_a] + ([self.spec.text_b] if self.spec.text_b else [])
        missing = [c for c in needed if c not in columns]
        if missing:
            raise BertJaxError(f"{path}:1: header {header} lacks column(s) {missing} of "
                               f"{self.spec.folder}")
        label_col = self.spec.label_column if self.spec.label_column in columns else None
        if label_col is None and not split.startswith("test") and self.spec.label_column:
            raise BertJaxError(f"{path}:1: header {header} lacks the label column "
                               f"{self.spec.label_column!r} needed for split {split!r}")
        for number, fields in rows:
            problem = column_count_problem(header, fields)
            if problem:
                problems.report(f"{path}:{number}", problem)
                continue
            label = None
            if label_col is not None:
                label = self._parse_label(fields[columns[label_col]], f"{path}:{number}",
                                          problems)
                if label is None:
                    continue
            index = (fields[columns[self.spec.index_column]]
                     if self.spec.index_column in columns else str(len(examples)))
            examples.append(PairExample(
                guid=f"{split}-{len(examples)}", text_a=fields[columns[self.spec.text_a]],
                text_b=fields[columns[self.spec.text_b]] if self.spec.text_b else None,
                label=label, index=index))
        return problems.finish(examples, path)

    def _headerless_row(self, split, path, number, fields, n, problems):
        if len(fields) != self.spec.headerless_columns:
            problems.report(f"{path}:{number}", f"expected {self.spec.headerless_columns} "
                            f"tab-separated columns (source, label, star, sentence), found "
                            f"{len(fields)}")
            return None
        label_pos, text_pos = self.spec.headerless
        label = self._parse_label(fields[label_pos], f"{path}:{number}", problems)
        if label is None:
            return None
        return PairExample(guid=f"{split}-{n}", text_a=fields[text_pos], text_b=None,
                           label=label, index=str(n))

    def _parse_label(self, raw: str, where: str, problems: RowProblems):
        if self.kind == "regression":
            value = parse_score(raw)
            if value is None:
                problems.report(where, f"score {raw!r} is not a number")
                return None
            low, high = self.spec.label_range or (-np.inf, np.inf)
            if not low <= value <= high:
                problems.report(where, f"score {raw!r} is outside the task's range "
                                f"[{low:g}, {high:g}]")
                return None
            return value
        if raw not in self.labels:
            problems.report(where, f"label {raw!r} is not one of {list(self.labels)}")
            return None
        return raw

    def from_tfds(self, records: Iterable[dict], split: str,
                  label_names: Sequence[str] | None) -> ExampleList:
        """tensorflow-datasets records (numpy, bytes) -> examples; labels -1 mean unlabelled."""
        examples = []
        for n, rec in enumerate(records):
            texts = [_text(rec[k]) for k in self.spec.tfds_text]
            label = None
            if "label" in rec and self.kind == "regression":
                score = float(rec["label"])
                label = score if score >= 0 else None  # tfds marks unlabelled test rows -1
            elif "label" in rec and int(rec["label"]) >= 0:
                i = int(rec["label"])
                label = self._tfds_label(i, label_names)
            examples.append(PairExample(guid=f"{split}-{n}", text_a=texts[0],
                                        text_b=texts[1] if len(texts) > 1 else None,
                                        label=label, index=str(int(rec.get("idx", n)))))
        return ExampleList(examples)

    def _tfds_label(self, i: int, label_names):
        if self.labels == BINARY_LABELS:  # tfds names the classes, GLUE files write 0/1
            return str(i)
        if label_names is None:
            raise BertJaxError(f"{self.tfds_name}: label names unknown")
        return label_names[i]

    # ---- features --------------------------------------------------------------------------
    def featurize(self, examples, tokenizer, max_seq_length, **opts) -> Features:
        """Pairs are truncated longest-first to fit ``max_seq_length`` with [CLS]/[SEP]."""
        if opts:
            raise BertJaxError(f"{self.name}: unknown featurize options {sorted(opts)}")
        return text_features(examples, tokenizer, max_seq_length, self.kind, self.labels)

    # ---- predictions -----------------------------------------------------------------------
    def postprocess(self, features, model_outputs, examples, **opts) -> list:
        """Logits [N, num_labels] -> label strings; scores [N] or [N, 1] -> floats."""
        out = np.asarray(model_outputs)
        if out.shape[0] != len(examples):
            raise BertJaxError(f"{self.name}: {out.shape[0]} outputs for {len(examples)} "
                               "examples")
        if self.kind == "regression":
            return [float(x) for x in out.reshape(len(examples))]
        return [self.labels[i] for i in np.argmax(out, axis=-1)]

    def metrics(self, predictions, examples) -> dict[str, float]:
        golds = [e.label for e in examples]
        if any(g is None for g in golds):
            raise BertJaxError(f"{self.name}: examples without labels cannot be scored")
        if len(predictions) != len(golds):
            raise BertJaxError(f"{self.name}: {len(predictions)} predictions for {len(golds)} "
                               "examples")
        if self.kind == "regression":
            return M.correlations(predictions, golds)
        if self.name == "cola":
            return {"mcc": M.matthews_corrcoef(predictions, golds),
                    "accuracy": M.accuracy(predictions, golds)}
        acc = M.accuracy(predictions, golds)
        if self.name in ("mrpc", "qqp"):
            f1 = M.binary_f1(predictions, golds, positive="1")
            return {"accuracy": acc, "f1": f1, "acc_and_f1": (acc + f1) / 2}
        return {"accuracy": acc}

    def submission_name(self, split: str) -> str:
        """Leaderboard file name for a test split (e.g. MNLI-m.tsv); ``<Name>.<split>.tsv`` else."""
        if split in self.spec.submissions:
            return self.spec.submissions[split]
        stem = os.path.splitext(next(iter(self.spec.submissions.values())))[0]
        return f"{stem}.{split}.tsv"

    def write_predictions(self, predictions, examples, output_dir, split) -> list[str]:
        """GLUE submission TSV: header ``index\\tprediction``, labels as GLUE spells them."""
        if len(predictions) != len(examples):
            raise BertJaxError(f"{self.name}: {len(predictions)} predictions for "
                               f"{len(examples)} examples")
        path = os.path.join(output_dir, self.submission_name(split))
        lines = ["index\tprediction\n"]
        for ex, pred in zip(examples, predictions, strict=True):
            value = f"{pred:.3f}" if self.kind == "regression" else str(pred)
            lines.append(f"{ex.index}\t{value}\n")
        atomic_write(path, "".join(lines))
        return [path]


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
