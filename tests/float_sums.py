"""Tolerance for float32 results that sum the same terms in different orders."""

from __future__ import annotations

import numpy as np

EPS32 = float(np.finfo(np.float32).eps)


def assert_same_sums(got, want, summands: int, name: str = "",
                     scale: float | None = None) -> None:
    """Asserts ``got`` and ``want`` (float32 arrays from the same terms, summed in different
    orders) agree to the rounding of those sums. A float32 sum of ``n`` terms is off by at most
    about ``n * eps * sum|terms|`` (each of its n - 1 additions rounds a partial sum no larger
    than ``sum|terms|`` by eps / 2), so two orders differ by at most twice that. The terms are
    not at hand: their scale is taken as the array's largest magnitude, so ``atol = 2 * n * eps
    * max|want|`` (an element that cancels to near zero compares at the array's scale, not its
    own), next to ``rtol = 2 * n * eps`` for the rest. A whole array that cancels to zero
    (the key bias's gradient: softmax ignores a per-key constant) has no scale of its own:
    pass ``scale``, e.g. the largest magnitude over every gradient of the same model."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    bound = 2 * summands * EPS32
    if scale is None:
        scale = float(np.max(np.abs(want))) if want.size else 0.0
    np.testing.assert_allclose(got, want, rtol=bound, atol=bound * scale, err_msg=name)
