import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as skm

from bert_jax.tasks import metrics as M


def test_known_values():
    assert M.accuracy([1, 0, 1, 1], [1, 1, 1, 0]) == 0.5
    # tp=2, fp=1, fn=1 -> F1 = 4/6
    assert M.binary_f1([1, 1, 1, 0, 0], [1, 1, 0, 1, 0]) == pytest.approx(2 / 3)
    assert M.binary_f1(["1", "0"], ["0", "0"], positive="1") == 0.0  # undefined -> 0 (sklearn)
    # MCC: tp=2, tn=1, fp=1, fn=1 -> (2*1 - 1*1) / sqrt(3*3*2*2) = 1/6
    assert M.matthews_corrcoef([1, 1, 1, 0, 0], [1, 1, 0, 1, 0]) == pytest.approx(1 / 6)
    assert M.matthews_corrcoef([1, 1, 1], [0, 1, 0]) == 0.0  # constant prediction
    assert M.matthews_corrcoef([0, 1, 0, 1], [0, 1, 0, 1]) == pytest.approx(1.0)
    assert M.pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert M.spearman([1, 2, 3, 4], [1, 4, 9, 16]) == pytest.approx(1.0)
    assert np.isnan(M.pearson([1, 1, 1], [1, 2, 3]))
    np.testing.assert_array_equal(M.rankdata([10, 20, 10, 30]), [1.5, 3, 1.5, 4])


@pytest.mark.parametrize("seed", range(5))
def test_against_sklearn_and_scipy(seed):
    rng = np.random.default_rng(seed)
    y, p = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
    assert M.accuracy(p, y) == pytest.approx(skm.accuracy_score(y, p))
    assert M.binary_f1(p, y) == pytest.approx(skm.f1_score(y, p))
    assert M.matthews_corrcoef(p, y) == pytest.approx(skm.matthews_corrcoef(y, p))
    y3, p3 = rng.integers(0, 3, 200), rng.integers(0, 3, 200)
    assert M.matthews_corrcoef(p3, y3) == pytest.approx(skm.matthews_corrcoef(y3, p3))
    # STS-B-like scores with many ties (rounded to 0.2).
    a = np.round(rng.uniform(0, 5, 300) * 5) / 5
    b = np.round((a + rng.normal(0, 1, 300)) * 5) / 5
    assert M.pearson(a, b) == pytest.approx(stats.pearsonr(a, b)[0], abs=1e-12)
    assert M.spearman(a, b) == pytest.approx(stats.spearmanr(a, b)[0], abs=1e-12)
    np.testing.assert_allclose(M.rankdata(b), stats.rankdata(b))
