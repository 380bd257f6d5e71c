"""The CUDA lowering of a step that runs Pallas kernels, on a machine without a GPU."""

from __future__ import annotations

import jax
import pytest


def cuda_lowering_text(fn, *args) -> str:
    """StableHLO text of ``jax.jit(fn)`` traced with ``args`` (ShapeDtypeStructs) and lowered
    for CUDA: the Pallas calls appear as ``xla.gpu.triton`` custom calls. Skips the test where
    this jaxlib has no Triton bindings."""
    try:
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    except (ImportError, NotImplementedError) as e:
        pytest.skip(f"no Triton lowering here: {e}")
