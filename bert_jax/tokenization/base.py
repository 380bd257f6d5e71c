"""One tokenizer interface for WordPiece, SentencePiece and byte-level BPE vocabularies.

Every tokenizer has five special roles (pad, unk, cls, sep, mask: BERT's [PAD] [UNK] [CLS]
[SEP] [MASK], RoBERTa's <pad> <unk> <s> </s> <mask>; ``special_tokens``), encodes a
text or a pair with truncation, decodes, knows which vocabulary entries start a word (for
whole-word masking on ids alone), and saves itself into / loads itself from a directory
(a checkpoint's ``tokenizer/`` folder).
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import json
import multiprocessing

import numpy as np

from bert_jax import fileio, storage
from bert_jax.errors import BertJaxError

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
TOKENIZER_JSON = "tokenizer.json"


@dataclasses.dataclass
class Encoding:
    """One encoded example: ``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]``."""

    input_ids: list[int]
    segment_ids: list[int]
    # Index of the word (within its segment's text) each token came from; None for specials.
    word_ids: list[int | None]


class Tokenizer(abc.ABC):
    """Abstract tokenizer. Subclasses implement the vocabulary-level primitives."""

    kind: str = "abstract"
    # The strings of the five special roles (byte-level BPE spells them <pad>, <s>, ...).
    special_tokens: dict[str, str] = dict(zip(("pad", "unk", "cls", "sep", "mask"),
                                              SPECIAL_TOKENS, strict=True))

    # ---- primitives ----------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def vocab_size(self) -> int: ...

    @abc.abstractmethod
    def tokenize(self, text: str) -> list[str]:
        """Text -> sub-word token strings (no special tokens)."""

    @abc.abstractmethod
    def tokenize_words(self, text: str) -> list[list[str]]:
        """Text -> one list of sub-word tokens per word (word boundaries for NER, WWM)."""

    @abc.abstractmethod
    def token_to_id(self, token: str) -> int: ...

    @abc.abstractmethod
    def id_to_token(self, token_id: int) -> str: ...

    @abc.abstractmethod
    def decode(self, ids, skip_special_tokens: bool = True) -> str: ...

    @abc.abstractmethod
    def word_start_mask(self) -> np.ndarray:
        """bool[vocab_size]: True where a vocabulary entry begins a new word."""

    @abc.abstractmethod
    def save(self, directory: str) -> None:
        """Writes the vocabulary/model files and ``tokenizer.json`` into ``directory``."""

    # ---- shared behaviour -----------------------------------------------------------------
    @property
    def pad_id(self) -> int:
        return self.token_to_id(self.special_tokens["pad"])

    @property
    def unk_id(self) -> int:
        return self.token_to_id(self.special_tokens["unk"])

    @property
    def cls_id(self) -> int:
        return self.token_to_id(self.special_tokens["cls"])

    @property
    def sep_id(self) -> int:
        return self.token_to_id(self.special_tokens["sep"])

    @property
    def mask_id(self) -> int:
        return self.token_to_id(self.special_tokens["mask"])

    @property
    def mask_token(self) -> str:
        return self.special_tokens["mask"]

    @property
    def special_ids(self) -> list[int]:
        return [self.token_to_id(self.special_tokens[r])
                for r in ("pad", "unk", "cls", "sep", "mask")]

    def encode_ids_with_masks(self, text: str) -> list[int]:
        """Text -> ids (no [CLS]/[SEP]) where each literal mask token becomes the mask id."""
        ids: list[int] = []
        for i, piece in enumerate(text.split(self.mask_token)):
            if i:
                ids.append(self.mask_id)
            ids.extend(self.encode_ids(piece))
        return ids

    def encode_ids(self, text: str) -> list[int]:
        """Text -> ids with no special tokens."""
        return [self.token_to_id(t) for t in self.tokenize(text)]

    def encode_batch(self, texts: list[str], num_workers: int = 1) -> list[list[int]]:
        """Many texts -> ids (no special tokens); ``num_workers > 1`` spreads large batches
        over worker processes (each gets a pickled copy of the tokenizer)."""
        if num_workers <= 1 or len(texts) < _MIN_PARALLEL_TEXTS:
            return [self.encode_ids(t) for t in texts]
        return _encode_parallel(self, texts, num_workers)

    # Pair layout: [CLS] A [SEP] + extra separators + B [SEP], the second part (from the
    # extra separators on) of token type ``pair_segment_id``. BERT: no extra separator,
    # type 1; RoBERTa: ``<s> A </s></s> B </s>``, all type 0.
    pair_extra_separators: int = 0
    pair_segment_id: int = 1

    def word_ids(self, text: str) -> list[tuple[int, ...]]:
        """Text -> one tuple of ids per word (the word boundaries ``encode`` records)."""
        return [tuple(self.token_to_id(t) for t in w) for w in self.tokenize_words(text)]

    def encode(self, text: str, text_pair: str | None = None, max_length: int | None = None,
               truncation: str = "longest_first") -> Encoding:
        """Encodes a text or a pair with [CLS]/[SEP], truncating to ``max_length`` tokens."""
        a = [(t, i) for i, w in enumerate(self.word_ids(text)) for t in w]
        b = [(t, i) for i, w in enumerate(self.word_ids(text_pair)) for t in w] \
            if text_pair is not None else None
        if max_length is not None:
            budget = max_length - (3 + self.pair_extra_separators if b is not None else 2)
            if budget < 0:
                raise BertJaxError(f"max_length={max_length} leaves no room for special tokens")
            a, b = truncate_pair(a, b, budget, truncation)
        cls, sep = self.cls_id, self.sep_id
        ids = [cls, *(t for t, _ in a), sep]
        word_ids: list[int | None] = [None, *(i for _, i in a), None]
        segs = [0] * len(ids)
        if b is not None:
            extra = self.pair_extra_separators
            ids += [sep] * extra + [t for t, _ in b] + [sep]
            word_ids += [None] * extra + [i for _, i in b] + [None]
            segs += [self.pair_segment_id] * (extra + len(b) + 1)
        return Encoding(ids, segs, word_ids)

    def fingerprint(self) -> str:
        """A stable hash of the vocabulary (checked when data or checkpoints are combined)."""
        h = hashlib.sha256()
        for i in range(self.vocab_size):
            h.update(self.id_to_token(i).encode("utf-8", "surrogatepass") + b"\0")
        return f"{self.kind}:{self.vocab_size}:{h.hexdigest()[:16]}"


class TableTokenizer(Tokenizer):
    """A tokenizer over a token list (id -> token) and its inverse, that splits text into
    words of ids (``word_ids``, cached per word by the subclass): WordPiece, byte-level BPE.
    Unknown tokens map to ``unk_token_id``."""

    def _set_table(self, tokens: list[str], vocab: dict[str, int], unk: str) -> None:
        self._tokens = tokens
        self._vocab = vocab
        self._unk = vocab[unk]
        self._cache: dict[str, tuple[int, ...]] = {}

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_cache"] = {}  # workers build their own
        return state

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def token_to_id(self, token: str) -> int:
        return self._vocab.get(token, self._unk)

    def id_to_token(self, token_id: int) -> str:
        if not 0 <= token_id < len(self._tokens):
            raise BertJaxError(f"token id {token_id} outside the vocabulary [0, {self.vocab_size})")
        return self._tokens[token_id]

    def encode_ids(self, text: str) -> list[int]:
        return [i for word in self.word_ids(text) for i in word]

    def tokenize(self, text: str) -> list[str]:
        return [self._tokens[i] for i in self.encode_ids(text)]

    def tokenize_words(self, text: str) -> list[list[str]]:
        return [[self._tokens[i] for i in w] for w in self.word_ids(text)]


_MIN_PARALLEL_TEXTS = 2048  # below this, starting worker processes costs more than it saves
_worker_tokenizer: Tokenizer | None = None


def _init_worker(tokenizer: Tokenizer) -> None:
    global _worker_tokenizer
    _worker_tokenizer = tokenizer


def _encode_chunk(texts: list[str]) -> list[list[int]]:
    return [_worker_tokenizer.encode_ids(t) for t in texts]


def _encode_parallel(tokenizer: Tokenizer, texts: list[str], num_workers: int) -> list[list[int]]:
    """Order-preserving multi-process ``encode_ids``; forkserver so a parent holding threads
    (JAX, TF) is never forked."""
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    chunk = max(64, len(texts) // (num_workers * 8))
    chunks = [texts[i:i + chunk] for i in range(0, len(texts), chunk)]
    with ctx.Pool(num_workers, initializer=_init_worker, initargs=(tokenizer,)) as pool:
        return [ids for part in pool.map(_encode_chunk, chunks) for ids in part]


def write_metadata(directory: str, meta: dict) -> None:
    """Writes ``tokenizer.json`` (kind, files, options, fingerprint) beside the vocabulary."""
    fileio.atomic_write_json(storage.join(directory, TOKENIZER_JSON), meta, sort_keys=False)


def read_metadata(directory: str, kind: str) -> dict:
    """Reads ``tokenizer.json`` and checks that it describes a tokenizer of ``kind``."""
    meta_path = storage.join(directory, TOKENIZER_JSON)
    try:
        meta = json.loads(storage.read_text(meta_path))
    except (OSError, ValueError) as e:
        raise BertJaxError(f"{meta_path}: cannot read tokenizer metadata ({e})") from None
    if meta.get("kind") != kind:
        raise BertJaxError(f"{meta_path}: kind is {meta.get('kind')!r}, expected {kind!r}")
    return meta


def truncate_pair(a: list, b: list | None, budget: int, strategy: str = "longest_first"):
    """Truncates a (and b) so that len(a) + len(b) <= budget, trimming the longer one first
    (as Google BERT does; on ties the second segment loses a token)."""
    if b is None:
        return a[:budget], None
    if strategy == "only_second":
        return a, b[:max(0, budget - len(a))]
    # Google BERT's _truncate_seq_pair: pop from the longer one, from b on ties.
    a, b = list(a), list(b)
    while len(a) + len(b) > budget:
        if len(a) > len(b):
            a.pop()
        else:
            b.pop()
    return a, b
