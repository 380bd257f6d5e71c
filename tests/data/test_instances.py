"""NSP / SOP / FULL-SENTENCES example construction (bert_jax.data.instances)."""

import collections
import random

from bert_jax.data import instances

CLS, SEP = 2, 3


def make_documents(n_docs=60, seed=0, max_sentences=20):
    """Doc d, sentence s holds ids (d+1)*10000 + s*100 + k: membership and order readable."""
    rng = random.Random(seed)
    docs = []
    for d in range(n_docs):
        docs.append([[(d + 1) * 10000 + s * 100 + k for k in range(rng.randint(3, 12))]
                     for s in range(rng.randint(2, max_sentences))])
    return docs


def split(example):
    ids, segs, label = example
    assert ids[0] == CLS and ids[-1] == SEP
    a = [t for t, s in zip(ids, segs, strict=True) if s == 0][1:-1]
    b = [t for t, s in zip(ids, segs, strict=True) if s == 1][:-1]
    return a, b, label


def position(t):
    return (t % 10000) // 100, t % 100


def test_nsp_balance_random_next_and_lengths():
    # Long documents: a chunk of one sentence at a document's end is always a random next (as
    # in Google's script), which tilts the balance on short documents.
    docs = make_documents(max_sentences=60)
    stats = collections.Counter()
    examples = instances.create_examples(docs, "nsp", 64, 0.1, 3, random.Random(1), CLS, SEP,
                                         stats)
    labels = [e[2] for e in examples]
    assert len(examples) > 400
    assert 0.4 < sum(labels) / len(labels) < 0.6
    for e in examples:
        assert len(e[0]) <= 64 and len(e[0]) == len(e[1])
        a, b, label = split(e)
        assert a and b
        doc_a, doc_b = {t // 10000 for t in a}, {t // 10000 for t in b}
        assert len(doc_a) == 1 and len(doc_b) == 1
        if label == 1:
            assert doc_a != doc_b  # random next comes from another document
        else:
            assert doc_a == doc_b and position(b[0]) > position(a[-1])  # true continuation


def test_unused_sentences_go_back():
    """With random next, the chunk's unused sentences start the next example."""
    docs = make_documents(40, seed=3)
    stats = collections.Counter()
    examples = instances.create_examples(docs, "nsp", 512, 0.0, 1, random.Random(2), CLS, SEP,
                                         stats)
    # Every sentence of every document appears in some segment A or true-next B.
    seen = set()
    for e in examples:
        a, b, label = split(e)
        seen.update(position_key(t) for t in a)
        if label == 0:
            seen.update(position_key(t) for t in b)
    expected = {(d + 1, s) for d, doc in enumerate(docs) for s in range(len(doc))}
    assert expected <= seen


def position_key(t):
    return t // 10000, (t % 10000) // 100


def test_sop_swaps_and_same_document():
    docs = make_documents()
    examples = instances.create_examples(docs, "sop", 64, 0.1, 2, random.Random(1), CLS, SEP,
                                         collections.Counter())
    labels = [e[2] for e in examples]
    assert 0.4 < sum(labels) / len(labels) < 0.6
    for e in examples:
        a, b, label = split(e)
        assert {t // 10000 for t in a + b} == {a[0] // 10000}  # one document, never random
        first, second = (b, a) if label == 1 else (a, b)
        assert position(second[0]) > position(first[-1])  # label 1 <=> swapped order


def test_full_sentences_cross_documents_with_sep():
    docs = make_documents()
    examples = instances.full_sentence_examples(docs, 64, CLS, SEP)
    crossed = 0
    body_tokens = []
    for ids, segs, label in examples:
        assert len(ids) <= 64 and label == 0 and set(segs) == {0}
        body = ids[1:-1]
        parts, cur = [], []
        for t in body:
            if t == SEP:
                parts.append(cur)
                cur = []
            else:
                cur.append(t)
        parts.append(cur)
        crossed += len(parts) > 1
        for p in parts:
            assert len({t // 10000 for t in p}) == 1  # a [SEP] at every document boundary
        body_tokens += [t for t in body if t != SEP]
    assert crossed > 0
    # contiguous and complete: every token once, in order
    assert body_tokens == [t for d in docs for s in d for t in s]


def test_truncation_takes_from_longer_segment():
    a, b = list(range(50)), list(range(100, 110))
    instances.truncate_seq_pair(a, b, 30, random.Random(0))
    assert len(a) == 20 and b == list(range(100, 110))
    assert a != list(range(20))  # random ends, not only the tail
