"""Statistics of the vectorised dynamic masking (bert_jax.data.masking)."""

import dataclasses

import numpy as np
import pytest

from bert_jax.data.masking import MaskingConfig, _unit_starts, make_tables, mask_batch
from bert_jax.errors import BertJaxError

tf = pytest.importorskip("tensorflow")

VOCAB = 200
SPECIAL = (0, 1, 2, 3, 4)  # pad unk cls sep mask
MASK = 4
S, P = 64, 12


def make_ids(batch=1024, seed=0):
    """[CLS] a [SEP] b [SEP] [PAD]...: content ids 5..199, variable lengths."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((batch, S), np.int32)
    for r in range(batch):
        n = rng.integers(10, S - 2)
        split = rng.integers(1, n)
        body = rng.integers(5, VOCAB, size=n)
        row = [2, *body[:split], 3, *body[split:], 3]
        ids[r, :len(row)] = row
    return ids


def run(ids, seed=(1, 2), **kw):
    config = MaskingConfig(vocab_size=VOCAB, special_ids=SPECIAL, mask_id=MASK,
                           max_predictions=P, **kw)
    out = mask_batch(tf.constant(ids), tf.constant(seed, tf.int64), config, make_tables(config))
    return [np.asarray(x) for x in out]


def selected_mask(ids, positions, weights):
    sel = np.zeros(ids.shape, bool)
    rows = np.repeat(np.arange(ids.shape[0]), positions.shape[1])
    keep = weights.reshape(-1) > 0
    sel[rows[keep], positions.reshape(-1)[keep]] = True
    return sel


def test_rate_split_and_specials():
    ids = make_ids()
    masked, positions, lm_ids, weights = run(ids)
    sel = selected_mask(ids, positions, weights)
    candidates = ids >= 5
    n = candidates.sum(1)
    expected = np.minimum(np.clip(np.round(n * 0.15), 1, P), n)
    np.testing.assert_array_equal(weights.sum(1), expected)
    assert not sel[~candidates].any()  # never special or padding
    # labels are the original ids; positions ascending among the real ones
    np.testing.assert_array_equal(lm_ids[weights > 0], ids[selected_mask(ids, positions,
                                                                         weights)])
    for r in range(len(ids)):
        k = int(weights[r].sum())
        assert (np.diff(positions[r, :k]) > 0).all()
        assert (positions[r, k:] == 0).all() and (lm_ids[r, k:] == 0).all()
    # unselected tokens untouched; 80/10/10 among the selected
    np.testing.assert_array_equal(masked[~sel], ids[~sel])
    total = sel.sum()
    as_mask = (masked[sel] == MASK).sum() / total
    unchanged = (masked[sel] == ids[sel]).sum() / total
    random_ = 1 - as_mask - unchanged
    assert total > 4000
    assert abs(as_mask - 0.8) < 0.03 and abs(unchanged - 0.1) < 0.02 and abs(random_ - 0.1) < 0.02
    # random replacements are never special tokens
    replaced = masked[sel & (masked != MASK) & (masked != ids)]
    assert (replaced >= 5).all()


def test_deterministic_per_seed_and_different_across_seeds():
    ids = make_ids(64)
    a, b, c = run(ids, (7, 3)), run(ids, (7, 3)), run(ids, (7, 4))
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[1], c[1])


def test_whole_word_keeps_words_whole():
    ids = make_ids()
    word_start = np.ones(VOCAB, bool)
    word_start[100:] = False  # ids >= 100 continue the previous word
    masked, positions, _, weights = run(ids, whole_word=True, word_start_mask=word_start)
    sel = selected_mask(ids, positions, weights)
    candidates = ids >= 5
    assert not sel[~candidates].any()
    # word id per token: a new word at each word-start candidate or after a special token
    starts = candidates & (word_start[ids] | ~np.pad(candidates, ((0, 0), (1, 0)))[:, :-1])
    word = np.cumsum(starts, 1)
    for r in range(len(ids)):
        for w in np.unique(word[r][sel[r]]):
            members = candidates[r] & (word[r] == w)
            assert sel[r][members].all()  # all pieces of a chosen word
    n = candidates.sum(1)
    budget = np.minimum(np.clip(np.round(n * 0.15), 1, P), n)
    assert (weights.sum(1) <= budget).all()
    assert weights.sum() / budget.sum() > 0.8  # stop-at-first-misfit loses only a little


def test_span_masking_contiguous_spans():
    ids = make_ids()
    _, positions, _, weights = run(ids, span_masking=True)
    sel = selected_mask(ids, positions, weights)
    assert not sel[ids < 5].any()
    n = (ids >= 5).sum(1)
    budget = np.minimum(np.clip(np.round(n * 0.15), 1, P), n)
    assert (weights.sum(1) <= budget).all()
    runs = []
    for r in range(len(ids)):
        edges = np.diff(np.concatenate([[0], sel[r].astype(int), [0]]))
        runs += list(np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1))
    # spans, not scattered tokens: runs much longer than independent token masking gives
    assert np.mean(runs) > 2.0 and max(runs) <= 2 * 10


def test_units_stay_inside_packed_examples():
    """Packed rows (``example_ids``): each example's first token starts a new word and span,
    even where no special token separates the examples; where one does (real packed data),
    the masks are those of the rows without ``example_ids``."""
    word_start = np.ones(VOCAB, bool)
    word_start[100:] = False  # ids >= 100 continue the previous word
    words = MaskingConfig(vocab_size=VOCAB, special_ids=SPECIAL, mask_id=MASK,
                          max_predictions=P, whole_word=True, word_start_mask=word_start)
    config = dataclasses.replace(words, span_masking=True, span_p=0.05)
    tables = make_tables(config)
    ids = np.random.default_rng(3).integers(5, VOCAB, (256, S)).astype(np.int32)
    example_ids = np.repeat(np.arange(1, 5, dtype=np.int32), S // 4)[None].repeat(len(ids), 0)
    firsts = np.arange(0, S, S // 4)
    seed = tf.constant((4, 5), tf.int64)
    candidate = tf.ones(ids.shape, tf.bool)
    rest = np.ones(S, bool)
    rest[firsts] = False
    for cfg in (words, config):
        unpacked, packed = (np.asarray(_unit_starts(tf.constant(ids), candidate, cfg, tables,
                                                    seed, example_ids=e))
                            for e in (None, tf.constant(example_ids)))
        assert not unpacked[:, firsts].all()  # unpacked, words and spans run on
        assert packed[:, firsts].all()
        if cfg is words:  # the other words as unpacked (spans draw their ends afresh)
            np.testing.assert_array_equal(packed[:, rest], unpacked[:, rest])

    ids = make_ids(256)  # [CLS] a [SEP] b [SEP]: examples split after each [SEP]
    example_ids = 1 + np.cumsum(np.pad(ids == 3, ((0, 0), (1, 0)))[:, :-1], 1)
    masks = [mask_batch(tf.constant(ids), seed, config, tables, example_ids=e)
             for e in (None, tf.constant(example_ids.astype(np.int32)))]
    for unpacked, packed in zip(*masks, strict=True):
        np.testing.assert_array_equal(np.asarray(packed), np.asarray(unpacked))


def test_whole_word_needs_word_starts():
    with pytest.raises(BertJaxError, match="word_start_mask"):
        MaskingConfig(vocab_size=VOCAB, special_ids=SPECIAL, mask_id=MASK, max_predictions=P,
                      whole_word=True).validate()


@pytest.mark.parametrize("shown, random_", [(1.0, 0.0), (0.5, 0.3)])
def test_mask_and_random_fractions_are_honoured(shown, random_):
    ids = make_ids()
    masked, positions, _, weights = run(ids, mask_token_fraction=shown,
                                        random_token_fraction=random_)
    sel = selected_mask(ids, positions, weights)
    np.testing.assert_array_equal(masked[~sel], ids[~sel])
    total = sel.sum()
    as_mask = (masked[sel] == MASK).sum() / total
    # a random replacement may draw the original token (1 in 195 here)
    unchanged = (masked[sel] == ids[sel]).sum() / total
    assert total > 4000
    assert abs(as_mask - shown) < 0.03
    assert abs(unchanged - (1 - shown - random_)) < 0.02
    assert abs(1 - as_mask - unchanged - random_) < 0.02


@pytest.mark.parametrize("fields, message", [
    ({"mask_token_fraction": 1.2}, "mask_token_fraction 1.2"),
    ({"random_token_fraction": -0.1}, "random_token_fraction -0.1"),
    ({"mask_token_fraction": 0.9, "random_token_fraction": 0.2}, "at most 1"),
])
def test_bad_fractions_are_named(fields, message):
    with pytest.raises(BertJaxError, match=message):
        MaskingConfig(vocab_size=VOCAB, special_ids=SPECIAL, mask_id=MASK, max_predictions=P,
                      **fields).validate()
