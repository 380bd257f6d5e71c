"""The platform a traced computation will run on, for choosing kernels at trace time.

``jax.default_backend()`` names where this process runs; a step compiled ahead of time for
TPU devices on a CPU machine (``bert_jax/tpu/compile.py``) runs elsewhere. The train step
traces inside ``parallel.traced_in_mesh``, which records its mesh's platform here.
"""

from __future__ import annotations

import contextlib
import contextvars

import jax

_TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "bert_jax_target_platform", default=None)


def target_platform() -> str:
    """``tpu`` / ``gpu`` / ``cpu``: the platform recorded by :func:`targeting`, else the
    default backend."""
    return _TARGET.get() or jax.default_backend()


@contextlib.contextmanager
def targeting(platform: str | None):
    """Within this block, :func:`target_platform` is ``platform`` (None: unchanged)."""
    if platform is None:
        yield
        return
    token = _TARGET.set("gpu" if platform == "cuda" else platform)
    try:
        yield
    finally:
        _TARGET.reset(token)
