"""Scaled float8 casts for FP8 GEMMs: row-major and transposed copies and the maximum, one
Pallas kernel (Triton on GPUs).

An FP8 matmul (``modeling/fp8.py``) quantizes its input in the forward pass and its output
gradient in the backward pass: ``q = x / scale`` saturated to the float8 format, plus
``max |x|`` for the scaling history. The weight gradient contracts the tokens, and FP8 GEMMs
(cuBLASLt on Hopper) take operands only with the contracted axis innermost, so each of those
tensors is also needed transposed. XLA does it in separate passes (a scaled cast, a maximum, a
transpose of the float8 copy); :func:`cast_transposed` reads ``x`` [rows, width] once and
writes ``q`` [rows, width], ``q`` transposed [width, rows] and one absolute maximum per
program.

Each program handles one [block_rows, block_cols] tile (grid: row blocks x column tiles) and
writes its transposed copy as a [block_cols, block_rows] block, so the tile is tall enough
(64 rows: 64 bytes of float8 per transposed row) for those writes to fill whole memory
sectors. Under a device mesh the kernel runs per batch shard (``shard_map``): the rows
split, the transposed copy split on its second axis. On the CPU it runs in Pallas interpret
mode (tests).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bert_jax.kernels.row_tiles import (
    TRANSPOSED_BLOCKS,
    TileSettings,
    compiler_params,
    fit_tile,
    fp8_outputs,
    interpret_default,
    inverse_columns,
    layout,
    quantized,
    tile_amax,
)
from bert_jax.kernels.sharding import WHOLE, RowShards, per_shard, rows_per_shard

# (block_rows, block_cols, num_warps): the tile of every kernel with transposed float8 writes
BLOCKS = TRANSPOSED_BLOCKS


def tile_settings(x, *, interpret: bool | None = None, shards: RowShards = WHOLE
                  ) -> TileSettings:
    """The kernel's settings for ``x`` [rows, width]: :data:`BLOCKS` fitted to powers of two
    dividing the rows per shard and the width. ``shards``: run per batch shard of a mesh
    (the width whole); default one call on the whole array."""
    if x.ndim != 2 or x.shape[-1] % 16:
        raise ValueError(f"cast_transposed needs x of shape [rows, width] with a width "
                         f"divisible by 16; got {x.shape}")
    rows = rows_per_shard(x, shards)
    block_rows, block_cols, num_warps, _, _ = fit_tile((*BLOCKS, 1), rows, x.shape[1],
                                                       (None,) * 5)
    return TileSettings(block_rows, block_cols, num_warps, interpret_default(interpret),
                        shards=shards)


def _kernel(x_ref, inv_ref, q_ref, amax_ref, qt_ref):
    v = x_ref[...].astype(jnp.float32)
    q = quantized(v, inv_ref[...], q_ref.dtype)
    q_ref[...] = q
    qt_ref[...] = q.T
    amax_ref[...] = tile_amax(v)


def _call(x, inv, dtype, s: TileSettings):
    from jax.experimental import pallas as pl

    n, width = x.shape
    at = layout(n, width, s.block_rows, s)
    specs, shapes = fp8_outputs(at, n, width, s.block_rows, s, dtype, transposed=True)
    return pl.pallas_call(
        _kernel,
        grid=at.grid,
        in_specs=[at.tile, at.column],
        out_specs=[at.tile, *specs],
        out_shape=[jax.ShapeDtypeStruct((n, width), dtype), *shapes],
        interpret=s.interpret, name="bert_fp8_cast_transposed", **compiler_params(s),
    )(x, inv)


def cast_transposed(x, scale, dtype, s: TileSettings | None = None,
                    shards: RowShards = WHOLE):
    """``x / scale`` in float8 ``dtype`` (saturated) for ``x`` [rows, width]: (that array; the
    same values as [width, rows]; ``max |x|`` as a float32 scalar). ``s``:
    :func:`tile_settings` (default: for ``x`` and ``shards``)."""
    s = tile_settings(x, shards=shards) if s is None else s

    def local(x, inv):
        return _call(x, inv, dtype, s)

    q, amax, qt = per_shard(local, (x,), (inverse_columns(scale, x.shape[1]),), (2, 2, 2),
                            s.shards, (0, 0, 1))
    return q, qt, jnp.max(amax)


def reference(x, scale, dtype):
    """The same with jax.numpy, in float32 (tests)."""
    limit = float(jnp.finfo(dtype).max)
    q = jnp.clip(x.astype(jnp.float32) / scale, -limit, limit).astype(dtype)
    return q, q.T, jnp.max(jnp.abs(x.astype(jnp.float32)))
