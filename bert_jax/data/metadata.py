"""``metadata.json`` written beside pretraining shards, and its checks against a tokenizer."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from bert_jax import storage
from bert_jax.errors import BertJaxError

METADATA_JSON = "metadata.json"
FORMAT_VERSION = 1


@dataclasses.dataclass
class PretrainingDataConfig:
    """What the pipeline needs to know about a directory of pretraining shards."""

    directory: str
    mode: str  # nsp | sop | full_sentences
    max_seq_length: int  # every stored example is padded to this length
    vocab_size: int
    tokenizer_fingerprint: str
    special_ids: dict[str, int]  # pad, unk, cls, sep, mask
    train_files: list[str]  # absolute paths
    train_examples: list[int]  # per file
    eval_files: list[str]
    eval_examples: list[int]
    raw: dict[str, Any]  # the whole metadata.json
    # pairs: finished examples (max_seq_length, mode fixed); documents: tokenized documents,
    # paired in the pipeline (bert_jax.data.documents), max_seq_length 0 and mode None.
    format: str = "pairs"

    @property
    def pad_id(self) -> int:
        return self.special_ids["pad"]

    @property
    def mask_id(self) -> int:
        return self.special_ids["mask"]

    def files(self, split: str) -> tuple[list[str], list[int]]:
        if split == "train":
            return self.train_files, self.train_examples
        if split == "eval":
            return self.eval_files, self.eval_examples
        raise BertJaxError(f"split {split!r}: expected 'train' or 'eval'")

    def check_tokenizer(self, tokenizer) -> None:
        """Raises BertJaxError unless ``tokenizer`` is the one the data was made with."""
        path = storage.join(self.directory, METADATA_JSON)
        if tokenizer.vocab_size != self.vocab_size:
            raise BertJaxError(f"{path}: data vocab_size {self.vocab_size} != tokenizer "
                               f"vocab_size {tokenizer.vocab_size}")
        if tokenizer.fingerprint() != self.tokenizer_fingerprint:
            raise BertJaxError(f"{path}: data was made with tokenizer "
                               f"{self.tokenizer_fingerprint}, not {tokenizer.fingerprint()}")

    def check_model(self, vocab_size: int, max_position_embeddings: int | None = None) -> None:
        """Raises BertJaxError if the data does not fit a model of this size."""
        path = storage.join(self.directory, METADATA_JSON)
        if vocab_size < self.vocab_size:
            raise BertJaxError(f"{path}: data vocab_size {self.vocab_size} exceeds the model's "
                               f"vocab_size {vocab_size}")
        if max_position_embeddings is not None and self.max_seq_length > max_position_embeddings:
            raise BertJaxError(f"{path}: max_seq_length {self.max_seq_length} exceeds the "
                               f"model's max_position_embeddings {max_position_embeddings}")


def write_metadata(directory: str, metadata: dict[str, Any]) -> str:
    """Writes ``metadata.json`` atomically (a temporary name, then rename)."""
    from bert_jax.fileio import atomic_write_json

    return atomic_write_json(storage.join(directory, METADATA_JSON), metadata)


def load_metadata(directory: str) -> PretrainingDataConfig:
    """Reads ``directory/metadata.json``; BertJaxError if missing, malformed or files are gone."""
    path = storage.join(directory, METADATA_JSON)
    if not storage.exists(path):
        raise BertJaxError(f"{path}: not found (run `bert-jax create-pretraining-data` first)")
    try:
        raw = json.loads(storage.read_text(path))
        tok = raw["tokenizer"]
        splits = {}
        for split in ("train", "eval"):
            entry = raw["splits"][split]
            names = [s["file"] for s in entry["shards"]]
            counts = [int(s["examples"]) for s in entry["shards"]]
            splits[split] = ([storage.join(directory, n) for n in names], counts)
        config = PretrainingDataConfig(
            directory=directory, mode=raw["mode"], max_seq_length=int(raw["max_seq_length"]),
            vocab_size=int(tok["vocab_size"]), tokenizer_fingerprint=tok["fingerprint"],
            special_ids={k: int(v) for k, v in tok["special_ids"].items()},
            train_files=splits["train"][0], train_examples=splits["train"][1],
            eval_files=splits["eval"][0], eval_examples=splits["eval"][1], raw=raw,
            format=raw.get("format", "pairs"))
    except (KeyError, TypeError, ValueError) as e:
        raise BertJaxError(f"{path}: malformed metadata ({type(e).__name__}: {e})") from e
    if raw.get("format_version") != FORMAT_VERSION:
        raise BertJaxError(f"{path}: format_version {raw.get('format_version')!r}, expected "
                           f"{FORMAT_VERSION}")
    missing = [f for f in config.train_files + config.eval_files if not storage.exists(f)]
    if missing:
        raise BertJaxError(f"{path}: shard {missing[0]} is missing ({len(missing)} missing)")
    from bert_jax.data.shards import check_shards

    sizes = [s.get("bytes") for split in ("train", "eval") for s in raw["splits"][split]["shards"]]
    check_shards(path, config.train_files + config.eval_files,
                 config.train_examples + config.eval_examples, sizes)
    return config
