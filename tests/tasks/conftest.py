"""Shared fixtures: a small WordPiece vocabulary written as a real vocab.txt."""

import pytest

from bert_jax.tokenization.wordpiece import WordPieceTokenizer

VOCAB = [
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
    ".", ",", "?", "!", "'", '"', "(", ")", "-", "–",
    "the", "a", "an", "of", "in", "is", "was", "to", "and", "who", "what", "when", "where",
    "which", "team", "won", "game", "super", "bowl", "den", "##ver", "bron", "##cos", "city",
    "played", "at", "stadium", "levi", "##'", "##s", "san", "francisco", "football", "year",
    "1895", "1943", "born", "he", "she", "it", "paris", "france", "capital", "eu", "rejects",
    "german", "call", "boycott", "british", "lamb", "john", "smith", "lives", "new", "york",
    "un", "##believ", "##able", "man", "walks", "dog", "sits", "runs", "eats", "cat", "park",
    "good", "bad", "movie", "not", "great", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9",
]


@pytest.fixture
def vocab_file(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture
def tokenizer(vocab_file):
    return WordPieceTokenizer.from_vocab_file(vocab_file, do_lower_case=True)
