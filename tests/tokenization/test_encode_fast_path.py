"""WordPiece's direct-id ``encode`` equals the generic ``Tokenizer.encode`` (token strings),
with pairs, truncation, literal special tokens and non-ASCII text; ``pad_rows`` fills rows."""

from __future__ import annotations

import numpy as np
import pytest

from bert_jax.tasks.base import pad_rows
from bert_jax.tokenization.base import Tokenizer
from bert_jax.tokenization.wordpiece import WordPieceTokenizer

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat",
         "un", "##believ", "##able", ".", ",", "caf", "##e", "!"]

TEXTS = [("the cat sat on the mat .", None), ("unbelievable !", "the cat, the mat"),
         ("Café [MASK] sat", "on [SEP] the mat"), ("", "the"), ("zebra cat", None),
         ("the " * 30, "cat " * 20)]


@pytest.mark.parametrize("max_length", [None, 4, 9, 64])
@pytest.mark.parametrize("strategy", ["longest_first", "only_second"])
def test_direct_ids_equal_generic_encode(max_length, strategy):
    tok = WordPieceTokenizer(VOCAB, do_lower_case=True)
    for a, b in TEXTS:
        if max_length is not None and max_length < 3:
            continue
        assert tok.encode(a, b, max_length=max_length, truncation=strategy) == \
            Tokenizer.encode(tok, a, b, max_length=max_length, truncation=strategy)


def test_pad_rows():
    out = pad_rows([[1, 2, 3], [], [4]], 4, 0)
    np.testing.assert_array_equal(out, [[1, 2, 3, 0], [0, 0, 0, 0], [4, 0, 0, 0]])
    assert out.dtype == np.int32
    assert pad_rows([], 3, 0).shape == (0, 3)
    with pytest.raises(ValueError, match="row of 5 > 4"):
        pad_rows([[1] * 5], 4, 0)
