"""The official SQuAD scorers (evaluate-v1.1.py and evaluate-v2.0.py), as functions.

Scores are percentages, as the official scripts print them. Answers are compared after the
official normalisation: lower case, punctuation removed, the articles a/an/the removed,
whitespace collapsed. Each prediction takes its best score over the gold answers.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Mapping, Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """Lower text and remove punctuation, articles and extra whitespace (official order)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match_score(prediction: str, ground_truth: str) -> int:
    return int(normalize_answer(prediction) == normalize_answer(ground_truth))


def f1_score_v1(prediction: str, ground_truth: str) -> float:
    """Token F1 of evaluate-v1.1.py (an empty prediction or gold scores 0)."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(ground_truth).split()
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score_v2(prediction: str, ground_truth: str) -> float:
    """Token F1 of evaluate-v2.0.py: if either side is empty, 1 when both are, else 0."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(ground_truth).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def evaluate_v1(gold_answers: Mapping[str, Sequence[str]],
                predictions: Mapping[str, str]) -> dict[str, float]:
    """evaluate-v1.1.py: question id -> gold texts; unanswered questions score 0."""
    em = f1 = 0.0
    for qid, golds in gold_answers.items():
        if qid not in predictions:
            continue
        pred = predictions[qid]
        em += max(exact_match_score(pred, g) for g in golds)
        f1 += max(f1_score_v1(pred, g) for g in golds)
    total = len(gold_answers)
    return {"exact_match": 100.0 * em / total, "f1": 100.0 * f1 / total}


def evaluate_v2(gold_answers: Mapping[str, Sequence[str]], predictions: Mapping[str, str],
                na_probs: Mapping[str, float] | None = None,
                na_prob_thresh: float = 1.0) -> dict[str, float]:
    """evaluate-v2.0.py: question id -> gold texts ([] when unanswerable).

    With ``na_probs`` (the null odds) this also searches the best threshold (``best_exact``,
    ``best_exact_thresh``, ``best_f1``, ``best_f1_thresh``), as ``--na-prob-file`` does.
    """
    has_ans = {qid: bool(golds) for qid, golds in gold_answers.items()}
    exact_raw, f1_raw = {}, {}
    for qid, golds in gold_answers.items():
        golds = [g for g in golds if normalize_answer(g)] or [""]
        if qid not in predictions:
            continue
        pred = predictions[qid]
        exact_raw[qid] = max(exact_match_score(pred, g) for g in golds)
        f1_raw[qid] = max(f1_score_v2(pred, g) for g in golds)
    given_na = na_probs is not None
    na = dict(na_probs) if given_na else {k: 0.0 for k in predictions}
    exact = _apply_no_ans_threshold(exact_raw, na, has_ans, na_prob_thresh)
    f1 = _apply_no_ans_threshold(f1_raw, na, has_ans, na_prob_thresh)
    out = _eval_dict(exact, f1)
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        qids = [k for k, v in has_ans.items() if v == wanted]
        if qids:
            for key, value in _eval_dict(exact, f1, qids).items():
                out[f"{prefix}_{key}"] = value
    if given_na:
        for name, raw in (("exact", exact_raw), ("f1", f1_raw)):
            best, thresh = _find_best_thresh(predictions, raw, na, has_ans)
            out[f"best_{name}"] = best
            out[f"best_{name}_thresh"] = thresh
    return out


def _apply_no_ans_threshold(scores, na_probs, has_ans, thresh):
    new = {}
    for qid, s in scores.items():
        new[qid] = float(not has_ans[qid]) if na_probs[qid] > thresh else s
    return new


def _eval_dict(exact, f1, qids=None):
    if qids is None:
        total = len(exact)
        return {"exact": 100.0 * sum(exact.values()) / total,
                "f1": 100.0 * sum(f1.values()) / total, "total": total}
    total = len(qids)
    return {"exact": 100.0 * sum(exact[k] for k in qids) / total,
            "f1": 100.0 * sum(f1[k] for k in qids) / total, "total": total}


def _find_best_thresh(preds, scores, na_probs, has_ans):
    num_no_ans = sum(1 for k in has_ans if not has_ans[k])
    cur = best = num_no_ans
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        if has_ans[qid]:
            diff = scores[qid]
        else:
            diff = -1 if preds[qid] else 0
        cur += diff
        if cur > best:
            best = cur
            best_thresh = na_probs[qid]
    return 100.0 * best / len(scores), best_thresh
