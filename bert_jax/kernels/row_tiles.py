"""Launch helpers of the row-tiled elementwise kernels (``fused_gelu``, ``fused_xent``).

Both kernel pairs walk a [rows, width] array in [block_rows, block_cols] tiles over a grid of
(row blocks, column tiles); their backward kernels also write one float32 partial column sum
per program (a bias gradient, summed by XLA), each program looping over ``sum_blocks`` row
blocks with the sums carried in registers. Here: the static settings, fitting the tiles to a
shape, the launch grid and its index maps, the block specs, the carried-sums loop, Triton's
compiler settings, and the float8 outputs of the FP8 kernels (``fused_gelu``'s, ``fp8_cast``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax

from bert_jax.kernels.flash import fit_block
from bert_jax.kernels.sharding import WHOLE, RowShards

# The tile (block_rows, block_cols, num_warps) of the float8 kernels that also write their
# tile transposed (``fused_gelu``'s with ``transposed=True``, ``fp8_cast``): a tile is then
# written as block_cols rows of block_rows float8 values, so it must be tall enough for those
# rows to fill whole 32-byte memory sectors. In a sweep of the GELU kernels
# (docs/performance.md, "Kernels against XLA") 64 x 64 with 4 warps was fastest overall and
# beat XLA transposing the kernels' outputs; 32-row tiles, 4 warps on 64 x 128 tiles and more
# row blocks per backward program were much slower.
TRANSPOSED_BLOCKS = (64, 64, 4)


@dataclasses.dataclass(frozen=True)
class TileSettings:
    """Static kernel settings (hashable: a custom_vjp non-differentiable argument)."""
    block_rows: int  # a power of two dividing the rows per shard
    block_cols: int  # a power of two dividing the width
    num_warps: int
    interpret: bool
    # Backward: row blocks one program loops over, carrying the column sums; one
    # [block_cols] float32 partial sum per program (XLA sums them afterwards).
    sum_blocks: int = 1
    # Backward: Triton's software pipelining of that loop (1: none).
    num_stages: int = 1
    # Launch order: column tiles fastest (consecutive programs stream consecutive memory).
    cols_fastest: bool = True
    # Where the kernels run: whole arrays, or per batch shard of a mesh.
    shards: RowShards = WHOLE


def fit_tile(tuned, rows: int, width: int, given) -> tuple[int, int, int, int, int]:
    """(block_rows, block_cols, num_warps, sum_blocks, num_stages) of a row-tiled kernel: each
    of ``given``'s values where not None, else ``tuned``'s (a ``blocks_for`` result of the
    kernel's module), with the blocks fitted to powers of two dividing ``rows`` (and the row
    blocks) and ``width``."""
    block_rows, block_cols, num_warps, sum_blocks, num_stages = (
        int(g) if g is not None else t for g, t in zip(given, (*tuned, 1), strict=True))
    block_rows = fit_block(block_rows, rows)
    return (block_rows, fit_block(block_cols, width), num_warps,
            fit_block(sum_blocks, rows // block_rows), num_stages)


def interpret_default(interpret: bool | None) -> bool:
    """Pallas interpret mode unless asked otherwise: everywhere but on a GPU."""
    return jax.default_backend() != "gpu" if interpret is None else bool(interpret)


def compiler_params(s: TileSettings, num_stages: int = 1):
    """Triton's settings for a kernel of settings ``s`` (``num_warps``; none in interpret
    mode)."""
    if s.interpret:
        return {}
    from jax.experimental.pallas import triton as plgpu

    return {"compiler_params": plgpu.CompilerParams(num_warps=s.num_warps,
                                                    num_stages=num_stages)}


def launch_grid(rows: int, cols: int, s: TileSettings):
    """The launch grid over (row blocks, column tiles) and index maps in (row block, column
    tile) order. With ``s.cols_fastest`` the column tiles come first, so that programs
    launched one after another read consecutive memory (a row's tiles, then the next row's)."""
    if s.cols_fastest:
        return (cols, rows), lambda f: (lambda j, i: f(i, j))
    return (rows, cols), lambda f: f


@dataclasses.dataclass(frozen=True)
class Layout:
    """The grid and block specs of one launch over [n, width] in tiles of ``rows`` x
    ``s.block_cols``: ``tile`` the [rows, block_cols] tile, ``column`` a [block_cols] slice
    of a per-column vector (the bias), ``row`` a [rows] slice of a per-row vector, ``sums``
    one program's [1, block_cols] row of the [row groups, width] partial column sums
    (``sums_shape``)."""
    grid: tuple[int, int]
    order: object
    tile: object
    column: object
    row: object
    sums: object
    sums_shape: jax.ShapeDtypeStruct


def layout(n: int, width: int, rows: int, s: TileSettings) -> Layout:
    """The launch layout over [n, width] with ``rows`` rows per program (``s.block_rows``, or
    ``s.block_rows * s.sum_blocks`` for the backward's loop)."""
    from jax.experimental import pallas as pl

    grid, order = launch_grid(n // rows, width // s.block_cols, s)
    return Layout(
        grid=grid, order=order,
        tile=pl.BlockSpec((rows, s.block_cols), order(lambda i, j: (i, j))),
        column=pl.BlockSpec((s.block_cols,), order(lambda i, j: (j,))),
        row=pl.BlockSpec((rows,), order(lambda i, j: (i,))),
        sums=pl.BlockSpec((1, s.block_cols), order(lambda i, j: (i, j))),
        sums_shape=jax.ShapeDtypeStruct((n // rows, width), jnp.float32))


def column_sums_over_row_blocks(block, sums_ref, s: TileSettings, amax_ref=None):
    """The backward kernels' loop: ``block(rows)`` writes one row block's gradient tile (rows: a
    slice of the program's ``s.sum_blocks`` blocks of ``s.block_rows`` rows) and returns that
    float32 tile; the carried [block_rows, block_cols] sums are reduced over their rows once at
    the end (one cross-warp reduction per program, not per block) into ``sums_ref[0]``. With
    ``amax_ref`` the loop also carries the tiles' absolute maxima, written as the program's one
    [1, 1] maximum."""
    from jax.experimental import pallas as pl

    def step(j, carry):
        acc, peak = carry
        rows = slice(None) if s.sum_blocks == 1 else pl.ds(j * s.block_rows, s.block_rows)
        tile = block(rows)
        return acc + tile, (None if peak is None else jnp.maximum(peak, jnp.abs(tile)))

    zeros = jnp.zeros((s.block_rows, s.block_cols), jnp.float32)
    carry = (zeros, None if amax_ref is None else zeros)
    if s.sum_blocks == 1:
        acc, peak = step(0, carry)
    else:
        acc, peak = lax.fori_loop(0, s.sum_blocks, step, carry)
    sums_ref[...] = jnp.sum(acc, axis=0)[None, :]
    if amax_ref is not None:
        amax_ref[...] = tile_amax(peak)


def tile_amax(v):
    """[1, 1] absolute maximum of a float32 tile."""
    return jnp.max(jnp.max(jnp.abs(v), axis=1, keepdims=True), axis=0, keepdims=True)


# ---- float8 outputs (``fused_gelu``'s FP8 kernels, ``fp8_cast``) ------------------------------
def inverse_columns(scale, width: int):
    """``1 / scale`` (float32) broadcast over ``width`` columns: a per-column kernel input."""
    return jnp.full((width,), 1.0, jnp.float32) / jnp.asarray(scale, jnp.float32)


def quantized(v, inv, dtype):
    """A float32 tile times its columns' ``inv`` (:func:`inverse_columns`), saturated to the
    float8 ``dtype``'s range, in ``dtype``."""
    limit = float(jnp.finfo(dtype).max)
    return jnp.clip(v * inv[None, :], -limit, limit).astype(dtype)


def fp8_outputs(at: Layout, n: int, width: int, rows: int, s: TileSettings, dtype,
                transposed: bool):
    """Block specs and shapes of a float8 kernel's extra outputs over [n, width] in programs of
    ``rows`` rows: the [row blocks, column tiles] maxima, and with ``transposed`` the [width,
    n] float8 copy, one [block_cols, rows] block per program."""
    from jax.experimental import pallas as pl

    specs = [pl.BlockSpec((1, 1), at.order(lambda i, j: (i, j)))]
    shapes = [jax.ShapeDtypeStruct((n // rows, width // s.block_cols), jnp.float32)]
    if transposed:
        specs.append(pl.BlockSpec((s.block_cols, rows), at.order(lambda i, j: (j, i))))
        shapes.append(jax.ShapeDtypeStruct((width, n), dtype))
    return specs, shapes
