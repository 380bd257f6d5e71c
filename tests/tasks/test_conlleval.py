import numpy as np
import pytest

from bert_jax.tasks.conlleval import conlleval, get_chunks


def perl_port(gold_sents, pred_sents):
    """A line-by-line port of conlleval.pl's streaming loop (the reference semantics)."""
    def split(t):
        return tuple(t.split("-", 1)) if "-" in t else (t, "")

    def end_of(pt, t, ptype, typ):
        e = (pt, t) in {("B", "B"), ("B", "O"), ("I", "B"), ("I", "O"), ("E", "E"), ("E", "I"),
                        ("E", "O")}
        return e or (pt not in ("O", ".") and ptype != typ) or pt in ("[", "]")

    def start_of(pt, t, ptype, typ):
        s = (pt, t) in {("B", "B"), ("I", "B"), ("O", "B"), ("O", "I"), ("E", "E"), ("E", "I"),
                        ("O", "E")}
        return s or (t not in ("O", ".") and ptype != typ) or t in ("[", "]")

    lines = []
    for g, p in zip(gold_sents, pred_sents, strict=True):
        lines += list(zip(g, p, strict=True)) + [("O", "O")]  # blank line -> boundary with O tags
    correct = found_c = found_g = 0
    in_correct = False
    lc, lct, lg, lgt = "O", "", "O", ""
    for gold, guess in lines:
        c, ct = split(gold)
        g, gt = split(guess)
        if in_correct:
            ec, eg = end_of(lc, c, lct, ct), end_of(lg, g, lgt, gt)
            if ec and eg and lgt == lct:
                in_correct = False
                correct += 1
            elif ec != eg or gt != ct:
                in_correct = False
        sc, sg = start_of(lc, c, lct, ct), start_of(lg, g, lgt, gt)
        if sc and sg and gt == ct:
            in_correct = True
        found_c += sc
        found_g += sg
        lc, lct, lg, lgt = c, ct, g, gt
    if in_correct:
        correct += 1
    return correct, found_g, found_c


def test_chunk_boundaries_iob1_iob2():
    assert get_chunks(["I-PER", "I-PER", "B-PER", "O", "I-LOC"]) == [
        ("PER", 0, 1), ("PER", 2, 2), ("LOC", 4, 4)]
    assert get_chunks(["O", "I-ORG", "O"]) == [("ORG", 1, 1)]  # I- after O starts a chunk
    assert get_chunks(["B-PER", "I-LOC", "I-LOC"]) == [("PER", 0, 0), ("LOC", 1, 2)]
    assert get_chunks(["B-MISC", "B-MISC", "I-MISC"]) == [("MISC", 0, 0), ("MISC", 1, 2)]
    assert get_chunks(["I-PER"]) == [("PER", 0, 0)]
    assert get_chunks(["O", "O"]) == []


def test_iob1_gold_and_iob2_prediction_agree():
    gold = [["I-PER", "I-PER", "B-PER", "O", "I-LOC"]]
    pred = [["B-PER", "I-PER", "B-PER", "O", "B-LOC"]]
    out = conlleval(gold, pred)
    assert out["f1"] == 100.0 and out["precision"] == 100.0
    assert out["accuracy"] == pytest.approx(100 * 3 / 5)  # tags differ, entities don't


def test_known_values_per_type():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "I-ORG"]]
    out = conlleval(gold, pred)
    assert out["precision"] == pytest.approx(100 / 3) and out["recall"] == pytest.approx(100 / 3)
    assert out["f1"] == pytest.approx(100 / 3)
    assert out["accuracy"] == pytest.approx(100 * 4 / 6)
    assert out["PER_f1"] == 100.0 and out["LOC_recall"] == 0.0 and out["LOC_precision"] == 0.0
    assert out["ORG_precision"] == 0.0
    partial = conlleval([["B-PER", "I-PER", "I-PER"]], [["O", "I-PER", "I-PER"]])
    assert partial["f1"] == 0.0  # a chunk must match both boundaries


def test_matches_streaming_conlleval_on_random_tags():
    rng = np.random.default_rng(0)
    tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "I-ORG"]
    for _ in range(200):
        n = int(rng.integers(1, 4))
        lengths = rng.integers(1, 8, n)
        gold = [[tags[i] for i in rng.integers(0, len(tags), k)] for k in lengths]
        pred = [[tags[i] for i in rng.integers(0, len(tags), k)] for k in lengths]
        correct, guessed, found = perl_port(gold, pred)
        out = conlleval(gold, pred)
        p = 100 * correct / guessed if guessed else 0.0
        r = 100 * correct / found if found else 0.0
        assert out["precision"] == pytest.approx(p) and out["recall"] == pytest.approx(r)
