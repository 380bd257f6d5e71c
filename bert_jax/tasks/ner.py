"""CoNLL-2003 NER: column-file reader, first-sub-token labelling, word-level decoding, outputs.

Each word is tokenized on its own; its label goes on its first sub-token and the other
sub-tokens (and [CLS], [SEP], padding) get ``IGNORE_INDEX``. A sentence longer than
``max_seq_length`` is split at word boundaries into several features, so every word gets a
prediction. Predictions are read back from the first sub-token of each word.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import numpy as np

from bert_jax.errors import BertJaxError
from bert_jax.fileio import atomic_write
from bert_jax.tasks.base import (
    IGNORE_INDEX,
    ExampleList,
    Features,
    RowProblems,
    Task,
    pad_rows,
    resolve_file,
)
from bert_jax.tasks.conlleval import conlleval
from bert_jax.textio import open_text

ENTITY_TYPES = ("PER", "ORG", "LOC", "MISC")
# The label order of tensorflow-datasets' conll2003 (and Hugging Face's).
NER_LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
DOCSTART = "-DOCSTART-"


@dataclasses.dataclass(frozen=True)
class NerExample:
    guid: str
    words: tuple[str, ...]
    labels: tuple[str, ...] | None


def to_iob2(tags: Sequence[str]) -> list[str]:
    """IOB1 -> IOB2: an ``I-X`` that begins a chunk (after O or another type) becomes ``B-X``."""
    out = []
    prev = "O"
    for tag in tags:
        if tag.startswith("I-") and (prev == "O" or prev[2:] != tag[2:]):
            tag = "B-" + tag[2:]
        out.append(tag)
        prev = tag
    return out


def read_conll(path: str, labels: Sequence[str] = NER_LABELS, scheme: str = "iob2",
               on_error: str = "raise") -> ExampleList:
    """Reads a CoNLL column file: token first, NER tag last; blank line between sentences.

    ``-DOCSTART-`` lines separate documents. ``scheme="iob2"`` converts IOB1 files (the
    original CoNLL-2003 release) to IOB2, which keeps every entity; ``"keep"`` leaves tags as is.
    A bad line drops its whole sentence when ``on_error="skip"``.
    """
    if scheme not in ("iob2", "keep"):
        raise BertJaxError(f"scheme must be 'iob2' or 'keep', got {scheme!r}")
    problems = RowProblems(on_error)
    examples: list[NerExample] = []
    words: list[str] = []
    tags: list[str] = []
    bad = False

    def flush():
        nonlocal words, tags, bad
        if words and not bad:
            fixed = to_iob2(tags) if scheme == "iob2" else tags
            examples.append(NerExample(f"{len(examples)}", tuple(words), tuple(fixed)))
        words, tags, bad = [], [], False

    with open_text(path) as f:
        for number, line in enumerate(f, start=1):
            fields = line.split()
            if not fields or fields[0] == DOCSTART:
                flush()
                continue
            if len(fields) < 2:
                problems.report(f"{path}:{number}", f"expected 'token ... tag' columns, found "
                                f"{line.rstrip()!r}")
                bad = True
                continue
            if fields[-1] not in labels:
                problems.report(f"{path}:{number}", f"tag {fields[-1]!r} is not one of "
                                f"{list(labels)}")
                bad = True
                continue
            words.append(fields[0])
            tags.append(fields[-1])
    flush()
    return problems.finish(examples, path)


def featurize_ner(examples: Sequence[NerExample], tokenizer, max_seq_length: int,
                  labels: Sequence[str] = NER_LABELS) -> Features:
    """Examples -> features [F, S]: input_ids, input_mask, segment_ids, label_ids (first
    sub-token of each word, ``IGNORE_INDEX`` elsewhere; only when labelled), word_index (the
    word each first sub-token starts, -1 elsewhere) and example_index [F]."""
    budget = max_seq_length - 2
    if budget <= 0:
        raise BertJaxError(f"max_seq_length={max_seq_length} leaves no room for tokens")
    label_index = {label: i for i, label in enumerate(labels)}
    labelled = bool(examples) and all(e.labels is not None for e in examples)
    rows: dict[str, list] = {"ids": [], "labels": [], "words": [], "example": []}
    for e, ex in enumerate(examples):
        chunk: list[tuple[int, list[int]]] = []
        size = 0
        pieces = []
        for w, word in enumerate(ex.words):
            ids = [tokenizer.token_to_id(t) for t in tokenizer.tokenize(word)] or [
                tokenizer.unk_id]
            ids = ids[:budget]
            if chunk and size + len(ids) > budget:
                pieces.append(chunk)
                chunk, size = [], 0
            chunk.append((w, ids))
            size += len(ids)
        if chunk or not pieces:
            pieces.append(chunk)
        for piece in pieces:
            ids, label_ids, word_index = [tokenizer.cls_id], [IGNORE_INDEX], [-1]
            for w, sub_ids in piece:
                ids += sub_ids
                word_index += [w] + [-1] * (len(sub_ids) - 1)
                first = label_index[ex.labels[w]] if labelled else IGNORE_INDEX
                label_ids += [first] + [IGNORE_INDEX] * (len(sub_ids) - 1)
            ids.append(tokenizer.sep_id)
            label_ids.append(IGNORE_INDEX)
            word_index.append(-1)
            rows["ids"].append(ids)
            rows["labels"].append(label_ids)
            rows["words"].append(word_index)
            rows["example"].append(e)
    S = max_seq_length
    feats = {
        "input_ids": pad_rows(rows["ids"], S, tokenizer.pad_id),
        "input_mask": pad_rows([[1] * len(r) for r in rows["ids"]], S, 0),
        "segment_ids": np.zeros((len(rows["ids"]), S), dtype=np.int32),
        "word_index": pad_rows(rows["words"], S, -1),
        "example_index": np.asarray(rows["example"], dtype=np.int32).reshape(-1),
    }
    if labelled:
        feats["label_ids"] = pad_rows(rows["labels"], S, IGNORE_INDEX)
    return feats


def words_from_token_labels(features: Features, token_label_ids: np.ndarray,
                            examples: Sequence[NerExample],
                            labels: Sequence[str] = NER_LABELS) -> list[list[str]]:
    """Label ids per token [F, S] -> one label per word, read at each word's first sub-token."""
    out: list[list[str | None]] = [[None] * len(ex.words) for ex in examples]
    for f, e in enumerate(features["example_index"]):
        for s in np.flatnonzero(features["word_index"][f] >= 0):
            out[e][features["word_index"][f, s]] = labels[int(token_label_ids[f, s])]
    for e, words in enumerate(out):
        if any(w is None for w in words):
            raise BertJaxError(f"example {e}: features do not cover all of its words")
    return out  # type: ignore[return-value]


class NerTask(Task):
    """CoNLL-2003 English named entities (PER, ORG, LOC, MISC), IOB2 labels."""

    name = "conll2003"
    kind = "token_classification"
    labels = NER_LABELS
    label_keys = ("label_ids",)
    main_metric = "f1"
    tfds_name = "conll2003"
    _files = {"train": ("train.txt", "eng.train"), "dev": ("valid.txt", "dev.txt", "eng.testa"),
              "test": ("test.txt", "eng.testb")}

    def read(self, split, data_dir=None, files=None, on_error="raise",
             scheme="iob2") -> ExampleList:
        path = resolve_file(split, self._files, data_dir, files)
        return read_conll(path, self.labels, scheme, on_error)

    def from_tfds(self, records, split, label_names=None) -> ExampleList:
        """tensorflow-datasets ``conll2003`` records (numpy) -> examples."""
        names = label_names or self.labels
        examples = []
        for n, rec in enumerate(records):
            words = tuple(t.decode("utf-8") if isinstance(t, bytes) else str(t)
                          for t in rec["tokens"])
            tags = tuple(names[int(i)] for i in rec["ner"])
            if len(words) != len(tags):
                raise BertJaxError(f"{self.tfds_name}:{split}: record {n} has {len(words)} "
                                   f"tokens but {len(tags)} tags")
            examples.append(NerExample(f"{n}", words, tags))
        return ExampleList(examples)

    def featurize(self, examples, tokenizer, max_seq_length, **opts) -> Features:
        if opts:
            raise BertJaxError(f"{self.name}: unknown featurize options {sorted(opts)}")
        return featurize_ner(examples, tokenizer, max_seq_length, self.labels)

    def postprocess(self, features, model_outputs, examples, **opts) -> list[list[str]]:
        """Logits [F, S, num_labels] -> a label per word of each example."""
        logits = np.asarray(model_outputs)
        if logits.shape[:2] != features["input_ids"].shape:
            raise BertJaxError(f"{self.name}: logits of shape {logits.shape} for features "
                               f"{features['input_ids'].shape}")
        return words_from_token_labels(features, np.argmax(logits, axis=-1), examples,
                                       self.labels)

    def metrics(self, predictions, examples) -> dict[str, float]:
        """conlleval: entity-level precision/recall/F1 (percent), per type, token accuracy."""
        if any(ex.labels is None for ex in examples):
            raise BertJaxError(f"{self.name}: examples without labels cannot be scored")
        return conlleval([ex.labels for ex in examples], predictions)

    def write_predictions(self, predictions, examples, output_dir, split) -> list[str]:
        """``predictions.txt``: ``token gold pred`` per line (conlleval's input), blank line
        between sentences; ``token pred`` when unlabelled."""
        path = os.path.join(output_dir, f"predictions.{split}.txt")
        lines = []
        for ex, pred in zip(examples, predictions, strict=True):
            golds = ex.labels if ex.labels is not None else [None] * len(ex.words)
            for word, gold, p in zip(ex.words, golds, pred, strict=True):
                lines.append(f"{word} {gold} {p}\n" if gold is not None else f"{word} {p}\n")
            lines.append("\n")
        atomic_write(path, "".join(lines))
        return [path]
