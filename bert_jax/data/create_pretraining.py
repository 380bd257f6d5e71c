"""``bert-jax create-pretraining-data``: raw text -> sharded TFRecord files of unmasked examples.

Input files are grouped (in sorted order, by size) into work units of about ``unit_bytes``; each
unit is read, split into documents, tokenized with ``Tokenizer.encode_batch`` and turned into
examples in a worker process with its own ``random.Random(seed, unit)``, so the output depends
only on the inputs, the tokenizer and the seed, never on the number of workers. Random next
segments come from other documents of the same unit (as Google's script draws them from the
files given to one run). A ``--holdout-fraction`` of the documents (not examples, so no held-out
text is seen in training) goes to ``eval-*`` shards.

Each record is a ``tf.train.Example`` with ``input_ids`` and ``segment_ids`` padded with [PAD]
and 0 to ``max_seq_length`` (fixed length, so the pipeline parses them with one dense
``parse_example`` per batch) and ``next_sentence_label`` (0 = true continuation / original
order, 1 = random next / swapped; always 0 in full_sentences mode). Masking happens later, in the
pipeline. With ``--pack`` each record is a packed row of up to ``--max-examples-per-row``
examples (``bert_jax/data/packing.py``): ``input_ids``/``segment_ids`` left-aligned, plus
``example_ids`` and ``position_ids`` per token and ``cls_positions``, ``next_sentence_label``
and ``example_slots`` per example slot (``examples`` counts rows then); with
``--knowledge-units`` a row's ``unit_ids`` number the units of all its examples in turn.

``metadata.json`` lists every shard with its example count, the settings, the tokenizer's
fingerprint, vocab size and special ids, and the counts of repaired and skipped input.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import multiprocessing as mp
import os
import random
import sys
import time
from typing import Any

from bert_jax import storage
from bert_jax.data import documents as document_shards
from bert_jax.data import instances, text
from bert_jax.data.example_proto import ExampleEncoder
from bert_jax.data.metadata import FORMAT_VERSION, write_metadata
from bert_jax.errors import BertJaxError
from bert_jax.tokenization.base import Tokenizer

DEFAULT_UNIT_BYTES = 1 << 20
# Repaired or skipped input, always reported (0 when nothing happened).
PROBLEM_COUNTS = ("files_not_text_skipped", "empty_files",
                  "documents_too_short", "sentences_without_tokens",
                  "random_next_from_same_document", "sop_one_token_chunks_skipped")


@dataclasses.dataclass(frozen=True)
class CreationConfig:
    max_seq_length: int = 128
    short_seq_prob: float = 0.1
    mode: str = "nsp"
    dupe_factor: int = 1
    seed: int = 12345
    input_format: str = "auto"
    holdout_fraction: float = 0.0
    output_format: str = "pairs"  # pairs | documents (paired in the pipeline)
    max_record_tokens: int = document_shards.DEFAULT_MAX_RECORD_TOKENS  # documents: chunk size
    # ERNIE knowledge masking: annotate phrases/entities per token (``unit_ids``) from the
    # lexicon's entries plus the built-in fallback (``bert_jax.data.knowledge_masking``).
    knowledge_units: bool = False
    knowledge_lexicon: tuple[str, ...] = ()
    # Packed rows: several examples per record (``bert_jax/data/packing.py``).
    pack: bool = False
    max_examples_per_row: int = 8

    def validate(self) -> None:
        if self.output_format not in document_shards.FORMATS:
            raise BertJaxError(f"--format {self.output_format!r}: expected one of "
                               f"{document_shards.FORMATS}")
        if self.knowledge_units and self.output_format != "pairs":
            raise BertJaxError("--knowledge-units annotates finished examples: use --format "
                               "pairs")
        if self.pack and self.output_format != "pairs":
            raise BertJaxError("--pack packs finished examples: use --format pairs")
        if self.max_examples_per_row < 1:
            raise BertJaxError(f"--max-examples-per-row {self.max_examples_per_row}: must be "
                               ">= 1")
        if self.max_record_tokens < 0:
            raise BertJaxError(f"--max-record-tokens {self.max_record_tokens}: must be >= 0")
        if self.mode not in instances.MODES:
            raise BertJaxError(f"--mode {self.mode!r}: expected one of {instances.MODES}")
        if self.input_format not in text.INPUT_FORMATS:
            raise BertJaxError(f"--input-format {self.input_format!r}: expected one of "
                               f"{text.INPUT_FORMATS}")
        if self.max_seq_length < 5:
            raise BertJaxError(f"--max-seq-length {self.max_seq_length}: must be at least 5")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise BertJaxError(f"--short-seq-prob {self.short_seq_prob}: must be in [0, 1]")
        if self.dupe_factor < 1:
            raise BertJaxError(f"--dupe-factor {self.dupe_factor}: must be >= 1")
        if not 0.0 <= self.holdout_fraction < 1.0:
            raise BertJaxError(f"--holdout-fraction {self.holdout_fraction}: must be in [0, 1)")


def group_files(files: list[str], unit_bytes: int) -> list[list[str]]:
    """Consecutive files packed into units of about ``unit_bytes`` (a big file is its own)."""
    units: list[list[str]] = []
    size = 0
    for path in files:
        if not units or size >= unit_bytes:
            units.append([])
            size = 0
        units[-1].append(path)
        size += storage.getsize(path)
    return units


# ---- worker side (no tensorflow) ---------------------------------------------------------------
_WORKER: dict[str, Any] = {}


def _init_worker(tokenizer: Tokenizer, config: CreationConfig) -> None:
    _WORKER["tokenizer"] = tokenizer
    _WORKER["config"] = config
    _WORKER["encoder"] = ExampleEncoder(max(tokenizer.vocab_size, config.max_seq_length, 2))
    _WORKER["lexicon_ids"] = (tokenizer.encode_batch(sorted(set(config.knowledge_lexicon)))
                              if config.knowledge_lexicon else [])


def _serialize(examples: list[instances.Example], max_seq_length: int, pad_id: int,
               encoder: ExampleEncoder, matcher=None) -> list[bytes]:
    out = []
    for ids, segs, label in examples:
        pad = max_seq_length - len(ids)
        features = {"input_ids": ids + [pad_id] * pad, "segment_ids": segs + [0] * pad,
                    "next_sentence_label": [label]}
        if matcher is not None:
            features["unit_ids"] = matcher.annotate(ids) + [0] * pad
        out.append(encoder.encode(features))
    return out


def _serialize_packed(examples: list[instances.Example], config: CreationConfig, pad_id: int,
                      encoder: ExampleEncoder, seed: int, matcher=None) -> list[bytes]:
    """Packed rows of ``examples`` (best-fit decreasing, placement seeded by ``seed``), in an
    order drawn from ``seed`` (best-fit makes them longest example first).

    With ``matcher`` (knowledge units) each row also carries ``unit_ids``, numbered across
    the row: an example's units continue after the previous example's, so equal ids never
    span two examples."""
    from bert_jax.data import packing

    k, length = config.max_examples_per_row, config.max_seq_length
    rows = packing.pack_lengths([len(e[0]) for e in examples], length, k, seed=seed)
    random.Random(seed).shuffle(rows)
    out = []
    for row in rows:
        ids, segs, example_ids, positions, unit_ids = [], [], [], [], []
        cls_positions, labels = [0] * k, [0] * k
        units_so_far = 0
        for slot, i in enumerate(row.tolist()):
            example_ids_i, segs_i, label = examples[i]
            cls_positions[slot], labels[slot] = len(ids), label
            if matcher is not None:
                units = matcher.annotate(example_ids_i)  # 0, or 1..m in order
                unit_ids += [u + units_so_far if u else 0 for u in units]
                units_so_far += max(units, default=0)
            ids += example_ids_i
            segs += segs_i
            example_ids += [slot + 1] * len(example_ids_i)
            positions += range(len(example_ids_i))
        pad = length - len(ids)
        features = {
            "input_ids": ids + [pad_id] * pad, "segment_ids": segs + [0] * pad,
            "example_ids": example_ids + [0] * pad, "position_ids": positions + [0] * pad,
            "cls_positions": cls_positions, "next_sentence_label": labels,
            "example_slots": [1] * len(row) + [0] * (k - len(row))}
        if matcher is not None:
            features["unit_ids"] = unit_ids + [0] * pad
        out.append(encoder.encode(features))
    return out


def _knowledge_matcher(tokenizer: Tokenizer, sentences: list[str], stats):
    """Lexicon units plus the units the built-in fallback finds in this work unit."""
    from bert_jax.data import knowledge_masking

    found = knowledge_masking.discover_units(sentences)
    ids = _WORKER["lexicon_ids"] + (tokenizer.encode_batch(found) if found else [])
    matcher = knowledge_masking.UnitMatcher(ids, tokenizer.word_start_mask())
    stats["knowledge_units_known"] += matcher.num_units
    return matcher


def process_unit(unit_index: int, paths: list[str]) -> dict[str, Any]:
    """Reads, tokenizes and makes examples for one work unit (runs in a worker)."""
    tokenizer: Tokenizer = _WORKER["tokenizer"]
    config: CreationConfig = _WORKER["config"]
    stats: collections.Counter = collections.Counter()
    documents: list[list[str]] = []
    for path in paths:
        f = text.read_text_file(path)
        stats["files"] += 1
        stats["bytes"] += f.bytes
        fmt = text.detect_format(f.text) if config.input_format == "auto" else config.input_format
        stats[f"files_{fmt}"] += 1
        docs = text.split_documents(f.text, fmt)
        if not docs:
            stats["empty_files"] += 1
        documents.extend(docs)

    sentences = [s for d in documents for s in d]
    encoded = iter(tokenizer.encode_batch(sentences))
    token_docs: list[list[list[int]]] = []
    for doc in documents:
        token_doc = []
        for _ in doc:
            ids = next(encoded)
            if ids:
                token_doc.append(ids)
            else:
                stats["sentences_without_tokens"] += 1
        stats["documents"] += 1
        stats["sentences"] += len(doc)
        if not instances.document_is_usable(token_doc, _usability_mode(config)):
            stats["documents_too_short"] += 1
            continue
        if len(token_doc) == 1:
            stats["single_sentence_documents"] += 1
        token_docs.append(token_doc)
        stats["tokens"] += sum(len(s) for s in token_doc)

    matcher = _knowledge_matcher(tokenizer, sentences, stats) if config.knowledge_units \
        else None
    rng = random.Random(config.seed * 1_000_003 + unit_index)
    pools: dict[str, list] = {"train": [], "eval": []}
    for index, doc in enumerate(token_docs):
        held_out = config.holdout_fraction > 0 and rng.random() < config.holdout_fraction
        pools["eval" if held_out else "train"].append((index, doc))
    records = {}
    for split, pool in pools.items():
        stats[f"{split}_documents"] += len(pool)
        if config.output_format == "documents":
            records[split] = document_shards.encode_documents(pool, unit_index,
                                                        config.max_record_tokens,
                                                        _WORKER["encoder"])
            continue
        examples = instances.create_examples(
            [doc for _, doc in pool], config.mode, config.max_seq_length, config.short_seq_prob,
            config.dupe_factor, rng, tokenizer.cls_id, tokenizer.sep_id, stats)
        if config.pack:
            stats[f"{split}_packed_examples"] += len(examples)
            records[split] = _serialize_packed(examples, config, tokenizer.pad_id,
                                               _WORKER["encoder"],
                                               config.seed * 1_000_003 + unit_index, matcher)
            continue
        records[split] = _serialize(examples, config.max_seq_length, tokenizer.pad_id,
                                    _WORKER["encoder"], matcher)
    return {"unit": unit_index, "records": records, "stats": stats}


def _usability_mode(config: CreationConfig) -> str:
    """Document shards keep every document with a token (the pairing is chosen later)."""
    return config.mode if config.output_format == "pairs" else "nsp"


def _run_unit(args: tuple[int, list[str]]) -> dict[str, Any]:
    return process_unit(*args)


# ---- main process -----------------------------------------------------------------------------
class _ShardWriter:
    """Round-robin writer over ``prefix-XXXXX-of-YYYYY.tfrecord`` files."""

    def __init__(self, output_dir: str, prefix: str, num_shards: int):
        import tensorflow as tf

        self.names = [f"{prefix}-{i:05d}-of-{num_shards:05d}.tfrecord"
                      for i in range(num_shards)]
        # output_dir is the local staging folder (bert_jax.data.output)
        self._writers = [tf.io.TFRecordWriter(os.path.join(output_dir, n))  # local: staging
                         for n in self.names]
        self.counts = [0] * num_shards
        self._next = 0

    def write(self, records: list[bytes]) -> None:
        for record in records:
            self._writers[self._next].write(record)
            self.counts[self._next] += 1
            self._next = (self._next + 1) % len(self._writers)

    def close(self) -> list[dict[str, Any]]:
        for w in self._writers:
            w.close()
        return [{"file": n, "examples": c} for n, c in zip(self.names, self.counts, strict=True)]


def create_pretraining_data(inputs: list[str], tokenizer: Tokenizer, output_dir: str,
                            config: CreationConfig, num_shards: int = 1, num_workers: int = 1,
                            unit_bytes: int = DEFAULT_UNIT_BYTES,
                            progress: bool = True) -> dict[str, Any]:
    """Writes shards and ``metadata.json`` into ``output_dir``; returns the metadata dict.

    The data is written under a staging directory beside ``output_dir`` and swapped in
    complete (``bert_jax.data.output``): earlier data in ``output_dir`` stays readable until
    then, and an interrupted run leaves it untouched."""
    from bert_jax.data.output import staged_data_directory

    with staged_data_directory(output_dir) as staging:
        return _create_pretraining_data(inputs, tokenizer, staging, config, num_shards,
                                        num_workers, unit_bytes, progress)


def _create_pretraining_data(inputs: list[str], tokenizer: Tokenizer, output_dir: str,
                             config: CreationConfig, num_shards: int = 1,
                             num_workers: int = 1, unit_bytes: int = DEFAULT_UNIT_BYTES,
                             progress: bool = True) -> dict[str, Any]:
    config.validate()
    if num_shards < 1:
        raise BertJaxError(f"--num-shards {num_shards}: must be >= 1")
    files, not_text = text.list_text_input_files(inputs)
    units = group_files(files, unit_bytes)
    total_bytes = sum(storage.getsize(f) for f in files)
    storage.makedirs(output_dir)
    num_eval_shards = max(1, round(num_shards * config.holdout_fraction))
    train = _ShardWriter(output_dir, "train", num_shards)
    holdout = _ShardWriter(output_dir, "eval", num_eval_shards) if config.holdout_fraction else None
    stats: collections.Counter = collections.Counter({k: 0 for k in PROBLEM_COUNTS})
    stats["files_not_text_skipped"] = not_text
    start = time.time()

    from tqdm import tqdm

    bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="create-pretraining-data",
               disable=not progress, file=sys.stderr)
    jobs = list(enumerate(units))
    if num_workers <= 1:
        _init_worker(tokenizer, config)
        results = map(_run_unit, jobs)
        pool = None
    else:  # spawn: the parent holds tensorflow's threads, which fork would copy half-locked;
        # a worker that dies raises BrokenProcessPool here instead of hanging.
        pool = concurrent.futures.ProcessPoolExecutor(
            num_workers, mp_context=mp.get_context("spawn"), initializer=_init_worker,
            initargs=(tokenizer, config))
        results = pool.map(_run_unit, jobs)
    try:
        for result in results:  # in unit order, whatever the number of workers
            train.write(result["records"]["train"])
            if holdout is not None:
                holdout.write(result["records"]["eval"])
            stats.update(result["stats"])
            bar.update(result["stats"]["bytes"])
    finally:
        bar.close()
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    train_shards = train.close()
    eval_shards = holdout.close() if holdout is not None else []
    seconds = time.time() - start

    num_train = sum(s["examples"] for s in train_shards)
    if stats["tokens"] == 0 or num_train == 0:
        for name in [s["file"] for s in train_shards + eval_shards]:
            storage.remove(storage.join(output_dir, name))
        raise BertJaxError(f"--input {' '.join(inputs)}: empty corpus ({stats['files']} files, "
                           f"{stats['documents']} documents, {stats['tokens']} usable tokens, "
                           f"{stats['documents_too_short']} documents too short)")
    metadata = {
        "format_version": FORMAT_VERSION,
        "mode": config.mode,
        "max_seq_length": config.max_seq_length,
        "short_seq_prob": config.short_seq_prob,
        "dupe_factor": config.dupe_factor,
        "seed": config.seed,
        "input_format": config.input_format,
        "holdout_fraction": config.holdout_fraction,
        "knowledge_units": config.knowledge_units,
        "packed": config.pack,
        **({"max_examples_per_row": config.max_examples_per_row,
            "packed_examples": {split: stats.get(f"{split}_packed_examples", 0)
                                for split in ("train", "eval")}} if config.pack else {}),
        "features": {
            "input_ids": f"int64[{config.max_seq_length}], padded with [PAD]",
            "segment_ids": f"int64[{config.max_seq_length}], padded with 0",
            "next_sentence_label": "int64[1]: 1 = random next (nsp) / swapped (sop); 0 in "
                                   "full_sentences",
            **({"unit_ids": f"int64[{config.max_seq_length}]: 0 outside phrases/entities, "
                            "1, 2, ... per unit"} if config.knowledge_units else {}),
            **(_packed_features(config) if config.pack else {}),
        },
        "tokenizer": {
            "kind": tokenizer.kind,
            "fingerprint": tokenizer.fingerprint(),
            "vocab_size": tokenizer.vocab_size,
            "special_ids": {role: tokenizer.token_to_id(token)
                            for role, token in tokenizer.special_tokens.items()},
        },
        "splits": {
            "train": {"examples": num_train, "shards": train_shards},
            "eval": {"examples": sum(s["examples"] for s in eval_shards),
                     "shards": eval_shards},
        },
        "input": {"paths": list(inputs), "work_units": len(units), **dict(sorted(stats.items()))},
        "seconds": round(seconds, 3),
        "mb_per_second": round(total_bytes / 1e6 / max(seconds, 1e-9), 3),
    }
    if config.output_format == "documents":
        metadata.update(documents_metadata(config, metadata))
    write_metadata(output_dir, metadata)
    return metadata


def _packed_features(config: CreationConfig) -> dict[str, str]:
    """metadata.json's description of the features of packed rows."""
    n, k = config.max_seq_length, config.max_examples_per_row
    return {
        "input_ids": f"int64[{n}]: up to {k} examples one after another, then [PAD]",
        "segment_ids": f"int64[{n}]: each example's own segments, padded with 0",
        "example_ids": f"int64[{n}]: 0 at padding, 1..{k} = the example slot of the token",
        "position_ids": f"int64[{n}]: positions restarting at 0 for each example",
        "cls_positions": f"int64[{k}]: each slot's first token (0 for an empty slot)",
        "next_sentence_label": f"int64[{k}]: per slot, as unpacked (0 for an empty slot)",
        "example_slots": f"int64[{k}]: 1 where the slot holds an example",
        **({"unit_ids": f"int64[{n}]: 0 outside phrases/entities, 1, 2, ... per unit, "
                        "numbered on across the row's examples (a unit lies in one example)"}
           if config.knowledge_units else {}),
    }


def documents_metadata(config: CreationConfig, metadata: dict[str, Any]) -> dict[str, Any]:
    """What differs in metadata.json for document shards (``examples`` counts records)."""
    stats = metadata["input"]
    splits = {split: {**metadata["splits"][split],
                      "documents": stats.get(f"{split}_documents", 0)}
              for split in ("train", "eval")}
    return {
        "format": "documents", "mode": None, "max_seq_length": 0,
        "max_record_tokens": config.max_record_tokens,
        "boundaries": "lines" if config.input_format == "lines" else
        "sentences (paragraphs layout) or lines (lines layout), per file; see input.files_*",
        "features": {
            "token_ids": "int64[n]: a document, or a chunk of at most max_record_tokens tokens "
                         "of whole sentences",
            "sentence_lengths": "int64[k]: its sentences (lines), sum = n",
            "document": "int64[3]: (work unit, document in unit, chunk)",
        },
        "splits": splits,
    }


def summary(metadata: dict[str, Any]) -> str:
    s = metadata["input"]
    lines = [
        f"wrote {metadata['splits']['train']['examples']} train "
        f"{'records' if metadata.get('format') == 'documents' else 'examples'} in "
        f"{len(metadata['splits']['train']['shards'])} shards"
        + (f" and {metadata['splits']['eval']['examples']} eval examples"
           if metadata["splits"]["eval"]["shards"] else ""),
        f"input: {s.get('files', 0)} files, {s.get('bytes', 0) / 1e6:.1f} MB, "
        f"{s.get('documents', 0)} documents, {s.get('sentences', 0)} sentences, "
        f"{s.get('tokens', 0)} tokens ({metadata['mb_per_second']} MB/s)",
    ]
    if metadata.get("packed"):
        lines.insert(1, f"packed {s.get('train_packed_examples', 0)} train examples, at most "
                        f"{metadata['max_examples_per_row']} a row")
    problems = {k: s[k] for k in PROBLEM_COUNTS if s.get(k)}
    if problems:
        lines.append("repaired/skipped: " + ", ".join(f"{k}={v}" for k, v in problems.items()))
    return "\n".join(lines)
