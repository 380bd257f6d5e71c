"""BERT WordPiece tokenizer: basic tokenization + greedy longest-match-first word pieces.

Matches Hugging Face's ``BertTokenizer`` (the ``tokenizers``-backed one in transformers 5, whose
normalizer is Google BERT's ``BasicTokenizer``): control characters removed, whitespace split,
CJK ideographs split into single-character words, accents stripped (NFD, drop Mn) and
lowercased when uncased, punctuation (Unicode P* and ASCII non-alphanumerics) split off, then
word pieces with ``##`` continuations; a word longer than ``max_input_chars_per_word``
characters or with no segmentation becomes ``[UNK]``. Special tokens written literally in the
text (``"Paris is the [MASK] ."``) stay single tokens, as in Hugging Face.

Pure Python but fast: ASCII text takes a ``str.translate`` + one regex path, other text uses
regexes compiled once from the Unicode tables, and word -> ids results are cached.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata

import numpy as np

from bert_jax import fileio, storage
from bert_jax.errors import BertJaxError
from bert_jax.tokenization.base import (
    SPECIAL_TOKENS,
    TOKENIZER_JSON,
    TableTokenizer,
    read_metadata,
    write_metadata,
)

VOCAB_FILE = "vocab.txt"
_CACHE_LIMIT = 1 << 19  # words; the cache is cleared when it grows past this

# ASCII control characters BERT deletes (tab, newline and carriage return are whitespace).
_ASCII_DELETE = {c: None for c in [*range(0, 9), 11, 12, *range(14, 32), 127]}
_ASCII_WORD_RE = re.compile(r"[A-Za-z0-9]+|[^\sA-Za-z0-9]")

# BERT's "Chinese character" blocks (CJK Unified Ideographs and extensions). Extension E is
# taken from U+2B920 as the Hugging Face normalizer does (Google's Python code says U+2B820).
_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
               (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def _char_class(codepoints: list[int]) -> str:
    """Sorted code points -> a regex character class body of ranges."""
    parts, i = [], 0
    while i < len(codepoints):
        j = i
        while j + 1 < len(codepoints) and codepoints[j + 1] == codepoints[j] + 1:
            j += 1
        lo, hi = re.escape(chr(codepoints[i])), re.escape(chr(codepoints[j]))
        parts.append(lo if i == j else f"{lo}-{hi}")
        i = j + 1
    return "".join(parts)


@functools.cache
def _unicode_regexes() -> tuple[re.Pattern, re.Pattern, re.Pattern, re.Pattern]:
    """(delete, cjk, nonspacing-mark, word) regexes built once from ``unicodedata``."""
    delete, marks, punct = [], [], []
    for cp in range(sys.maxunicode + 1):
        cat = unicodedata.category(chr(cp))
        # Unassigned (Cn) code points stay: the Rust normalizer keeps them (then [UNK]).
        if cat in ("Cc", "Cf", "Co", "Cs") and cp not in (9, 10, 13) or cp == 0xFFFD:
            delete.append(cp)
        elif cat == "Mn":
            marks.append(cp)
        if cat[0] == "P" or (33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96
                             or 123 <= cp <= 126):
            punct.append(cp)
    cjk = "".join(f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in _CJK_RANGES)
    p = _char_class(punct)
    return (re.compile(f"[{_char_class(delete)}]+"), re.compile(f"[{cjk}]"),
            re.compile(f"[{_char_class(marks)}]+"), re.compile(rf"[^\s{p}]+|[{p}]"))


def read_vocab_file(path: str) -> list[str]:
    """One token per line, the line number is its id (BERT ``vocab.txt``)."""
    if not storage.isfile(path):
        raise BertJaxError(f"{path}: vocabulary file not found")
    data = storage.read_bytes(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise BertJaxError(f"{path}:{line}: vocabulary is not valid UTF-8") from None
    tokens = text.split("\n")
    if tokens and tokens[-1] == "":
        tokens.pop()
    return [t.rstrip("\r") for t in tokens]


def infer_lower_case(tokens: list[str]) -> bool:
    """True (uncased) when no word token except bracketed specials starts with a letter that
    lowercasing changes (symbols such as U+211D, upper-case with no lower form, don't count)."""
    return not any(t[:1] != t[:1].lower() for t in tokens
                   if not (t.startswith("[") and t.endswith("]")) and not t.startswith("##"))


class WordPieceTokenizer(TableTokenizer):
    """BERT WordPiece over a ``vocab.txt`` vocabulary (cased or uncased)."""

    kind = "wordpiece"

    def __init__(self, vocab: list[str] | dict[str, int], do_lower_case: bool = True,
                 strip_accents: bool | None = None, tokenize_chinese_chars: bool = True,
                 max_input_chars_per_word: int = 100, split_special_tokens: bool = False,
                 source: str = "vocabulary"):
        if isinstance(vocab, dict):
            size = max(vocab.values(), default=-1) + 1
            tokens = [""] * size
            for token, i in vocab.items():
                tokens[i] = token
            vocab = dict(vocab)
        else:
            tokens = list(vocab)
            vocab = {t: i for i, t in enumerate(tokens)}  # duplicates: last id wins (HF)
        missing = [t for t in SPECIAL_TOKENS if t not in vocab]
        if missing:
            raise BertJaxError(f"{source}: special token(s) {', '.join(missing)} missing from the "
                               f"vocabulary (BERT needs {', '.join(SPECIAL_TOKENS)})")
        self.do_lower_case = bool(do_lower_case)
        self.strip_accents = strip_accents
        self.tokenize_chinese_chars = bool(tokenize_chinese_chars)
        self.max_input_chars_per_word = int(max_input_chars_per_word)
        self.split_special_tokens = bool(split_special_tokens)
        self._strip = self.do_lower_case if strip_accents is None else bool(strip_accents)
        self._set_table(tokens, vocab, "[UNK]")
        self._max_piece = max((len(t) for t in self._vocab), default=1)
        self._special_re = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS))

    # ---- construction / persistence ------------------------------------------------------
    @classmethod
    def from_vocab_file(cls, path: str, do_lower_case: bool | None = None,
                        **options) -> WordPieceTokenizer:
        """Reads a BERT ``vocab.txt``; infers casing from the vocabulary when not given."""
        tokens = read_vocab_file(path)
        if do_lower_case is None:
            do_lower_case = infer_lower_case(tokens)
        return cls(tokens, do_lower_case=do_lower_case, source=path, **options)

    def options(self) -> dict:
        return {"do_lower_case": self.do_lower_case, "strip_accents": self.strip_accents,
                "tokenize_chinese_chars": self.tokenize_chinese_chars,
                "max_input_chars_per_word": self.max_input_chars_per_word,
                "split_special_tokens": self.split_special_tokens}

    def save(self, directory: str) -> None:
        storage.makedirs(directory)
        fileio.atomic_write(storage.join(directory, VOCAB_FILE),
                            "".join(t + "\n" for t in self._tokens))
        meta = {"kind": self.kind, "vocab_file": VOCAB_FILE, **self.options(),
                "vocab_size": self.vocab_size, "fingerprint": self.fingerprint()}
        write_metadata(directory, meta)

    @classmethod
    def load(cls, directory: str) -> WordPieceTokenizer:
        """Loads a directory written by ``save``."""
        meta_path = storage.join(directory, TOKENIZER_JSON)
        meta = read_metadata(directory, cls.kind)
        known = {"do_lower_case", "strip_accents", "tokenize_chinese_chars",
                 "max_input_chars_per_word", "split_special_tokens"}
        options = {k: v for k, v in meta.items() if k in known}
        tok = cls.from_vocab_file(storage.join(directory, meta.get("vocab_file", VOCAB_FILE)),
                                  **options)
        if "fingerprint" in meta and meta["fingerprint"] != tok.fingerprint():
            raise BertJaxError(f"{meta_path}: vocabulary fingerprint {tok.fingerprint()} does not "
                               f"match the recorded {meta['fingerprint']}")
        return tok

    # ---- vocabulary ---------------------------------------------------------------------
    @property
    def vocab(self) -> dict[str, int]:
        return self._vocab

    def word_start_mask(self) -> np.ndarray:
        return np.array([not t.startswith("##") for t in self._tokens], dtype=bool)

    # ---- tokenization -------------------------------------------------------------------
    def basic_tokenize(self, text: str) -> list[str]:
        """BERT's basic tokenizer on text without special tokens: the words to piece."""
        if text.isascii():
            text = text.translate(_ASCII_DELETE)
            if self.do_lower_case:
                text = text.lower()
            return _ASCII_WORD_RE.findall(text)
        delete_re, cjk_re, marks_re, word_re = _unicode_regexes()
        text = delete_re.sub("", text)
        if self.tokenize_chinese_chars:
            text = cjk_re.sub(r" \g<0> ", text)
        if self._strip:
            text = marks_re.sub("", unicodedata.normalize("NFD", text))
        if self.do_lower_case:
            # Per-character lowering like the Rust normalizer (str.lower() makes a final sigma).
            text = text.replace("\u03a3", "\u03c3").lower()
        return word_re.findall(text)

    def _word_ids(self, word: str) -> tuple[int, ...]:
        """Greedy longest-match-first word pieces of one basic word (cached)."""
        ids = self._cache.get(word)
        if ids is not None:
            return ids
        n = len(word)
        if n > self.max_input_chars_per_word:
            ids = (self._unk,)
        else:
            vocab, out, start = self._vocab, [], 0
            while start < n:
                end = min(n, start + self._max_piece)
                prefix = "##" if start else ""
                while end > start:
                    i = vocab.get(prefix + word[start:end])
                    if i is not None:
                        out.append(i)
                        break
                    end -= 1
                else:
                    out = [self._unk]
                    break
                start = end
            ids = tuple(out)
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[word] = ids
        return ids

    def word_ids(self, text: str) -> list[tuple[int, ...]]:
        """Text -> per-word id tuples, keeping literal special tokens whole."""
        if self.split_special_tokens or "[" not in text:
            return [self._word_ids(w) for w in self.basic_tokenize(text)]
        out, pos = [], 0
        for m in self._special_re.finditer(text):
            out += [self._word_ids(w) for w in self.basic_tokenize(text[pos:m.start()])]
            out.append((self._vocab[m.group()],))
            pos = m.end()
        out += [self._word_ids(w) for w in self.basic_tokenize(text[pos:])]
        return out

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        specials = set(self.special_ids) if skip_special_tokens else set()
        words: list[str] = []
        for i in ids:
            i = int(i)
            if i in specials:
                continue
            token = self.id_to_token(i)
            if token.startswith("##") and words:
                words[-1] += token[2:]
            else:
                words.append(token)
        return " ".join(words)
