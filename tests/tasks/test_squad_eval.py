import pytest

from bert_jax.tasks.squad_eval import (
    evaluate_v1,
    evaluate_v2,
    f1_score_v1,
    f1_score_v2,
    normalize_answer,
)


@pytest.mark.parametrize("text,expected", [
    ("The Cat!", "cat"),
    ("an apple a day", "apple day"),
    ("theater and anaconda", "theater and anaconda"),  # articles only as whole words
    ("A-B", "ab"),  # punctuation removed before articles: "a" inside "ab" stays
    ("  multiple \t spaces\n", "multiple spaces"),
    ("1,000", "1000"),
    ("U.S.", "us"),
    ("the", ""),
    ("An  Ode", "ode"),
    ("20–18", "20–18"),  # an en dash is not ASCII punctuation
    ("(the) 'a' \"an\"", ""),
    ("Ça va", "ça va"),
])
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_f1_empty_cases_differ_between_versions():
    assert f1_score_v1("", "") == 0.0
    assert f1_score_v2("", "") == 1.0
    assert f1_score_v2("the", "") == 1.0  # both normalise to nothing
    assert f1_score_v2("cat", "") == 0.0
    assert f1_score_v1("a cat sat", "the cat") == pytest.approx(2 / 3)
    assert f1_score_v1("cat cat", "cat") == pytest.approx(2 * 0.5 * 1 / 1.5)


def test_evaluate_v1_known_values():
    golds = {"q1": ["Denver Broncos", "Broncos"], "q2": ["the cat"], "q3": ["1,000"],
             "q4": ["x"]}
    preds = {"q1": "broncos", "q2": "a cat sat", "q3": "1000"}  # q4 unanswered: scores 0
    out = evaluate_v1(golds, preds)
    assert out["exact_match"] == pytest.approx(100 * 2 / 4)
    assert out["f1"] == pytest.approx(100 * (1 + 2 / 3 + 1) / 4)


def test_evaluate_v2_breakdown_and_best_threshold():
    golds = {"a": ["Paris"], "b": [], "c": ["x y"], "d": []}
    preds = {"a": "paris", "b": "", "c": "x", "d": "somewhere"}
    null_odds = {"a": -1.0, "b": 2.0, "c": 0.5, "d": 0.8}
    out = evaluate_v2(golds, preds, null_odds)
    # na_prob_thresh=1.0 (the official default): b (2.0 > 1) is scored as predicted no-answer.
    assert out["total"] == 4
    assert out["exact"] == pytest.approx(100 * (1 + 1 + 0 + 0) / 4)
    assert out["f1"] == pytest.approx(100 * (1 + 1 + 2 / 3 + 0) / 4)
    assert out["HasAns_total"] == 2 and out["NoAns_total"] == 2
    assert out["HasAns_exact"] == pytest.approx(50.0)
    assert out["HasAns_f1"] == pytest.approx(100 * (1 + 2 / 3) / 2)
    assert out["NoAns_exact"] == pytest.approx(50.0)
    # Threshold sweep in null-odds order a(-1), c(.5), d(.8), b(2); start at #no-answer = 2.
    # exact: a +1 -> 3 (best, thresh -1); c +0; d -1; b 0.  f1: a -> 3, c -> 3.67 (thresh .5).
    assert out["best_exact"] == pytest.approx(100 * 3 / 4)
    assert out["best_exact_thresh"] == -1.0
    assert out["best_f1"] == pytest.approx(100 * (3 + 2 / 3) / 4)
    assert out["best_f1_thresh"] == 0.5


def test_evaluate_v2_gold_that_normalises_to_nothing_is_still_answerable():
    out = evaluate_v2({"q": ["The"]}, {"q": ""})
    assert out["HasAns_total"] == 1 and "NoAns_total" not in out
    assert out["exact"] == 100.0  # the gold list becomes [''] for matching, as officially
