"""Mesh arithmetic and ``shard_map`` shared by the kernels and ``parallel`` (no logical axes,
no state): the bottom of the road, importing nothing of bert_jax."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax


def mesh_axes_size(mesh, axes: str | Sequence[str] | None) -> int:
    """How many ways one PartitionSpec entry (an axis name, a tuple of them, None) splits."""
    names = (axes,) if isinstance(axes, str) else (axes or ())
    return math.prod(mesh.shape[a] for a in names)


def shard_map_unchecked(fn: Callable[..., Any], mesh, in_specs, out_specs):
    """``shard_map`` without replication checks (for Pallas calls, which the checks cannot
    see through), on jax versions with ``jax.shard_map`` (``check_vma``) and older ones
    (``jax.experimental.shard_map``, ``check_rep``)."""
    shard_map = getattr(jax, "shard_map", None)
    kwargs = {"check_vma": False}
    if shard_map is None:  # older jax
        from jax.experimental.shard_map import shard_map
        kwargs = {"check_rep": False}
    return shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, **kwargs)
