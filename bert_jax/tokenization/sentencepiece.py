"""SentencePiece (unigram or BPE) tokenizer with BERT's special tokens at fixed ids.

Models trained by ``train_sentencepiece`` hold [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4:
[PAD] is SentencePiece's pad (a control piece), [UNK] its unknown piece, and [CLS], [SEP],
[MASK] user-defined symbols, so that a literal "[MASK]" in the text stays one piece (as in the
WordPiece tokenizer). A word starts at a piece beginning with "▁" (U+2581).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import unicodedata

import numpy as np

from bert_jax import fileio, storage
from bert_jax.corpus import list_corpus_files, select_text_files
from bert_jax.errors import BertJaxError
from bert_jax.tokenization.base import (
    SPECIAL_TOKENS,
    TOKENIZER_JSON,
    Tokenizer,
    read_metadata,
    write_metadata,
)

MODEL_FILE = "spm.model"
WORD_START = "\u2581"


def _processor(model_path: str | None = None, proto: bytes | None = None):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor()
    try:
        sp.load_from_serialized_proto(proto if proto is not None
                                      else storage.read_bytes(model_path))
    except (OSError, RuntimeError) as e:
        raise BertJaxError(f"{model_path}: not a SentencePiece model ({e})") from None
    return sp


@functools.cache
def _special_pattern(tokens: tuple[str, ...]) -> re.Pattern:
    return re.compile("|".join(re.escape(t) for t in tokens))


# The first five pieces of ALBERT's released spiece.model files.
ALBERT_SPECIAL_TOKENS = ("<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]")


# ALBERT's text normalisation before SentencePiece (transformers' AlbertTokenizer): the
# options with their values there. bert-jax's own SentencePiece models default to none of it.
ALBERT_NORMALIZATION = {"do_lower_case": True, "keep_accents": False, "remove_space": True,
                        "replace_quotes": True}
_NO_NORMALIZATION = {"do_lower_case": False, "keep_accents": True, "remove_space": False,
                     "replace_quotes": False}


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece ``.model`` whose first five pieces are BERT's special tokens.

    Optional normalisation before SentencePiece, as ALBERT's tokenizer does it
    (``ALBERT_NORMALIZATION``): ``remove_space`` collapses whitespace runs and strips the ends,
    ``replace_quotes`` maps two backquotes and two single quotes to a double quote, accents
    are stripped (NFKD, combining marks dropped) unless ``keep_accents``, and
    ``do_lower_case`` lower-cases. With any of it on, special tokens written in the text are
    split off first and kept whole."""

    kind = "sentencepiece"

    def __init__(self, model_path: str, do_lower_case: bool = False, keep_accents: bool = True,
                 remove_space: bool = False, replace_quotes: bool = False):
        if not storage.isfile(model_path):
            raise BertJaxError(f"{model_path}: SentencePiece model file not found")
        self.model_path = model_path
        self.do_lower_case = bool(do_lower_case)
        self.keep_accents = bool(keep_accents)
        self.remove_space = bool(remove_space)
        self.replace_quotes = bool(replace_quotes)
        self._sp = _processor(model_path)
        self._check_specials()
        self._word_start = self._make_word_start_mask()

    def options(self) -> dict:
        return {"do_lower_case": self.do_lower_case, "keep_accents": self.keep_accents,
                "remove_space": self.remove_space, "replace_quotes": self.replace_quotes}

    @property
    def normalizes(self) -> bool:
        return self.options() != _NO_NORMALIZATION

    def preprocess(self, text: str) -> str:
        """The normalisation applied before SentencePiece (none by default)."""
        if self.remove_space:
            text = " ".join(text.split())
        if self.replace_quotes:
            text = text.replace("``", '"').replace("''", '"')
        if not self.keep_accents:
            text = "".join(c for c in unicodedata.normalize("NFKD", text)
                           if not unicodedata.combining(c))
        if self.do_lower_case:
            text = text.lower()
        return text

    def _check_specials(self) -> None:
        n = self._sp.get_piece_size()
        found = [self._sp.id_to_piece(i) for i in range(min(n, len(SPECIAL_TOKENS)))]
        if found == list(ALBERT_SPECIAL_TOKENS) and self._sp.unk_id() == 1:
            # ALBERT's spiece.model spells padding and unknown <pad> / <unk>.
            self.special_tokens = dict(zip(("pad", "unk", "cls", "sep", "mask"),
                                           ALBERT_SPECIAL_TOKENS, strict=True))
            return
        if found != list(SPECIAL_TOKENS) or self._sp.unk_id() != 1:
            expected = ", ".join(f"{t}={i}" for i, t in enumerate(SPECIAL_TOKENS))
            raise BertJaxError(
                f"{self.model_path}: ids 0-4 are {found} (unk id {self._sp.unk_id()}); BERT needs "
                f"{expected} (train it with `bert-jax train-tokenizer` or pad_id=0, "
                "pad_piece=[PAD], unk_id=1, unk_piece=[UNK], "
                "user_defined_symbols=[CLS],[SEP],[MASK])")

    def _make_word_start_mask(self) -> np.ndarray:
        mask = np.array([self._sp.id_to_piece(i).startswith(WORD_START)
                         for i in range(self.vocab_size)], dtype=bool)
        mask[: len(SPECIAL_TOKENS)] = True
        return mask

    def __getstate__(self) -> dict:
        return {"model_path": self.model_path, "proto": self._sp.serialized_model_proto(),
                "options": self.options()}

    def __setstate__(self, state: dict) -> None:
        self.model_path = state["model_path"]
        for key, value in state["options"].items():
            setattr(self, key, value)
        self._sp = _processor(self.model_path, proto=state["proto"])
        self._check_specials()
        self._word_start = self._make_word_start_mask()

    # ---- persistence --------------------------------------------------------------------
    def save(self, directory: str) -> None:
        storage.makedirs(directory)
        target = storage.join(directory, MODEL_FILE)
        if not storage.same_path(target, self.model_path):
            fileio.atomic_write(target, storage.read_bytes(self.model_path))
        meta = {"kind": self.kind, "model_file": MODEL_FILE, "vocab_size": self.vocab_size,
                "fingerprint": self.fingerprint()}
        if self.normalizes:
            meta.update(self.options())
        write_metadata(directory, meta)

    @classmethod
    def load(cls, directory: str) -> SentencePieceTokenizer:
        meta_path = storage.join(directory, TOKENIZER_JSON)
        meta = read_metadata(directory, cls.kind)
        options = {k: meta[k] for k in _NO_NORMALIZATION if k in meta}
        tok = cls(storage.join(directory, meta.get("model_file", MODEL_FILE)), **options)
        if "fingerprint" in meta and meta["fingerprint"] != tok.fingerprint():
            raise BertJaxError(f"{meta_path}: model fingerprint {tok.fingerprint()} does not "
                               f"match the recorded {meta['fingerprint']}")
        return tok

    # ---- vocabulary ---------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    def token_to_id(self, token: str) -> int:
        return self._sp.piece_to_id(token)

    def id_to_token(self, token_id: int) -> str:
        if not 0 <= token_id < self.vocab_size:
            raise BertJaxError(f"token id {token_id} outside the vocabulary [0, {self.vocab_size})")
        return self._sp.id_to_piece(token_id)

    def word_start_mask(self) -> np.ndarray:
        return self._word_start.copy()

    # ---- tokenization -------------------------------------------------------------------
    def normalize(self, text: str) -> str:
        """The text as the model sees it (NFKC etc., whitespace collapsed): what decode gives."""
        return self._sp.normalize(self.preprocess(text)).replace(WORD_START, " ").strip(" ")

    def _ids(self, text: str) -> list[int]:
        """Text -> ids; with normalisation, literal special tokens are split off first (so
        that lower-casing cannot touch them) and each part is encoded on its own."""
        if not self.normalizes:
            return self._sp.encode(text)
        ids: list[int] = []
        pos = 0
        for m in _special_pattern(tuple(self.special_tokens.values())).finditer(text):
            ids += self._sp.encode(self.preprocess(text[pos:m.start()]))
            ids.append(self._sp.piece_to_id(m.group()))
            pos = m.end()
        return ids + self._sp.encode(self.preprocess(text[pos:]))

    def encode_ids(self, text: str) -> list[int]:
        return self._ids(text)

    def encode_batch(self, texts: list[str], num_workers: int = 1) -> list[list[int]]:
        if self.normalizes:
            return super().encode_batch(texts, num_workers)
        return self._sp.encode(list(texts), num_threads=max(1, num_workers))

    def tokenize(self, text: str) -> list[str]:
        return [self._sp.id_to_piece(i) for i in self._ids(text)]

    def tokenize_words(self, text: str) -> list[list[str]]:
        words: list[list[str]] = []
        for i in self._ids(text):
            piece = self._sp.id_to_piece(i)
            # A bare "▁" (before a user-defined symbol such as [MASK]) joins the next piece.
            if (self._word_start[i] and words[-1:] != [[WORD_START]]) or not words:
                words.append([piece])
            else:
                words[-1].append(piece)
        return words

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        ids = [int(i) for i in ids]
        for i in ids:
            if not 0 <= i < self.vocab_size:
                raise BertJaxError(f"token id {i} outside the vocabulary [0, {self.vocab_size})")
        if skip_special_tokens:
            n, space = len(SPECIAL_TOKENS), self._sp.piece_to_id(WORD_START)
            # Drop specials and the bare "▁" in front of one, which would decode to a space.
            ids = [i for k, i in enumerate(ids) if i >= n and not (
                i == space and k + 1 < len(ids) and ids[k + 1] < n)]
        return self._sp.decode(ids)


@dataclasses.dataclass
class CorpusReport:
    """What ``train_sentencepiece`` read: nothing skipped goes uncounted."""

    files: int = 0
    binary_files: int = 0
    lines: int = 0
    blank_lines: int = 0
    undecodable_lines: int = 0
    too_long_lines: int = 0
    bytes: int = 0
    meta_files: int = 0  # README/LICENSE-like files in input directories

    def summary(self) -> str:
        return (f"{self.files} files ({self.binary_files} not utf-8 text and "
                f"{self.meta_files} README/LICENSE-like skipped), {self.lines} lines "
                f"({self.bytes / 1e6:.1f} MB) used; skipped {self.undecodable_lines} undecodable "
                f"and {self.too_long_lines} over-long lines; {self.blank_lines} blank lines")


def list_text_files(paths: list[str], report: CorpusReport | None = None) -> list[str]:
    """Files given directly plus the text files under given directories (sorted; hidden and
    README/LICENSE-like files skipped, and files that are not UTF-8 text, see
    ``bert_jax.corpus``; both counted in ``report``)."""
    corpus = list_corpus_files(paths)
    files, not_text = select_text_files(corpus)
    if report is not None:
        report.meta_files = len(corpus.skipped)
        report.binary_files = len(not_text)
    return files


def iter_lines(files: list[str], report: CorpusReport, max_bytes: int):
    """Stripped, decodable, non-empty lines of ``files``; skips are counted in ``report``."""
    for path in files:
        with storage.open_read(path, block_size=1 << 20) as f:
            report.files += 1
            for raw in f:
                try:
                    line = raw.decode("utf-8").strip()
                except UnicodeDecodeError:
                    report.undecodable_lines += 1
                    continue
                if not line:
                    report.blank_lines += 1
                elif len(line.encode("utf-8")) > max_bytes:
                    report.too_long_lines += 1
                else:
                    report.lines += 1
                    report.bytes += len(raw)
                    yield line


def train_sentencepiece(inputs: list[str], output_prefix: str, vocab_size: int,
                        model_type: str = "unigram", character_coverage: float = 0.9995,
                        input_sentence_size: int = 2_000_000, num_threads: int | None = None,
                        byte_fallback: bool = False, max_sentence_length: int = 4192,
                        seed: int = 0, verbose: bool = False) -> CorpusReport:
    """Trains ``{output_prefix}.model`` on raw text files/directories with BERT's specials at
    ids 0-4; at most ``input_sentence_size`` lines (a shuffled sample) shape the vocabulary."""
    import sentencepiece as spm

    if model_type not in ("unigram", "bpe"):
        raise BertJaxError(f"model_type must be 'unigram' or 'bpe', got {model_type!r}")
    if vocab_size <= len(SPECIAL_TOKENS):
        raise BertJaxError(f"vocab_size={vocab_size} leaves no room beside the special tokens")
    report = CorpusReport()
    files = list_text_files(inputs, report)
    os.makedirs(os.path.dirname(os.path.abspath(output_prefix)), exist_ok=True)  # local: staging
    spm.set_random_generator_seed(seed)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter_lines(files, report, max_sentence_length),
            model_prefix=output_prefix, vocab_size=vocab_size, model_type=model_type,
            character_coverage=character_coverage, input_sentence_size=input_sentence_size,
            shuffle_input_sentence=True, max_sentence_length=max_sentence_length,
            num_threads=num_threads or os.cpu_count() or 1, byte_fallback=byte_fallback,
            pad_id=0, pad_piece="[PAD]", unk_id=1, unk_piece="[UNK]", bos_id=-1, eos_id=-1,
            user_defined_symbols=list(SPECIAL_TOKENS[2:]), minloglevel=0 if verbose else 2)
    except RuntimeError as e:
        if report.lines == 0:
            raise BertJaxError(f"no usable text lines in {', '.join(inputs)} "
                               f"({report.summary()})") from None
        raise BertJaxError(f"SentencePiece training failed: {str(e).split('] ')[-1]}") from None
    return report
