"""SWAG: the official CSV, one ``[CLS] context [SEP] start + ending [SEP]`` input per choice.

The CSV (``train.csv``, ``val.csv``, ``test.csv``) has the header
``,video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,...,ending3,label`` (no label
in test). ``startphrase`` is ``sent1`` followed by ``sent2``, the start of the second sentence;
as in the BERT paper each choice pairs the context ``sent1`` with ``sent2 + " " + ending``.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os

import numpy as np

from bert_jax.errors import BertJaxError
from bert_jax.fileio import atomic_write
from bert_jax.tasks import metrics as M
from bert_jax.tasks.base import (
    ExampleList,
    Features,
    RowProblems,
    Task,
    encode_inputs,
    resolve_file,
)
from bert_jax.textio import open_text

NUM_CHOICES = 4
REQUIRED = ("sent1", "sent2", *(f"ending{i}" for i in range(NUM_CHOICES)))


@dataclasses.dataclass(frozen=True)
class ChoiceExample:
    guid: str
    context: str
    start: str  # the beginning of the sentence each ending completes
    endings: tuple[str, ...]
    label: int | None
    index: str  # the CSV's first (unnamed) column, else the row number


def read_swag_csv(path: str, on_error: str = "raise") -> ExampleList:
    """Reads a SWAG CSV by its header names; bad rows are reported with ``file:line``."""
    problems = RowProblems(on_error)
    examples = []
    with open_text(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise BertJaxError(f"{path}: empty file")
        columns = {name: i for i, name in enumerate(header)}
        missing = [c for c in REQUIRED if c not in columns]
        if missing:
            raise BertJaxError(f"{path}:1: header lacks SWAG column(s) {missing}")
        has_label = "label" in columns
        for row in reader:
            where = f"{path}:{reader.line_num}"
            if len(row) != len(header):
                problems.report(where, f"expected {len(header)} columns as in the header, found "
                                f"{len(row)}")
                continue
            label = None
            if has_label:
                raw = row[columns["label"]]
                if raw not in {str(i) for i in range(NUM_CHOICES)}:
                    problems.report(where, f"label {raw!r} is not a choice 0..{NUM_CHOICES - 1}")
                    continue
                label = int(raw)
            index = row[0] if header[0] == "" else str(len(examples))
            examples.append(ChoiceExample(
                guid=str(len(examples)), context=row[columns["sent1"]],
                start=row[columns["sent2"]],
                endings=tuple(row[columns[f"ending{i}"]] for i in range(NUM_CHOICES)),
                label=label, index=index))
    return problems.finish(examples, path)


class SwagTask(Task):
    """SWAG grounded commonsense inference: pick the most plausible of four endings."""

    name = "swag"
    kind = "multiple_choice"
    labels = tuple(str(i) for i in range(NUM_CHOICES))
    label_keys = ("label_ids",)
    main_metric = "accuracy"
    _files = {"train": ("train.csv",), "dev": ("val.csv",), "test": ("test.csv",)}

    @property
    def num_choices(self) -> int:
        return NUM_CHOICES

    def read(self, split, data_dir=None, files=None, on_error="raise") -> ExampleList:
        return read_swag_csv(resolve_file(split, self._files, data_dir, files), on_error)

    def featurize(self, examples, tokenizer, max_seq_length, **opts) -> Features:
        """-> input_ids, input_mask, segment_ids [N, num_choices, S]; label_ids [N]."""
        if opts:
            raise BertJaxError(f"{self.name}: unknown featurize options {sorted(opts)}")
        encodings = [tokenizer.encode(ex.context, f"{ex.start} {ending}".strip(),
                                      max_length=max_seq_length)
                     for ex in examples for ending in ex.endings]
        flat = encode_inputs(encodings, tokenizer, max_seq_length)
        feats = {k: v.reshape(len(examples), NUM_CHOICES, max_seq_length)
                 for k, v in flat.items()}
        feats["example_index"] = np.arange(len(examples), dtype=np.int32)
        if examples and all(ex.label is not None for ex in examples):
            feats["label_ids"] = np.array([ex.label for ex in examples], dtype=np.int32)
        return feats

    def postprocess(self, features, model_outputs, examples, **opts) -> list[int]:
        """Choice scores [N, num_choices] (or [N, num_choices, 1]) -> chosen ending index."""
        scores = np.asarray(model_outputs).reshape(len(examples), -1)
        return [int(i) for i in np.argmax(scores, axis=-1)]

    def metrics(self, predictions, examples) -> dict[str, float]:
        if any(ex.label is None for ex in examples):
            raise BertJaxError(f"{self.name}: examples without labels cannot be scored")
        return {"accuracy": M.accuracy(predictions, [ex.label for ex in examples])}

    def write_predictions(self, predictions, examples, output_dir, split) -> list[str]:
        """``predictions.<split>.csv`` with columns ``index,prediction`` (the ending number)."""
        path = os.path.join(output_dir, f"predictions.{split}.csv")
        buffer = io.StringIO(newline="")
        writer = csv.writer(buffer)
        writer.writerow(["index", "prediction"])
        for ex, pred in zip(examples, predictions, strict=True):
            writer.writerow([ex.index, pred])
        atomic_write(path, buffer.getvalue())
        return [path]
