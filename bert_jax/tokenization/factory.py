"""``load_tokenizer``: the one place that knows every tokenizer kind and picks one for a saved
directory or a bare vocabulary file."""

from __future__ import annotations

import json
import os

from bert_jax.errors import BertJaxError
from bert_jax.tokenization.base import TOKENIZER_JSON, Tokenizer
from bert_jax.tokenization.bpe import MERGES_FILE, ByteLevelBPETokenizer
from bert_jax.tokenization.sentencepiece import SentencePieceTokenizer
from bert_jax.tokenization.wordpiece import WordPieceTokenizer


def load_tokenizer(directory: str) -> Tokenizer:
    """Loads a tokenizer saved with ``Tokenizer.save`` (or a bare ``vocab.txt``/``*.model``)."""
    if os.path.isfile(directory):
        if directory.endswith(".model"):
            return SentencePieceTokenizer(directory)
        return WordPieceTokenizer.from_vocab_file(directory)
    meta_path = os.path.join(directory, TOKENIZER_JSON)
    if os.path.exists(meta_path):
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
        kind = meta.get("kind")
        if kind == "wordpiece":
            return WordPieceTokenizer.load(directory)
        if kind == "sentencepiece":
            return SentencePieceTokenizer.load(directory)
        if kind == "bpe":
            return ByteLevelBPETokenizer.load(directory)
        raise BertJaxError(f"{meta_path}: unknown tokenizer kind {kind!r}")
    if os.path.exists(os.path.join(directory, MERGES_FILE)):
        return ByteLevelBPETokenizer.from_files(os.path.join(directory, "vocab.json"),
                                                os.path.join(directory, MERGES_FILE))
    if os.path.exists(os.path.join(directory, "vocab.txt")):
        return WordPieceTokenizer.from_vocab_file(os.path.join(directory, "vocab.txt"))
    models = [f for f in os.listdir(directory) if f.endswith(".model")] if os.path.isdir(
        directory) else []
    if len(models) == 1:
        return SentencePieceTokenizer(os.path.join(directory, models[0]))
    raise BertJaxError(f"{directory}: no tokenizer found (expected {TOKENIZER_JSON}, vocab.txt, "
                       "vocab.json + merges.txt or one SentencePiece .model file)")
