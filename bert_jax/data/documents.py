"""Document shards: tokenized documents with their sentence boundaries, paired at run time.

``create-pretraining-data --format documents`` writes one ``tf.train.Example`` per document,
or per chunk of at most ``max_record_tokens`` tokens of a long document (whole sentences; a
sentence longer than that is a chunk of its own):

* ``token_ids`` int64[n]: the chunk's tokens, no special tokens;
* ``sentence_lengths`` int64[k]: its sentences (or lines), ``sum == n``;
* ``document`` int64[3]: (work unit, document index in the unit, chunk index).

The pipeline loads every record of a split into one :class:`DocumentTable` (all tokens back
to back, sorted by ``document`` so the chunks of a document are contiguous again), from which
:mod:`bert_jax.data.pairing` makes examples afresh each epoch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from bert_jax.data import records
from bert_jax.data.example_proto import ExampleEncoder
from bert_jax.errors import BertJaxError

FORMATS = ("pairs", "documents")
DEFAULT_MAX_RECORD_TOKENS = 4096


def chunk_document(sentences: list[list[int]], max_record_tokens: int
                   ) -> list[list[list[int]]]:
    """Consecutive whole sentences, at most ``max_record_tokens`` tokens per chunk
    (0: the whole document is one chunk)."""
    if max_record_tokens <= 0:
        return [sentences]
    chunks: list[list[list[int]]] = []
    size = 0
    for sentence in sentences:
        if not chunks or (size + len(sentence) > max_record_tokens and chunks[-1]):
            chunks.append([])
            size = 0
        chunks[-1].append(sentence)
        size += len(sentence)
    return chunks


def encode_documents(documents: list[tuple[int, list[list[int]]]], unit_index: int,
                     max_record_tokens: int, encoder: ExampleEncoder) -> list[bytes]:
    """Serialized records of ``(document index in unit, sentences)`` pairs."""
    out = []
    for doc_index, sentences in documents:
        for chunk_index, chunk in enumerate(chunk_document(sentences, max_record_tokens)):
            out.append(encoder.encode({
                "token_ids": [t for s in chunk for t in s],
                "sentence_lengths": [len(s) for s in chunk],
                "document": [unit_index, doc_index, chunk_index]}))
    return out


@dataclasses.dataclass(frozen=True)
class DocumentTable:
    """All documents of a split in memory.

    Sentence ``k`` is ``tokens[sentence_starts[k]:sentence_starts[k + 1]]``; document ``d`` is
    sentences ``document_sentences[d]:document_sentences[d + 1]``, in order. Every sentence has
    at least one token.
    """

    tokens: np.ndarray  # [T] uint16 (vocabularies up to 65,536) or int32
    sentence_starts: np.ndarray  # int64 [N + 1]
    document_sentences: np.ndarray  # int64 [D + 1]

    @property
    def num_documents(self) -> int:
        return len(self.document_sentences) - 1

    @property
    def num_sentences(self) -> int:
        return len(self.sentence_starts) - 1

    def sentence_lengths(self) -> np.ndarray:
        return np.diff(self.sentence_starts)

    def document_of_token(self, positions: np.ndarray) -> np.ndarray:
        sentence = np.searchsorted(self.sentence_starts, positions, side="right") - 1
        return np.searchsorted(self.document_sentences, sentence, side="right") - 1

    def split_long_sentences(self, max_tokens: int) -> DocumentTable:
        """The same text with every sentence longer than ``max_tokens`` cut into pieces of
        ``max_tokens`` (the last one shorter), as FULL-SENTENCES packing needs."""
        lengths = self.sentence_lengths()
        pieces = (lengths + max_tokens - 1) // max_tokens
        if (pieces <= 1).all():
            return self
        first = np.repeat(self.sentence_starts[:-1], pieces)
        index_in_sentence = np.arange(int(pieces.sum())) - np.repeat(
            np.cumsum(pieces) - pieces, pieces)
        starts = np.append(first + index_in_sentence * max_tokens, self.sentence_starts[-1])
        new_first = np.append(0, np.cumsum(pieces))
        return DocumentTable(self.tokens, starts.astype(np.int64),
                             new_first[self.document_sentences].astype(np.int64))


def table_from_documents(documents: Sequence[Sequence[Sequence[int]]],
                         vocab_size: int = 1 << 16) -> DocumentTable:
    """A table from in-memory documents (lists of sentences of token ids); empty sentences and
    documents without tokens are dropped."""
    sentences = [[s for s in doc if len(s)] for doc in documents]
    sentences = [doc for doc in sentences if doc]
    lengths = np.array([len(s) for doc in sentences for s in doc], np.int64)
    dtype = np.uint16 if vocab_size <= 1 << 16 else np.int32
    tokens = np.array([t for doc in sentences for s in doc for t in s], dtype)
    starts = np.append(0, np.cumsum(lengths)).astype(np.int64)
    doc_first = np.append(0, np.cumsum([len(doc) for doc in sentences])).astype(np.int64)
    return DocumentTable(tokens, starts, doc_first)


def load_document_table(files: Sequence[str], vocab_size: int) -> DocumentTable:
    """Reads every record of ``files`` into one table (chunks of a document rejoined)."""
    import tensorflow as tf

    if not files:
        raise BertJaxError("document shards: no files given")
    features = {"token_ids": tf.io.RaggedFeature(tf.int64),
                "sentence_lengths": tf.io.RaggedFeature(tf.int64),
                "document": tf.io.FixedLenFeature([3], tf.int64)}
    dtype = np.uint16 if vocab_size <= 1 << 16 else np.int32
    tokens, token_counts, lengths, sentence_counts, keys = [], [], [], [], []
    largest = -1  # the largest token id, checked before the narrowing cast

    def parse(serialized):
        p = tf.io.parse_example(serialized, features)
        return (p["token_ids"].flat_values, p["token_ids"].row_lengths(),
                p["sentence_lengths"].flat_values, p["sentence_lengths"].row_lengths(),
                p["document"])

    ds = records.records(files).batch(1024).map(
        parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).prefetch(2)
    try:
        for tok, tok_counts, sen, sen_counts, key in ds.as_numpy_iterator():
            largest = max(largest, int(tok.max()) if tok.size else -1)
            tokens.append(tok.astype(dtype))
            token_counts.append(tok_counts)
            lengths.append(sen)
            sentence_counts.append(sen_counts)
            keys.append(key)
    except tf.errors.OpError as e:
        raise BertJaxError(f"document shards {files[0]}...: unreadable record "
                           f"({type(e).__name__}: {e.message.splitlines()[0]})") from e
    if not tokens:
        raise BertJaxError(f"document shards {files[0]}...: no records")
    flat_tokens = np.concatenate(tokens)
    del tokens
    token_counts = np.concatenate(token_counts).astype(np.int64)
    sentence_lengths = np.concatenate(lengths).astype(np.int64)
    sentence_counts = np.concatenate(sentence_counts).astype(np.int64)
    keys = np.concatenate(keys)
    sums = np.add.reduceat(sentence_lengths, np.append(0, np.cumsum(sentence_counts)[:-1])) \
        if len(sentence_lengths) else np.zeros(0, np.int64)
    if (sentence_counts == 0).any() or (sentence_lengths < 1).any() or \
            not np.array_equal(sums, token_counts):
        raise BertJaxError(f"document shards {files[0]}...: sentence_lengths do not add up to "
                           "the token counts (not a document shard?)")
    if np.unique(keys, axis=0).shape[0] != len(keys):
        raise BertJaxError(f"document shards {files[0]}...: a (unit, document, chunk) key "
                           "appears twice (the same shard given twice?)")
    if largest >= vocab_size:
        raise BertJaxError(f"document shards {files[0]}...: token id outside vocab_size "
                           f"{vocab_size}")

    order = np.lexsort((keys[:, 2], keys[:, 1], keys[:, 0]))  # by unit, document, chunk
    token_first = np.cumsum(token_counts) - token_counts
    sorted_tokens = _gather_records(flat_tokens, token_first, token_counts, order)
    del flat_tokens
    sentence_first = np.cumsum(sentence_counts) - sentence_counts
    s_sorted = sentence_counts[order]
    s_gather = np.repeat(sentence_first[order] - (np.cumsum(s_sorted) - s_sorted),
                         s_sorted) + np.arange(int(s_sorted.sum()))
    starts = np.append(0, np.cumsum(sentence_lengths[s_gather])).astype(np.int64)
    sorted_keys = keys[order]
    new_document = np.ones(len(order), bool)
    new_document[1:] = (sorted_keys[1:, :2] != sorted_keys[:-1, :2]).any(axis=1)
    record_first_sentence = np.cumsum(s_sorted) - s_sorted
    document_sentences = np.append(record_first_sentence[new_document], s_sorted.sum())
    return DocumentTable(sorted_tokens, starts, document_sentences.astype(np.int64))


def _gather_records(flat: np.ndarray, first: np.ndarray, counts: np.ndarray,
                    order: np.ndarray) -> np.ndarray:
    """The records' token runs ``flat[first[r]:first[r] + counts[r]]`` in ``order``, copied
    run by run into one array: the load's peak is the tokens twice, where a per-token int64
    gather index would add 8 bytes a token (sequential shards are already in order: no copy
    beyond the view)."""
    if len(order) and (np.diff(order) == 1).all() and order[0] == 0:
        return flat
    out = np.empty(int(counts.sum()), flat.dtype)
    at = 0
    for start, n in zip(first[order].tolist(), counts[order].tolist(), strict=True):
        out[at:at + n] = flat[start:start + n]
        at += n
    return out
