"""Tokenizers behind one interface (see ``base.Tokenizer``); ``factory.load_tokenizer`` picks
the kind a saved directory holds."""

from bert_jax.tokenization.base import SPECIAL_TOKENS, Encoding, Tokenizer
from bert_jax.tokenization.factory import load_tokenizer

__all__ = ["SPECIAL_TOKENS", "Encoding", "Tokenizer", "load_tokenizer"]
