"""SpanBERT span masking and ERNIE knowledge masking (bert_jax.data.masking,
bert_jax.data.knowledge_masking)."""

import numpy as np
import pytest

from bert_jax.data import knowledge_masking
from bert_jax.data.masking import MaskingConfig, _unit_starts, make_tables, mask_batch, mode_flags
from bert_jax.errors import BertJaxError

tf = pytest.importorskip("tensorflow")

VOCAB = 300
SPECIAL = (0, 1, 2, 3, 4)
MASK = 4
WORD_START = np.ones(VOCAB, bool)
WORD_START[200:] = False  # ids >= 200 continue the previous word


def make_rows(batch, seq, continuation=0.0, seed=0):
    """[CLS] body [SEP] with a fraction of continuation pieces (ids >= 200)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, 200, size=(batch, seq)).astype(np.int32)
    cont = rng.random((batch, seq)) < continuation
    ids[cont] = rng.integers(200, VOCAB, size=int(cont.sum()))
    ids[:, 1] = rng.integers(5, 200, size=batch)  # the body starts a word
    ids[:, 0], ids[:, -1] = 2, 3
    return ids


def config(mode, max_predictions, **kw):
    return MaskingConfig(vocab_size=VOCAB, special_ids=SPECIAL, mask_id=MASK,
                         max_predictions=max_predictions, word_start_mask=WORD_START,
                         **mode_flags(mode), **kw)


def runs(row_bool):
    """(start, end) of each run of True."""
    padded = np.concatenate([[False], row_bool, [False]]).astype(int)
    d = np.diff(padded)
    return list(zip(np.flatnonzero(d == 1), np.flatnonzero(d == -1), strict=True))


def test_span_lengths_are_geometric_in_words_clipped_at_10():
    # Two-token words everywhere: span lengths must be counted in words, not tokens.
    batch, seq = 256, 258
    ids = make_rows(batch, seq)
    ids[:, 2:-1:2] = 250  # every body word is two pieces: [w, ##x]
    cfg = config("span", 40)
    tables = make_tables(cfg)
    tf_ids = tf.constant(ids)
    candidate = ~tf.gather(tables["special"], tf_ids)
    starts = np.asarray(_unit_starts(tf_ids, candidate, cfg, tables,
                                     tf.constant([3, 4], tf.int64)))
    lengths = []
    for row in range(batch):
        begin = np.flatnonzero(starts[row])
        for a, b in zip(begin[:-1], begin[1:], strict=True):
            assert ids[row, a] < 200  # a span starts at a word start
            lengths.append((b - a) // 2)  # in words
    lengths = np.array(lengths)
    assert lengths.min() == 1 and lengths.max() == 10
    p = 0.2
    expected = np.array([p * (1 - p) ** (k - 1) for k in range(1, 10)] + [(1 - p) ** 9])
    observed = np.bincount(lengths, minlength=11)[1:] / len(lengths)
    np.testing.assert_allclose(observed, expected, atol=0.02)
    assert abs(lengths.mean() - expected @ np.arange(1, 11)) < 0.15  # 3.8 words in SpanBERT


@pytest.mark.parametrize("mode", ["span", "whole_word"])
def test_masking_fills_the_budget_at_seq_128(mode):
    # SpanBERT masks 15% of the tokens. At seq 128 with 20 predictions (budget 19), spans of
    # up to ten words must not stop the draw at the first one that overflows: a unit that does
    # not fit is skipped and the next one tried, as Google's loop does.
    batch, seq = 512, 128
    ids = make_rows(batch, seq, continuation=0.3, seed=1)
    cfg = config(mode, 20)
    _, _, _, weights = (np.asarray(x) for x in mask_batch(
        tf.constant(ids), tf.constant([7, 8], tf.int64), cfg, make_tables(cfg)))
    n = (ids >= 5).sum(1)
    budget = np.minimum(np.round(n * 0.15), 20)
    assert (weights.sum(1) <= budget).all()
    assert weights.sum() / budget.sum() > 0.95


def test_span_masking_keeps_words_whole_rate_and_per_span_action():
    batch, seq, preds = 512, 128, 40
    ids = make_rows(batch, seq, continuation=0.3)
    cfg = config("span", preds)
    tables = make_tables(cfg)
    seed = tf.constant([5, 6], tf.int64)
    masked, positions, lm_ids, weights = (np.asarray(x) for x in mask_batch(
        tf.constant(ids), seed, cfg, tables))
    selected = np.zeros(ids.shape, bool)
    for r in range(batch):
        k = int(weights[r].sum())
        selected[r, positions[r, :k]] = True
        np.testing.assert_array_equal(lm_ids[r, :k], ids[r, positions[r, :k]])
    # No masked run starts inside a word or stops before a word ends.
    for r in range(batch):
        for a, b in runs(selected[r]):
            assert ids[r, a] < 200
            assert b == seq or ids[r, b] < 200
    rate = selected.sum() / (ids >= 5).sum()
    assert 0.14 < rate <= 0.15
    # One 80/10/10 draw per span: a span is all [MASK] or has none.
    seeds = tf.random.experimental.stateless_split(seed, 4, alg="philox")
    candidate = ~tf.gather(tables["special"], tf.constant(ids))
    starts = np.asarray(_unit_starts(tf.constant(ids), candidate, cfg, tables, seeds[0]))
    unit = np.cumsum(starts, axis=1)
    is_mask = masked == MASK
    mixed = 0
    for r in range(batch):
        for u in np.unique(unit[r][selected[r]]):
            members = is_mask[r][(unit[r] == u) & selected[r]]
            mixed += members.any() and not members.all()
    assert mixed == 0
    assert 0.75 < is_mask[selected].mean() < 0.85


def test_knowledge_units_are_masked_whole():
    batch, seq, preds = 256, 64, 12
    ids = make_rows(batch, seq, continuation=0.2)
    unit_ids = np.zeros_like(ids)
    rng = np.random.default_rng(1)
    for r in range(batch):  # three 3-token units per row at word starts
        for n, start in enumerate(rng.choice(np.arange(2, seq - 5, 6), 3, replace=False)):
            ids[r, start] = rng.integers(5, 200)
            ids[r, start + 3] = rng.integers(5, 200)  # the next token starts a new word
            unit_ids[r, start:start + 3] = n + 1
    cfg = config("knowledge", preds)
    _, positions, _, weights = (np.asarray(x) for x in mask_batch(
        tf.constant(ids), tf.constant([7, 8], tf.int64), cfg, make_tables(cfg),
        tf.constant(unit_ids)))
    selected = np.zeros(ids.shape, bool)
    for r in range(batch):
        selected[r, positions[r, :int(weights[r].sum())]] = True
    covered = 0
    for r in range(batch):
        for u in range(1, 4):
            inside = selected[r][unit_ids[r] == u]
            assert inside.all() or not inside.any()  # whole units only
            covered += inside.all()
    assert covered > 0.1 * batch * 3  # units are masked, not just the words around them
    # the same 15% budget as token masking, filled
    budget = np.minimum(np.round((ids >= 5).sum(1) * 0.15), preds)
    assert (weights.sum(1) <= budget).all() and weights.sum() / budget.sum() > 0.95
    # basic_fraction=1: token masking, units cut.
    cfg = config("knowledge", preds, basic_fraction=1.0)
    _, positions, _, weights = (np.asarray(x) for x in mask_batch(
        tf.constant(ids), tf.constant([7, 8], tf.int64), cfg, make_tables(cfg),
        tf.constant(unit_ids)))
    partial = 0
    for r in range(batch):
        sel = np.zeros(seq, bool)
        sel[positions[r, :int(weights[r].sum())]] = True
        for u in range(1, 4):
            inside = sel[unit_ids[r] == u]
            partial += inside.any() and not inside.all()
    assert partial > 0


def test_packed_rows_choose_basic_masking_per_example():
    """Two examples a row: each example is masked by its units or token by token on its own
    draw, so one row may hold both."""
    batch, half = 128, 32
    ids = np.concatenate([make_rows(batch, half, 0.3, seed=2), make_rows(batch, half, 0.3, seed=3)],
                         axis=1)
    unit_ids = np.zeros_like(ids)
    unit_ids[:, 2:5], unit_ids[:, half + 2:half + 5] = 1, 2
    example_ids = np.repeat([[1, 2]], half, axis=1).repeat(batch, axis=0).astype(np.int32)
    tf_ids, seed = tf.constant(ids), tf.constant([3, 9], tf.int64)

    def starts(basic_fraction):
        cfg = config("knowledge", 8, basic_fraction=basic_fraction)
        tables = make_tables(cfg)
        candidate = ~tf.gather(tables["special"], tf_ids)
        return np.asarray(_unit_starts(tf_ids, candidate, cfg, tables, seed,
                                       tf.constant(unit_ids), tf.constant(example_ids)))

    units, tokens, mixed = starts(0.0), starts(1.0), starts(0.5)
    assert (units != tokens).any(axis=1).all()
    basic = np.zeros((batch, 2), bool)
    for r in range(batch):
        for e in range(2):
            part = example_ids[r] == e + 1
            basic[r, e] = np.array_equal(mixed[r, part], tokens[r, part])
            assert basic[r, e] or np.array_equal(mixed[r, part], units[r, part])
    assert 0.35 < basic.mean() < 0.65
    assert (basic[:, 0] != basic[:, 1]).sum() > batch // 4


def test_knowledge_masking_needs_unit_ids():
    cfg = config("knowledge", 4)
    with pytest.raises(BertJaxError, match="unit_ids"):
        mask_batch(tf.constant(make_rows(2, 16)), tf.constant([1, 2], tf.int64), cfg,
                   make_tables(cfg))


def test_unknown_mode():
    with pytest.raises(BertJaxError, match="data.masking='spans'"):
        mode_flags("spans")


def test_matcher_annotates_units_on_word_boundaries():
    word_start = np.ones(20, bool)
    word_start[15:] = False
    matcher = knowledge_masking.UnitMatcher([[5, 6], [5, 6, 7], [8, 15], [9]], word_start)
    assert matcher.num_units == 3  # single tokens are not units
    ids = [2, 5, 6, 7, 3, 5, 6, 16, 8, 15, 5, 6]
    # 5 6 7 longest; "5 6 ##16" would cut a word; 8 ##15 is a unit; trailing 5 6 matches.
    assert matcher.annotate(ids) == [0, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 3]


def test_discover_units_and_lexicon(tmp_path):
    sentences = ["Yesterday we saw Elizabeth Bennet in town.",
                 "The red fox ran. A red fox sat. Every red fox hid."]
    found = knowledge_masking.discover_units(sentences, min_count=3)
    assert "Elizabeth Bennet" in found and "red fox" in found
    assert not any(u.startswith("Yesterday") for u in found)
    lexicon = tmp_path / "lex.txt"
    lexicon.write_text("# entities\nNew York\n\n---\n")
    with pytest.raises(BertJaxError, match=r"lex.txt:4"):
        knowledge_masking.load_lexicon(str(lexicon))
    lexicon.write_text("# entities\nNew York  # city\nkick the bucket\n")
    assert knowledge_masking.load_lexicon(str(lexicon)) == ["New York", "kick the bucket"]


def test_knowledge_units_from_creation_to_batches(tmp_path):
    """create-pretraining-data --knowledge-lexicon stores unit_ids; the pipeline masks them
    whole; data without them is refused by name."""
    from bert_jax.cli import main
    from bert_jax.data.mask_settings import MaskSettings
    from bert_jax.data.pipeline import PretrainingIterator
    from data.helpers import wordpiece, write_vocab

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = np.random.default_rng(0)
    docs = []
    for _ in range(30):
        words = rng.choice(["the", "cat", "sat", "on", "a", "log", "dog", "ran"], size=12)
        docs.append(" ".join(words) + " . the big tree was very happy .")
    (corpus / "a.txt").write_text("\n\n".join(docs) + "\n")
    (tmp_path / "lex.txt").write_text("big tree\n# comment\nvery happy\n")
    vocab = write_vocab(str(tmp_path))
    out = tmp_path / "data"
    assert main(["create-pretraining-data", "--input", str(corpus), "--tokenizer", vocab,
                 "--output-dir", str(out), "--max-seq-length", "40", "--mode", "nsp",
                 "--num-workers", "1", "--num-shards", "1", "--no-progress",
                 "--knowledge-lexicon", str(tmp_path / "lex.txt")]) == 0
    tokenizer = wordpiece(str(tmp_path))
    big_tree = tokenizer.encode_batch(["big tree"])[0]
    batches = PretrainingIterator.from_data_dir(
        str(out), per_host_batch_size=16, max_predictions_per_seq=8, tokenizer=tokenizer,
        mask=MaskSettings(masking="knowledge", basic_fraction=0.0))
    whole = cut = 0
    for _, batch in zip(range(6), batches, strict=False):
        ids = batch["masked_lm_ids"]
        positions = batch["masked_lm_positions"]
        for r in range(len(ids)):
            k = int(batch["masked_lm_weights"][r].sum())
            chosen = set(positions[r, :k].tolist())
            labels = dict(zip(positions[r, :k].tolist(), ids[r, :k].tolist(), strict=True))
            for p in chosen:  # a masked "big" comes with its "tree", and the reverse
                if labels[p] == big_tree[0] and p + 1 not in chosen:
                    cut += 1
                if labels[p] == big_tree[0] and labels.get(p + 1) == big_tree[1]:
                    whole += 1
    assert whole > 0 and cut == 0
    plain = tmp_path / "plain"
    assert main(["create-pretraining-data", "--input", str(corpus), "--tokenizer", vocab,
                 "--output-dir", str(plain), "--max-seq-length", "40", "--num-workers", "1",
                 "--num-shards", "1", "--no-progress"]) == 0
    with pytest.raises(BertJaxError, match="knowledge-units"):
        PretrainingIterator.from_data_dir(str(plain), per_host_batch_size=4,
                                          max_predictions_per_seq=8, tokenizer=tokenizer,
                                          mask=MaskSettings(masking="knowledge"))
