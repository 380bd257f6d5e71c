"""GLUE metrics in numpy, matching scikit-learn and SciPy (which the GLUE scorer uses).

Values are fractions in [0, 1] (correlations in [-1, 1]). A correlation of a constant vector is
undefined: NaN, as SciPy returns.
"""

from __future__ import annotations

import numpy as np


def accuracy(preds, golds) -> float:
    preds, golds = np.asarray(preds), np.asarray(golds)
    return float(np.mean(preds == golds)) if len(golds) else float("nan")


def binary_f1(preds, golds, positive=1) -> float:
    """F1 of the positive class (sklearn ``f1_score`` with ``pos_label``; 0 when undefined)."""
    preds, golds = np.asarray(preds) == positive, np.asarray(golds) == positive
    tp = int(np.sum(preds & golds))
    fp = int(np.sum(preds & ~golds))
    fn = int(np.sum(~preds & golds))
    denom = 2 * tp + fp + fn
    return 2.0 * tp / denom if denom else 0.0


def matthews_corrcoef(preds, golds) -> float:
    """Matthews correlation (multi-class form of sklearn; 0 when a marginal is constant)."""
    preds, golds = np.asarray(preds), np.asarray(golds)
    classes, inverse = np.unique(np.concatenate([golds, preds]), return_inverse=True)
    g, p = inverse[:len(golds)], inverse[len(golds):]
    k = len(classes)
    confusion = np.zeros((k, k), dtype=np.float64)
    np.add.at(confusion, (g, p), 1.0)
    t_sum, p_sum = confusion.sum(axis=1), confusion.sum(axis=0)
    n_correct, n = np.trace(confusion), confusion.sum()
    cov_yp = n_correct * n - t_sum @ p_sum
    cov_pp = n * n - p_sum @ p_sum
    cov_tt = n * n - t_sum @ t_sum
    if cov_pp * cov_tt == 0:
        return 0.0
    return float(cov_yp / np.sqrt(cov_tt * cov_pp))


def pearson(x, y) -> float:
    """Pearson's r (scipy.stats.pearsonr's statistic)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    xm, ym = x - x.mean(), y - y.mean()
    denom = np.sqrt((xm @ xm) * (ym @ ym))
    if denom == 0:
        return float("nan")
    return float(np.clip((xm @ ym) / denom, -1.0, 1.0))


def rankdata(x) -> np.ndarray:
    """Ranks from 1, ties get their average rank (scipy.stats.rankdata, method='average')."""
    x = np.asarray(x)
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    # Start of each run of equal values, and the average 1-based rank of the run.
    starts = np.concatenate([[True], sorted_x[1:] != sorted_x[:-1]])
    run_id = np.cumsum(starts) - 1
    run_start = np.flatnonzero(starts)
    run_end = np.append(run_start[1:], len(x))  # exclusive
    avg = (run_start + run_end + 1) / 2.0
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = avg[run_id]
    return ranks


def spearman(x, y) -> float:
    """Spearman's rho: Pearson's r of the average ranks (scipy.stats.spearmanr)."""
    return pearson(rankdata(x), rankdata(y))


def correlations(preds, golds) -> dict[str, float]:
    """A regression task's scores (GLUE's STS-B): Pearson's r, Spearman's rho and their mean
    ``corr``."""
    p, s = pearson(preds, golds), spearman(preds, golds)
    return {"pearson": p, "spearman": s, "corr": (p + s) / 2}
