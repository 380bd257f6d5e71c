"""Learning a WordPiece ``vocab.txt`` from raw text, the way BERT's vocabularies are built
(and Hugging Face ``tokenizers``' WordPiece trainer works).

1. Pre-tokenize every line with BERT's basic tokenizer (the same code that encodes later:
   control characters dropped, punctuation and CJK characters split off, optional
   lower-casing and accent stripping) and count the words, in worker processes.
2. Spell each word as characters, every character after the first with the ``##``
   continuation prefix; the alphabet is the ``limit_alphabet`` most frequent characters
   (words with others are left out of the statistics) and enters the vocabulary in both
   forms, so every word over the alphabet can be encoded.
3. Merge the most frequent adjacent pair (``un`` + ``##aff`` -> ``unaff``) until the
   vocabulary holds ``vocab_size`` entries or no pair occurs ``min_frequency`` times.

The vocabulary is BERT's five special tokens first, then the alphabet, then the merges in
the order learned; :class:`~bert_jax.tokenization.wordpiece.WordPieceTokenizer` and
transformers' ``BertTokenizer`` read it identically.
"""

from __future__ import annotations

import collections

from bert_jax.errors import BertJaxError
from bert_jax.tokenization.base import SPECIAL_TOKENS
from bert_jax.tokenization.merge_training import count_words, learn_merges
from bert_jax.tokenization.wordpiece import WordPieceTokenizer

PREFIX = "##"


def _join(a: str, b: str) -> str:
    return a + b[len(PREFIX):]


def train_wordpiece(inputs: list[str], vocab_size: int, do_lower_case: bool = True,
                    strip_accents: bool | None = None, min_frequency: int = 2,
                    limit_alphabet: int = 1000, num_workers: int = 1):
    """Learns a WordPiece vocabulary from text files/directories. Returns
    (WordPieceTokenizer with the same casing options, CorpusReport)."""
    if vocab_size <= len(SPECIAL_TOKENS):
        raise BertJaxError(f"vocab_size={vocab_size} leaves no room beside the special tokens")
    if limit_alphabet <= 0:
        raise BertJaxError(f"limit_alphabet must be positive, got {limit_alphabet}")
    splitter = WordPieceTokenizer(list(SPECIAL_TOKENS), do_lower_case=do_lower_case,
                                  strip_accents=strip_accents)
    counts, report = count_words(inputs, splitter.basic_tokenize, num_workers)
    if not counts:
        raise BertJaxError(f"no usable text lines in {', '.join(inputs)} ({report.summary()})")
    chars: collections.Counter = collections.Counter()
    for word, n in counts.items():
        for c in word:
            chars[c] += n
    # Most frequent first; ties by character so that training is deterministic.
    alphabet = sorted(c for c, _ in sorted(chars.items(), key=lambda kv: (-kv[1], kv[0]))
                      [:limit_alphabet])
    keep = set(alphabet)
    tokens = list(SPECIAL_TOKENS)
    tokens += [c for c in alphabet if c not in SPECIAL_TOKENS]
    tokens += [PREFIX + c for c in alphabet]
    words = {}
    for word, n in counts.items():
        if word in SPECIAL_TOKENS or not keep.issuperset(word):
            continue
        words[(word[0], *(PREFIX + c for c in word[1:]))] = n
    known = set(tokens)
    budget = vocab_size - len(tokens)
    merges = learn_merges(words, max(0, budget), _join, min_frequency) if budget > 0 else []
    for _, _, merged in merges:
        if merged not in known:
            known.add(merged)
            tokens.append(merged)
    return WordPieceTokenizer(tokens[:vocab_size], do_lower_case=do_lower_case,
                              strip_accents=strip_accents, source="trained vocabulary"), report
