"""Where a row-tiled kernel runs: once on whole arrays, or once per batch shard of a mesh.

The kernels do not look for a mesh: the caller (``bert_jax/modeling/placement.py``) tells
them with a :class:`RowShards`. Arrays are [batch, ..., width]; a kernel sees them flattened
to rows (:func:`flat`), per shard when the batch axis is split over the mesh.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from bert_jax.sharding import mesh_axes_size, shard_map_unchecked


@dataclasses.dataclass(frozen=True)
class RowShards:
    """The mesh and the mesh axes that split the batch (first) axis, or no mesh: one call on
    the whole arrays. Hashable (it travels in custom_vjp settings)."""
    mesh: Any = None  # jax.sharding.Mesh
    batch_axes: str | tuple[str, ...] | None = None

    @property
    def count(self) -> int:
        """How many shards the batch axis is split into (1 without a mesh)."""
        return 1 if self.mesh is None else max(1, mesh_axes_size(self.mesh, self.batch_axes))


WHOLE = RowShards()


def flat(x):
    """``x`` [..., width] as [rows, width]."""
    return x.reshape(-1, x.shape[-1])


def rows_per_shard(x, shards: RowShards = WHOLE) -> int:
    """The rows (all axes but the last) of ``x`` one kernel call sees: per batch shard when
    ``shards`` splits the batch evenly, else all of them."""
    rows = math.prod(x.shape[:-1])
    if x.shape[0] % shards.count == 0:
        rows //= shards.count
    return rows


def per_shard(fn, sharded: tuple, replicated: tuple, out_ndims: tuple[int, ...],
              shards: RowShards = WHOLE, out_axes: tuple[int, ...] | None = None):
    """Runs ``fn(*sharded, *replicated)`` per batch shard of ``shards``: ``sharded`` arrays
    split on their first axis over the batch axes, ``replicated`` whole; every output (of rank
    ``out_ndims``) is split the same way on its axis in ``out_axes`` (default: the first;
    per-block partial sums are concatenated over the shards, a [width, rows] transposed
    output is split on its second axis). Without a mesh, or where the batch does not split
    evenly (a ragged eval batch: XLA gathers), one call on the whole arrays."""
    if shards.mesh is None or sharded[0].shape[0] % shards.count:
        return fn(*sharded, *replicated)
    from jax.sharding import PartitionSpec as P

    def split(ndim, axis=0):
        return P(*[shards.batch_axes if a == axis else None for a in range(ndim)])

    in_specs = tuple(split(x.ndim) for x in sharded) + tuple(P() for _ in replicated)
    out_specs = tuple(split(n, a) for n, a in zip(
        out_ndims, out_axes or (0,) * len(out_ndims), strict=True))
    return shard_map_unchecked(fn, shards.mesh, in_specs, out_specs)(*sharded, *replicated)
