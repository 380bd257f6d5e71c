"""Tokenizers behind one interface (see ``base.Tokenizer``)."""

from bert_jax.tokenization.base import SPECIAL_TOKENS, Encoding, Tokenizer, load_tokenizer

__all__ = ["SPECIAL_TOKENS", "Encoding", "Tokenizer", "load_tokenizer"]
