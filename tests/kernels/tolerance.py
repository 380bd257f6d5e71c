"""Tolerances for comparing a float32 kernel with its float32 reference on the backend that
runs the test.

On the CPU the Pallas kernels run in interpret mode with float32 arithmetic throughout, so they
match the reference to float32 rounding. Compiled for a GPU, Triton's float32 dot products use
TF32 (a 10-bit mantissa): outputs and gradients differ from the reference by up to ~1e-3
(5e-3 measured on an H100), which such a comparison must allow.
"""

from __future__ import annotations

import jax

TF32 = 2e-2


def close(atol: float = 0.0, rtol: float = 1e-7) -> dict[str, float]:
    """``assert_allclose`` keyword arguments: these on the CPU, TF32-sized on a GPU."""
    if jax.default_backend() == "gpu":
        return {"atol": max(atol, TF32), "rtol": max(rtol, TF32)}
    return {"atol": atol, "rtol": rtol}
