"""Examples from a :class:`~bert_jax.data.documents.DocumentTable`, drawn afresh each epoch.

A *plan* lists an epoch's examples as token ranges of the table; :func:`materialize` turns rows
of a plan into padded ``input_ids`` / ``segment_ids``. Plans are vectorised numpy over all
documents at once, with every random draw taken from one ``numpy.random.Generator`` in a fixed
order, so a plan is a pure function of (table, settings, generator seed). Pairings:

* ``nsp`` — Google's ``create_instances_from_document`` (``instances.py`` is the plain-Python
  reference): per document a target length (``max_seq_length - 3``, or with
  ``short_seq_prob`` uniform in [2, max]); sentences are gathered until the target is reached
  (or the document ends); A is the chunk up to a uniform split; B is the rest of the chunk
  (IsNext, label 0), or — always for a one-sentence chunk, otherwise with probability 0.5 —
  sentences from a uniform start in a *different* document drawn uniformly from all documents
  of the table, until ``target - len(A)`` tokens (NotNext, label 1), the unused sentences going
  back into the stream. The documents advance one chunk per vectorised round.
* ``sop`` — ALBERT: B is always the true continuation (a one-sentence chunk is split inside the
  sentence at a uniform token; a one-token chunk gives no example); the segments are swapped
  with probability 0.5 (label 1).
* ``full_sentences`` — RoBERTa FULL-SENTENCES: the documents in a fresh random order, whole
  sentences packed greedily up to ``max_seq_length - 2`` tokens across document boundaries,
  [SEP] between documents; label 0, one segment.
* ``doc_sentences`` — RoBERTa DOC-SENTENCES: the same packing, never across a document end.

Pairs are truncated as BERT's ``truncate_seq_pair`` does (the longer segment loses a token,
B on ties, until they fit): the final lengths follow in closed form, and the number of tokens
cut from the front of a segment is Binomial(cut, 0.5), as one coin per removed token gives.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bert_jax.data.documents import DocumentTable
from bert_jax.errors import BertJaxError

PAIRINGS = ("nsp", "sop", "full_sentences", "doc_sentences")


@dataclasses.dataclass(frozen=True)
class Plan:
    """An epoch's examples: example ``e`` is pieces ``example_pieces[e]:example_pieces[e+1]``,
    each the tokens ``[piece_lo, piece_hi)`` of the table followed by [SEP], after [CLS]."""

    piece_lo: np.ndarray  # int64 [P]
    piece_hi: np.ndarray  # int64 [P]
    piece_segment: np.ndarray  # int8 [P]
    example_pieces: np.ndarray  # int64 [E + 1]
    labels: np.ndarray  # int8 [E]: 1 = NotNext (nsp) / swapped (sop)
    target: np.ndarray  # int32 [E]: the target length of the example's document (pairs)
    document: np.ndarray  # int64 [E]: the document of the example's first token

    @property
    def num_examples(self) -> int:
        return len(self.labels)


def truncated_lengths(len_a: np.ndarray, len_b: np.ndarray, max_num_tokens: int
                      ) -> tuple[np.ndarray, np.ndarray]:
    """The lengths ``truncate_seq_pair`` leaves: the longer loses a token (B on ties)."""
    over = len_a + len_b > max_num_tokens
    new_a = np.minimum(len_a, np.maximum((max_num_tokens + 1) // 2, max_num_tokens - len_b))
    new_b = np.minimum(len_b, max_num_tokens - new_a)
    return np.where(over, new_a, len_a), np.where(over, new_b, len_b)


def _pair_plan(table: DocumentTable, mode: str, max_seq_length: int, short_seq_prob: float,
               rng: np.random.Generator) -> Plan:
    starts = table.sentence_starts
    doc_first = table.document_sentences
    num_docs = table.num_documents
    max_num_tokens = max_seq_length - 3
    if mode == "nsp" and num_docs < 2:
        raise BertJaxError("nsp pairing needs at least 2 documents (NotNext segments come "
                           f"from another document); the data has {num_docs}")
    target = np.full(num_docs, max_num_tokens, np.int64)
    short = rng.random(num_docs) < short_seq_prob
    target[short] = rng.integers(2, max_num_tokens + 1, size=int(short.sum()))
    current = doc_first[:-1].copy()  # the next sentence of every document
    parts: list[tuple] = []
    active = np.flatnonzero(current < doc_first[1:])
    while active.size:
        i, end, t = current[active], doc_first[active + 1], target[active]
        # The chunk ends at the first sentence j where the chunk reaches the target.
        j = np.clip(np.searchsorted(starts, starts[i] + t, side="left") - 1, i, end - 1)
        n = j - i + 1
        a_end = np.ones_like(n)
        many = n >= 2
        a_end[many] = rng.integers(1, n[many])  # uniform in [1, n - 1]
        a_lo, a_hi = starts[i], starts[i + a_end]
        b_lo, b_hi = starts[i + a_end], starts[j + 1]
        keep = np.ones(len(active), bool)
        label = np.zeros(len(active), np.int8)
        nxt = j + 1
        if mode == "nsp":
            random_next = (n == 1) | (rng.random(len(active)) < 0.5)
            r = np.flatnonzero(random_next)
            other = rng.integers(0, num_docs - 1, size=r.size)
            other += other >= active[r]  # uniform over the other documents
            first, last = doc_first[other], doc_first[other + 1]
            start = first + (rng.random(r.size) * (last - first)).astype(np.int64)
            want = t[r] - (a_hi[r] - a_lo[r])
            stop = np.searchsorted(starts, starts[start] + want, side="left") - 1
            stop = np.clip(stop, start, last - 1)
            b_lo[r], b_hi[r] = starts[start], starts[stop + 1]
            label[r] = 1
            nxt[r] = i[r] + a_end[r]  # the unused sentences go back into the stream
        else:  # sop
            single = np.flatnonzero(n == 1)
            length = a_hi[single] - a_lo[single]
            keep[single[length < 2]] = False
            ok = single[length >= 2]
            split = a_lo[ok] + 1 + (rng.random(ok.size) * (a_hi[ok] - a_lo[ok] - 1)
                                    ).astype(np.int64)
            b_lo[ok], b_hi[ok], a_hi[ok] = split, a_hi[ok], split
            swap = rng.random(len(active)) < 0.5
            a_lo, a_hi, b_lo, b_hi = (np.where(swap, b_lo, a_lo), np.where(swap, b_hi, a_hi),
                                      np.where(swap, a_lo, b_lo), np.where(swap, a_hi, b_hi))
            label = swap.astype(np.int8)
        current[active] = nxt
        k = np.flatnonzero(keep)
        parts.append((a_lo[k], a_hi[k], b_lo[k], b_hi[k], label[k], t[k], active[k]))
        active = active[current[active] < end]

    a_lo, a_hi, b_lo, b_hi, labels, targets, docs = (np.concatenate(column)
                                                     for column in zip(*parts, strict=True))
    len_a, len_b = a_hi - a_lo, b_hi - b_lo
    new_a, new_b = truncated_lengths(len_a, len_b, max_num_tokens)
    front_a = rng.binomial(len_a - new_a, 0.5)
    front_b = rng.binomial(len_b - new_b, 0.5)
    a_lo, b_lo = a_lo + front_a, b_lo + front_b
    num = len(labels)
    lo = np.stack([a_lo, b_lo], axis=1).reshape(-1)
    hi = np.stack([a_lo + new_a, b_lo + new_b], axis=1).reshape(-1)
    segment = np.tile(np.array([0, 1], np.int8), num)
    return Plan(lo, hi, segment, np.arange(0, 2 * num + 1, 2, dtype=np.int64),
                labels.astype(np.int8), targets.astype(np.int32), docs)


def _packing_plan(table: DocumentTable, cross_documents: bool, max_seq_length: int,
                  rng: np.random.Generator) -> Plan:
    """FULL-SENTENCES (``cross_documents``) or DOC-SENTENCES greedy packing."""
    capacity = max_seq_length - 2
    table = table.split_long_sentences(capacity)
    doc_first = table.document_sentences
    counts = np.diff(doc_first)
    order_docs = rng.permutation(table.num_documents) if cross_documents \
        else np.arange(table.num_documents)
    counts_in_order = counts[order_docs]
    first_position = np.cumsum(counts_in_order) - counts_in_order
    sentence = np.repeat(doc_first[order_docs] - first_position, counts_in_order) + np.arange(
        table.num_sentences)  # sentence ids in stream order
    lengths = table.sentence_starts[sentence + 1] - table.sentence_starts[sentence]
    num = len(sentence)
    doc_start = np.zeros(num, bool)
    doc_start[first_position] = True
    total = np.append(0, np.cumsum(lengths))
    if cross_documents:
        # Sentences [i, j) take total[j] - total[i] tokens plus one [SEP] per document start
        # strictly inside: W[j] - U[i] with W = total + starts so far, U[i] = W[i] + start[i].
        starts_before = np.append(0, np.cumsum(doc_start))
        w = total + starts_before
        u = w[:-1] + doc_start
        nxt = np.searchsorted(w, u + capacity, side="right") - 1
    else:
        doc_end = np.repeat(first_position + counts_in_order, counts_in_order)
        nxt = np.minimum(np.searchsorted(total, total[:-1] + capacity, side="right") - 1,
                         doc_end)
    nxt = np.maximum(nxt, np.arange(1, num + 1)).tolist()
    example_starts = []
    i = 0
    while i < num:
        example_starts.append(i)
        i = nxt[i]
    example_starts = np.array(example_starts, np.int64)
    is_piece_start = doc_start.copy()
    is_piece_start[example_starts] = True
    piece_start = np.flatnonzero(is_piece_start)
    piece_last = np.append(piece_start[1:], num) - 1
    # Within a document the stream's sentences are contiguous in the table.
    piece_lo = table.sentence_starts[sentence[piece_start]]
    piece_hi = table.sentence_starts[sentence[piece_last] + 1]
    example_pieces = np.append(np.searchsorted(piece_start, example_starts), len(piece_start))
    num_examples = len(example_starts)
    return Plan(piece_lo, piece_hi, np.zeros(len(piece_start), np.int8), example_pieces,
                np.zeros(num_examples, np.int8), np.full(num_examples, capacity, np.int32),
                np.repeat(order_docs, counts_in_order)[example_starts])


def make_plan(table: DocumentTable, pairing: str, max_seq_length: int, short_seq_prob: float,
              rng: np.random.Generator) -> Plan:
    """One epoch's examples (in document order; the caller permutes them)."""
    if pairing not in PAIRINGS:
        raise BertJaxError(f"pairing {pairing!r}: expected one of {PAIRINGS}")
    if max_seq_length < 5:
        raise BertJaxError(f"max_seq_length {max_seq_length}: must be at least 5")
    if not 0.0 <= short_seq_prob <= 1.0:
        raise BertJaxError(f"short_seq_prob {short_seq_prob}: must be in [0, 1]")
    if pairing in ("nsp", "sop"):
        plan = _pair_plan(table, pairing, max_seq_length, short_seq_prob, rng)
    else:
        plan = _packing_plan(table, pairing == "full_sentences", max_seq_length, rng)
    if plan.num_examples == 0:
        raise BertJaxError(f"{pairing} pairing: the documents give no examples")
    return plan


def example_lengths(plan: Plan) -> np.ndarray:
    """int64 [E]: the tokens :func:`materialize` lays out for each example of ``plan``
    ([CLS], then every piece followed by [SEP])."""
    taken = np.append(0, np.cumsum(plan.piece_hi - plan.piece_lo + 1))
    return 1 + taken[plan.example_pieces[1:]] - taken[plan.example_pieces[:-1]]


def materialize(table: DocumentTable, plan: Plan, rows: np.ndarray, seq_len: int, cls_id: int,
                sep_id: int, pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """int32 input_ids [R, seq_len] ([CLS] piece [SEP] piece [SEP] ..., padded), segment_ids
    [R, seq_len] and labels [R] of plan ``rows``."""
    num = len(rows)
    if len(plan.piece_lo) == 2 * plan.num_examples:  # pairs: one vectorised layout
        return _materialize_pairs(table, plan, rows, seq_len, cls_id, sep_id, pad_id)
    first, last = plan.example_pieces[rows], plan.example_pieces[rows + 1]
    pieces_per_row = last - first
    piece = np.repeat(first - (np.cumsum(pieces_per_row) - pieces_per_row),
                      pieces_per_row) + np.arange(int(pieces_per_row.sum()))
    piece_row = np.repeat(np.arange(num), pieces_per_row)
    lo, length = plan.piece_lo[piece], plan.piece_hi[piece] - plan.piece_lo[piece]
    segment = plan.piece_segment[piece]
    # Column of each piece's first token: 1 ([CLS]) + earlier pieces of the row and their [SEP]s.
    taken = np.cumsum(length + 1)
    row_first_piece = np.cumsum(pieces_per_row) - pieces_per_row
    before_row = np.where(row_first_piece > 0, taken[np.maximum(row_first_piece - 1, 0)], 0)
    column = 1 + taken - (length + 1) - np.repeat(before_row, pieces_per_row)
    longest = int((column + length + 1).max(initial=0))
    if longest > seq_len:
        raise BertJaxError(f"an example of {longest} tokens does not fit seq_len {seq_len}")
    ids = np.full((num, seq_len), pad_id, np.int32)
    segs = np.zeros((num, seq_len), np.int32)
    ids[:num, 0] = cls_id
    count = int(length.sum())
    within = np.arange(count) - np.repeat(np.cumsum(length) - length, length)
    token_row = np.repeat(piece_row, length)
    token_col = np.repeat(column, length) + within
    ids[token_row, token_col] = table.tokens[np.repeat(lo, length) + within]
    segs[token_row, token_col] = np.repeat(segment, length)
    ids[piece_row, column + length] = sep_id
    segs[piece_row, column + length] = segment
    return ids, segs, plan.labels[rows].astype(np.int32)


def _materialize_pairs(table: DocumentTable, plan: Plan, rows: np.ndarray, seq_len: int,
                       cls_id: int, sep_id: int, pad_id: int
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[CLS] A [SEP] B [SEP] for every row at once: column c of a row holds A's token c - 1,
    or B's token c - 2 - len(A)."""
    a_lo, b_lo = plan.piece_lo[2 * rows][:, None], plan.piece_lo[2 * rows + 1][:, None]
    len_a = plan.piece_hi[2 * rows][:, None] - a_lo
    len_b = plan.piece_hi[2 * rows + 1][:, None] - b_lo
    longest = int((len_a + len_b).max(initial=0)) + 3
    if longest > seq_len:
        raise BertJaxError(f"an example of {longest} tokens does not fit seq_len {seq_len}")
    column = np.arange(seq_len)[None, :]
    in_b = column >= len_a + 2
    source = np.where(in_b, b_lo - 2 - len_a, a_lo - 1) + column
    ids = table.tokens[np.clip(source, 0, len(table.tokens) - 1)].astype(np.int32)
    end = len_a + len_b + 2  # the last [SEP]
    ids[(column == len_a + 1) | (column == end)] = sep_id
    ids[:, 0] = cls_id
    ids[column > end] = pad_id
    segs = (in_b & (column <= end)).astype(np.int32)
    return ids, segs, plan.labels[rows].astype(np.int32)
