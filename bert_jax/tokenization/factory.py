"""``load_tokenizer``: the one place that knows every tokenizer kind and picks one for a saved
directory or a bare vocabulary file."""

from __future__ import annotations

import json

from bert_jax import storage
from bert_jax.errors import BertJaxError
from bert_jax.tokenization.base import TOKENIZER_JSON, Tokenizer
from bert_jax.tokenization.bpe import MERGES_FILE, ByteLevelBPETokenizer
from bert_jax.tokenization.sentencepiece import SentencePieceTokenizer
from bert_jax.tokenization.wordpiece import WordPieceTokenizer


def load_tokenizer(directory: str) -> Tokenizer:
    """Loads a tokenizer saved with ``Tokenizer.save`` (or a bare ``vocab.txt``/``*.model``)."""
    if storage.isfile(directory):
        if directory.endswith(".model"):
            return SentencePieceTokenizer(directory)
        return WordPieceTokenizer.from_vocab_file(directory)
    meta_path = storage.join(directory, TOKENIZER_JSON)
    if storage.exists(meta_path):
        meta = json.loads(storage.read_text(meta_path))
        kind = meta.get("kind")
        if kind == "wordpiece":
            return WordPieceTokenizer.load(directory)
        if kind == "sentencepiece":
            return SentencePieceTokenizer.load(directory)
        if kind == "bpe":
            return ByteLevelBPETokenizer.load(directory)
        raise BertJaxError(f"{meta_path}: unknown tokenizer kind {kind!r}")
    if storage.exists(storage.join(directory, MERGES_FILE)):
        return ByteLevelBPETokenizer.from_files(storage.join(directory, "vocab.json"),
                                                storage.join(directory, MERGES_FILE))
    if storage.exists(storage.join(directory, "vocab.txt")):
        return WordPieceTokenizer.from_vocab_file(storage.join(directory, "vocab.txt"))
    models = [f for f in storage.listdir(directory) if f.endswith(".model")] if storage.isdir(
        directory) else []
    if len(models) == 1:
        return SentencePieceTokenizer(storage.join(directory, models[0]))
    raise BertJaxError(f"{directory}: no tokenizer found (expected {TOKENIZER_JSON}, vocab.txt, "
                       "vocab.json + merges.txt or one SentencePiece .model file)")
