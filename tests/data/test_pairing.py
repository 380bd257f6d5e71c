"""Run-time pairing plans against the offline reference (instances.py) on a fixture corpus."""

import collections
import random

import numpy as np
import pytest

from bert_jax.data import instances
from bert_jax.data.documents import table_from_documents
from bert_jax.data.pairing import make_plan, materialize, truncated_lengths
from bert_jax.errors import BertJaxError

CLS, SEP, PAD = 2, 3, 0
SEQ = 64


def corpus(num_docs=300, seed=0, max_sentence=25):
    """Documents of 1-30 sentences of 1-``max_sentence`` tokens; token ids 10+."""
    rng = random.Random(seed)
    return [[[rng.randint(10, 999) for _ in range(rng.randint(1, max_sentence))]
             for _ in range(rng.randint(1, 30))] for _ in range(num_docs)]


@pytest.fixture(scope="module")
def docs():
    return corpus()


@pytest.fixture(scope="module")
def table(docs):
    return table_from_documents(docs)


def plan_lengths(plan):
    lengths = plan.piece_hi - plan.piece_lo
    return lengths[0::2], lengths[1::2]


def reference_examples(docs, mode, epochs, short_seq_prob=0.1):
    out = []
    for epoch in range(epochs):
        rng = random.Random(epoch)
        for index in range(len(docs)):
            out += instances.pair_examples_from_document(
                docs, index, SEQ, short_seq_prob, mode, rng, CLS, SEP, collections.Counter())
    return out


def test_truncation_lengths_match_truncate_seq_pair():
    for len_a in range(40):
        for len_b in range(40):
            for limit in (5, 8, 9, 61):
                a, b = list(range(len_a)), list(range(len_b))
                instances.truncate_seq_pair(a, b, limit, random.Random(0))
                got = truncated_lengths(np.array([len_a]), np.array([len_b]), limit)
                assert (len(a), len(b)) == (got[0][0], got[1][0])


def test_nsp_length_distributions_match_the_reference(docs, table):
    epochs = 24
    ref = reference_examples(docs, "nsp", epochs)
    ref_a = np.array([segs.count(0) - 2 for _, segs, _ in ref])
    ref_b = np.array([segs.count(1) - 1 for _, segs, _ in ref])
    ref_label = np.array([label for _, _, label in ref])
    plans = [make_plan(table, "nsp", SEQ, 0.1, np.random.default_rng([7, e]))
             for e in range(epochs)]
    len_a = np.concatenate([plan_lengths(p)[0] for p in plans])
    len_b = np.concatenate([plan_lengths(p)[1] for p in plans])
    labels = np.concatenate([p.labels for p in plans])
    # Examples per epoch, NotNext rate and the length distributions agree with the reference.
    assert abs(len(labels) / len(ref_label) - 1) < 0.03
    assert abs(labels.mean() - ref_label.mean()) < 0.02
    for ours, theirs in ((len_a, ref_a), (len_b, ref_b), (len_a + len_b, ref_a + ref_b)):
        assert abs(ours.mean() - theirs.mean()) < 0.02 * theirs.mean()
        qs = [10, 25, 50, 75, 90]
        assert np.abs(np.percentile(ours, qs) - np.percentile(theirs, qs)).max() <= 2
        for label in (0, 1):
            mine, ref_part = ours[labels == label], theirs[ref_label == label]
            assert abs(mine.mean() - ref_part.mean()) < 0.04 * ref_part.mean()
    assert len_a.min() >= 1 and len_b.min() >= 1
    assert (len_a + len_b).max() <= SEQ - 3


def test_is_next_rate_is_one_half_with_multi_sentence_chunks():
    # Many short sentences: one-sentence chunks (always NotNext) are rare.
    rng = random.Random(1)
    docs = [[[rng.randint(10, 999) for _ in range(rng.randint(2, 6))] for _ in range(60)]
            for _ in range(100)]
    table = table_from_documents(docs)
    labels = np.concatenate([make_plan(table, "nsp", SEQ, 0.0,
                                       np.random.default_rng(e)).labels for e in range(8)])
    n = len(labels)
    assert n > 3000
    assert abs(labels.mean() - 0.5) < 3 * 0.5 / np.sqrt(n) + 0.01


def test_not_next_partner_is_always_another_document(table):
    for epoch in range(5):
        plan = make_plan(table, "nsp", SEQ, 0.1, np.random.default_rng(epoch))
        doc_a = table.document_of_token(plan.piece_lo[0::2])
        doc_b = table.document_of_token(plan.piece_lo[1::2])
        # B's last token is in the same document as its first (segments never cross a document).
        assert (table.document_of_token(plan.piece_hi[1::2] - 1) == doc_b).all()
        assert (table.document_of_token(plan.piece_hi[0::2] - 1) == doc_a).all()
        assert (doc_a == plan.document).all()
        not_next = plan.labels == 1
        assert not_next.sum() > 0.4 * plan.num_examples
        assert (doc_b[not_next] != doc_a[not_next]).all()
        assert (doc_b[~not_next] == doc_a[~not_next]).all()
        # IsNext: B starts where A's (untruncated) chunk continues, i.e. after A.
        assert (plan.piece_lo[1::2][~not_next] >= plan.piece_hi[0::2][~not_next]).all()
    # Partners come from the whole table: over a few epochs most documents serve as one.
    partners = set()
    for epoch in range(5):
        plan = make_plan(table, "nsp", SEQ, 0.1, np.random.default_rng(epoch))
        partners |= set(table.document_of_token(plan.piece_lo[1::2][plan.labels == 1]).tolist())
    assert len(partners) > 0.9 * table.num_documents


def test_short_sequence_fraction(table):
    max_num_tokens = SEQ - 3
    short, total = 0, 0
    for epoch in range(40):
        plan = make_plan(table, "nsp", SEQ, 0.2, np.random.default_rng(epoch))
        _, first = np.unique(plan.document, return_index=True)  # one target per document
        targets = plan.target[first]
        assert targets.min() >= 2 and targets.max() == max_num_tokens
        short += int((targets < max_num_tokens).sum())
        total += len(targets)
    # P(target < max) = 0.2 * (max - 2) / (max - 1); binomial standard deviation for the bound.
    expected = 0.2 * (max_num_tokens - 2) / (max_num_tokens - 1)
    assert abs(short / total - expected) < 4 * np.sqrt(expected * (1 - expected) / total)


def test_no_example_longer_than_max_and_materialized_layout(table):
    for pairing in ("nsp", "sop", "full_sentences", "doc_sentences"):
        plan = make_plan(table, pairing, SEQ, 0.1, np.random.default_rng(3))
        rows = np.arange(plan.num_examples)
        ids, segs, labels = materialize(table, plan, rows, SEQ, CLS, SEP, PAD)
        lengths = (ids != PAD).sum(axis=1)
        assert lengths.max() <= SEQ and (ids[:, 0] == CLS).all()
        assert (ids[np.arange(len(ids)), lengths - 1] == SEP).all()
        np.testing.assert_array_equal(labels, plan.labels)
        if pairing in ("nsp", "sop"):
            assert ((ids == SEP).sum(axis=1) == 2).all()
            len_a, len_b = plan_lengths(plan)
            np.testing.assert_array_equal((segs == 0).sum(axis=1) - (SEQ - lengths), len_a + 2)
            np.testing.assert_array_equal(segs.sum(axis=1), len_b + 1)
            np.testing.assert_array_equal(ids[rows, 1], table.tokens[plan.piece_lo[0::2]])
        else:
            assert (segs == 0).all()
    with pytest.raises(BertJaxError, match="does not fit"):
        materialize(table, plan, rows, SEQ - 10, CLS, SEP, PAD)


def test_sop_segments_are_adjacent_text_swapped_half_the_time(table):
    plan = make_plan(table, "sop", SEQ, 0.1, np.random.default_rng(0))
    a_lo, b_lo = plan.piece_lo[0::2], plan.piece_lo[1::2]
    doc_a, doc_b = table.document_of_token(a_lo), table.document_of_token(b_lo)
    assert (doc_a == doc_b).all()
    swapped = plan.labels == 1
    assert (a_lo[~swapped] < b_lo[~swapped]).all() and (a_lo[swapped] > b_lo[swapped]).all()
    n = plan.num_examples
    assert abs(swapped.mean() - 0.5) < 4 * 0.5 / np.sqrt(n)
    mine = sum(make_plan(table, "sop", SEQ, 0.1, np.random.default_rng(e)).num_examples
               for e in range(8))
    ref = reference_examples(corpus(), "sop", 8)
    assert abs(mine / len(ref) - 1) < 0.03


@pytest.mark.parametrize("pairing", ["full_sentences", "doc_sentences"])
def test_packing_equals_the_reference(docs, table, pairing):
    """FULL-SENTENCES: instances.full_sentence_examples over the plan's document order;
    DOC-SENTENCES: the same packing per document."""
    long_docs = docs + [[list(range(10, 10 + 150))]]  # a sentence longer than an example
    table = table_from_documents(long_docs)
    seed = 11
    plan = make_plan(table, pairing, SEQ, 0.1, np.random.default_rng(seed))
    ids, segs, _ = materialize(table, plan, np.arange(plan.num_examples), SEQ, CLS, SEP, PAD)
    if pairing == "full_sentences":
        order = np.random.default_rng(seed).permutation(len(long_docs))
        ref = instances.full_sentence_examples([long_docs[k] for k in order], SEQ, CLS, SEP)
    else:
        ref = [e for d in long_docs for e in instances.full_sentence_examples([d], SEQ, CLS, SEP)]
    assert len(ref) == plan.num_examples
    for row, (ref_ids, _, _) in enumerate(ref):
        assert ids[row, :len(ref_ids)].tolist() == ref_ids
        assert (ids[row, len(ref_ids):] == PAD).all()


def test_each_epoch_pairs_differently(table):
    def pairs(epoch):
        plan = make_plan(table, "nsp", SEQ, 0.1, np.random.default_rng([5, epoch]))
        return set(zip(plan.piece_lo.tolist()[0::2], plan.piece_lo.tolist()[1::2],
                       plan.labels.tolist(), strict=True))

    first, second = pairs(0), pairs(1)
    assert pairs(0) == first  # a pure function of the generator seed
    assert len(first & second) < 0.3 * len(first)


def test_nsp_needs_two_documents():
    with pytest.raises(BertJaxError, match="at least 2 documents"):
        make_plan(table_from_documents([[[10, 11], [12, 13]]]), "nsp", SEQ, 0.1,
                  np.random.default_rng(0))
    with pytest.raises(BertJaxError, match="pairing"):
        make_plan(table_from_documents([[[10, 11]]]), "nsp2", SEQ, 0.1, np.random.default_rng(0))
