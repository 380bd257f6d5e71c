"""Byte-level BPE (GPT-2 / RoBERTa): training from raw text, ``vocab.json`` + ``merges.txt``.

Encoding matches transformers' ``RobertaTokenizer`` (``add_prefix_space=False``): the special
tokens written literally in the text stay whole (``<mask>`` also takes the whitespace before
it), the rest is split by GPT-2's pre-tokenizer regex (contractions, letters, numbers, other
symbols, each with at most one leading space, and runs of whitespace), each piece's UTF-8
bytes are spelled with GPT-2's printable byte alphabet (a space is ``Ġ``, a newline ``Ċ``)
and the merges apply lowest rank first. Every byte is in the vocabulary, so nothing becomes
``<unk>``. Sequences are ``<s> A </s>`` and ``<s> A </s></s> B </s>``, all token type 0.
"""

from __future__ import annotations

import functools
import json

import numpy as np
import regex

from bert_jax import fileio, storage
from bert_jax.errors import BertJaxError
from bert_jax.tokenization.base import (
    TableTokenizer,
    read_metadata,
    write_metadata,
)

VOCAB_FILE = "vocab.json"
MERGES_FILE = "merges.txt"
# RoBERTa's order: <s>=0 <pad>=1 </s>=2 <unk>=3, then <mask>.
BPE_SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
_ROLES = {"cls": "<s>", "pad": "<pad>", "sep": "</s>", "unk": "<unk>", "mask": "<mask>"}
GPT2_PATTERN = (r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"""
                r"""|\s+(?!\S)|\s+""")
_CACHE_LIMIT = 1 << 19
_MERGES_HEADER = "#version: 0.2"


@functools.cache
def byte_alphabet() -> tuple[str, ...]:
    """GPT-2's byte -> printable character table: printable Latin-1 bytes stand for
    themselves, the other 68 bytes take the characters from U+0100 on, in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return tuple(out[b] for b in range(256))


@functools.cache
def _pretokenizer() -> regex.Pattern:
    return regex.compile(GPT2_PATTERN)


def split_bytes(text: str) -> list[str]:
    """GPT-2 pre-tokenization: text -> pieces spelled in the byte alphabet."""
    alphabet = byte_alphabet()
    return ["".join(alphabet[b] for b in piece.encode("utf-8"))
            for piece in _pretokenizer().findall(text)]


class ByteLevelBPETokenizer(TableTokenizer):
    """Byte-level BPE over a vocabulary (token -> id) and ranked merges."""

    kind = "bpe"
    special_tokens = _ROLES
    pair_extra_separators = 1  # <s> A </s></s> B </s>
    pair_segment_id = 0

    def __init__(self, vocab: dict[str, int], merges: list[tuple[str, str]],
                 source: str = "vocabulary"):
        vocab = dict(vocab)
        tokens = [""] * (max(vocab.values(), default=-1) + 1)
        for token, i in vocab.items():
            tokens[i] = token
        missing = [t for t in BPE_SPECIAL_TOKENS if t not in vocab]
        if missing:
            raise BertJaxError(f"{source}: special token(s) {', '.join(missing)} missing from the "
                               f"vocabulary (byte-level BPE needs {', '.join(BPE_SPECIAL_TOKENS)})")
        absent = [c for c in byte_alphabet() if c not in vocab]
        if absent:
            raise BertJaxError(f"{source}: {len(absent)} of the 256 byte symbols are missing "
                               f"(e.g. {absent[0]!r}); not a byte-level BPE vocabulary")
        self._set_table(tokens, vocab, "<unk>")
        self._merges = [tuple(m) for m in merges]
        self._ranks = {m: i for i, m in enumerate(self._merges)}
        self._special_re = regex.compile(r"\s*<mask>|<s>|</s>|<pad>|<unk>")

    # ---- files ---------------------------------------------------------------------------
    @classmethod
    def from_files(cls, vocab_path: str, merges_path: str) -> ByteLevelBPETokenizer:
        """Reads ``vocab.json`` and ``merges.txt`` (GPT-2 / RoBERTa / HF tokenizers format)."""
        for path in (vocab_path, merges_path):
            if not storage.isfile(path):
                raise BertJaxError(f"{path}: file not found")
        try:
            vocab = json.loads(storage.read_text(vocab_path))
        except (ValueError, UnicodeDecodeError) as e:
            raise BertJaxError(f"{vocab_path}: not a JSON vocabulary ({e})") from None
        if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()):
            raise BertJaxError(f"{vocab_path}: expected an object of token -> integer id")
        merges = []
        if True:
            for n, line in enumerate(storage.read_text(merges_path).split("\n"), 1):
                if not line or (n == 1 and line.startswith("#version")):
                    continue
                parts = line.split(" ")
                if len(parts) != 2:
                    raise BertJaxError(f"{merges_path}:{n}: expected two symbols separated by "
                                       f"one space, got {line!r}")
                if parts[0] + parts[1] not in vocab:
                    raise BertJaxError(f"{merges_path}:{n}: merge result {parts[0] + parts[1]!r} "
                                       f"is not in {storage.basename(vocab_path)}")
                merges.append((parts[0], parts[1]))
        return cls(vocab, merges, source=vocab_path)

    def save_vocab_files(self, directory: str) -> None:
        """``vocab.json`` + ``merges.txt`` as transformers and tokenizers read them."""
        storage.makedirs(directory)
        fileio.atomic_write(storage.join(directory, VOCAB_FILE),
                            json.dumps(self._vocab, ensure_ascii=False))
        fileio.atomic_write(storage.join(directory, MERGES_FILE),
                            _MERGES_HEADER + "\n" + "".join(f"{a} {b}\n" for a, b in self._merges))

    def save(self, directory: str) -> None:
        self.save_vocab_files(directory)
        write_metadata(directory, {"kind": self.kind, "vocab_file": VOCAB_FILE,
                                   "merges_file": MERGES_FILE, "vocab_size": self.vocab_size,
                                   "fingerprint": self.fingerprint()})

    @classmethod
    def load(cls, directory: str) -> ByteLevelBPETokenizer:
        meta = read_metadata(directory, cls.kind)
        tok = cls.from_files(storage.join(directory, meta.get("vocab_file", VOCAB_FILE)),
                             storage.join(directory, meta.get("merges_file", MERGES_FILE)))
        if "fingerprint" in meta and meta["fingerprint"] != tok.fingerprint():
            raise BertJaxError(f"{directory}: vocabulary fingerprint {tok.fingerprint()} does "
                               f"not match the recorded {meta['fingerprint']}")
        return tok

    def hf_special_tokens(self) -> dict:
        """The special tokens as a transformers ``tokenizer_config.json`` names them (RoBERTa's
        ``<mask>`` takes the whitespace before it: ``lstrip``)."""
        mask = {"__type": "AddedToken", "content": "<mask>", "lstrip": True, "rstrip": False,
                "normalized": False, "single_word": False, "special": True}
        return {"bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>",
                "cls_token": "<s>", "unk_token": "<unk>", "pad_token": "<pad>",
                "mask_token": mask}

    # ---- vocabulary ----------------------------------------------------------------------
    def word_start_mask(self) -> np.ndarray:
        """Tokens that begin with a space (``Ġ``) or are special start a word."""
        specials = set(BPE_SPECIAL_TOKENS)
        return np.array([t.startswith("\u0120") or t in specials for t in self._tokens],
                        dtype=bool)

    # ---- encoding ------------------------------------------------------------------------
    def _piece_ids(self, piece: str) -> tuple[int, ...]:
        """One pre-tokenized piece (byte alphabet) -> ids, merges lowest rank first."""
        ids = self._cache.get(piece)
        if ids is not None:
            return ids
        symbols = list(piece)
        ranks = self._ranks
        while len(symbols) > 1:
            best, best_rank = None, None
            for pair in zip(symbols, symbols[1:], strict=False):
                rank = ranks.get(pair)
                if rank is not None and (best_rank is None or rank < best_rank):
                    best, best_rank = pair, rank
            if best is None:
                break
            merged, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    merged.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        ids = tuple(self._vocab.get(s, self._unk) for s in symbols)
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[piece] = ids
        return ids

    def word_ids(self, text: str) -> list[tuple[int, ...]]:
        """Text -> per-piece id tuples; literal special tokens stay whole."""
        out, pos = [], 0
        for m in self._special_re.finditer(text):
            out += [self._piece_ids(p) for p in split_bytes(text[pos:m.start()])]
            out.append((self._vocab[m.group().lstrip()],))
            pos = m.end()
        out += [self._piece_ids(p) for p in split_bytes(text[pos:])]
        return out

    def encode_ids_with_masks(self, text: str) -> list[int]:
        return self.encode_ids(text)  # <mask> is matched in the text, with its lstrip

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        specials = set(self.special_ids) if skip_special_tokens else set()
        inverse = {c: b for b, c in enumerate(byte_alphabet())}
        data = bytearray()
        for i in ids:
            i = int(i)
            if i in specials:
                continue
            token = self.id_to_token(i)
            if token in BPE_SPECIAL_TOKENS:
                data += token.encode("utf-8")
            else:
                data += bytes(inverse[c] for c in token if c in inverse)
        return data.decode("utf-8", errors="replace")


# ---- training --------------------------------------------------------------------------------
def _split_for_counting(line: str) -> list[str]:
    return split_bytes(line)


def _join(a: str, b: str) -> str:
    return a + b


def train_bpe(inputs: list[str], vocab_size: int, min_frequency: int = 2,
              num_workers: int = 1):
    """Learns a byte-level BPE vocabulary of ``vocab_size`` tokens (the 5 specials, the 256
    byte symbols, then merges) from text files/directories. Returns (tokenizer, report)."""
    from bert_jax.tokenization.merge_training import count_words, learn_merges

    base = len(BPE_SPECIAL_TOKENS) + 256
    if vocab_size <= base:
        raise BertJaxError(f"vocab_size={vocab_size} leaves no room for merges (byte-level BPE "
                           f"starts with {base} tokens: 5 specials + 256 bytes)")
    counts, report = count_words(inputs, _split_for_counting, num_workers)
    if not counts:
        raise BertJaxError(f"no usable text lines in {', '.join(inputs)} ({report.summary()})")
    words = {tuple(w): c for w, c in counts.items()}
    merges = learn_merges(words, vocab_size - base, _join, min_frequency)
    vocab = {t: i for i, t in enumerate(BPE_SPECIAL_TOKENS)}
    for c in byte_alphabet():
        vocab[c] = len(vocab)
    kept = []
    for a, b, merged in merges:
        if merged not in vocab:
            vocab[merged] = len(vocab)
        kept.append((a, b))
    return ByteLevelBPETokenizer(vocab, kept, source="trained vocabulary"), report
