"""Bias + exact (erf) GELU, the MLP's epilogue, as a Pallas kernel pair (Triton on GPUs).

The MLP's first projection ends in ``gelu_erf(y + b)`` (``ops.add_bias_activate``), ``y`` the
matmul output [tokens, intermediate] and ``b`` its bias. XLA runs it as two memory-bound
fusions: the forward reads ``y`` and writes the activation, the backward reads the output
gradient ``g`` and ``y`` and writes ``dx`` plus the first stage of the bias gradient's column
sum. Here one forward kernel and one backward kernel do the same passes:

* forward: ``out = x * Phi(x)`` in float32, written in ``y.dtype``, where ``x = y + b`` is
  rounded to the inputs' dtype as the unfused ``y + b`` is (the same function of the same
  ``x``);
* backward: recomputes ``x`` from ``y`` and ``b`` (the forward saves only its inputs: no
  [tokens, intermediate] array besides ``y``, which the matmul's backward keeps anyway) and
  writes ``dx = g * (Phi(x) + x * phi(x))`` in ``y.dtype``, plus one float32 partial column
  sum of ``dx`` per program ([programs, intermediate], summed by XLA into the bias gradient,
  as ``fused_norm.py`` does for its parameter gradients). A program loops over ``sum_blocks``
  row blocks (``lax.fori_loop``), carrying the column sums in registers as a tile added
  elementwise and reduced over its rows once at the end, so the partial sums stay a small
  fraction of the traffic.

Each program handles one [block_rows, block_cols] tile (grid: row blocks x column tiles; the
backward's tile is ``sum_blocks`` row blocks tall). Neither kernel needs a mask: the rows come
in whole blocks (``block_rows``, a power of two, divides the rows per shard) and the
intermediate axis in whole power-of-two column tiles (Triton's tensors are powers of two:
3072 = 6 x 512, 4096 = 8 x 512), so every load and store is in bounds.

Pallas' Triton lowering has no ``erf``, so the kernels evaluate their own (:func:`erf`): for
``z = |x| / sqrt 2``, ``erf(z) = 1 - exp(-z^2) * (1 + u * S(u))`` with ``u = p z / (1 + p z)``
and ``S`` a degree-4 polynomial (an erfc form like Abramowitz & Stegun 7.1.26, refitted in this
variable: it computes ``erf`` as ``(1 - e) - e u S(u)``, which keeps float32 rounding small
near 0). The backward's Gaussian density ``phi(x) = exp(-x^2/2) / sqrt(2 pi)`` reuses the same
``exp(-z^2)``. Accuracy in float32 (measured on the CPU against float64 ``math.erf``): erf
within 1.2e-7 absolute on [-8, 8] (the polynomial's own error is 2.4e-8, the rest is float32
rounding), the normal CDF ``Phi`` within 8.4e-8 on [-12, 12] (XLA's ``0.5 + 0.5 * lax.erf`` in
float32: 1.7e-7), the GELU within 1.2e-7 x max(|x|, 1) (XLA's ``gelu_erf``: 2.0e-7). On GPUs
the exp2 and the division are the hardware's approximate ones (a few ulp).

The forward kernel is faster than XLA's fusion and the backward about as fast: both sit near
the arithmetic limit of the erf evaluation as much as the memory limit, so they stay short of
the bandwidth's bound; in a training step the pair still pays (docs/performance.md, "Kernels
against XLA"). ``kernels.fused_gelu`` (default ``auto``) picks them on GPUs where they
apply.

Under a device mesh the kernels run per batch shard (``shard_map``), the intermediate axis
unsplit; the partial sums of all shards are summed by XLA. On the CPU the kernels run in
Pallas interpret mode (tests).

For FP8 pretraining (``BertConfig.fp8`` and ``kernels.fp8_gelu_quantize``) a second pair,
:func:`forward_fp8` and :func:`backward_fp8`, writes the activation (e4m3) and the
pre-activation's gradient (e5m2) scaled and saturated in float8, with one absolute maximum per
program: the operands of the MLP's next FP8 matmuls (``modeling/fp8.py: fp8_gelu_mlp``). With
``transposed`` they also write the same float8 values as [width, rows], the layout of the
weight-gradient GEMMs, in taller tiles of their own (``row_tiles.TRANSPOSED_BLOCKS``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from bert_jax.kernels.row_tiles import (
    TRANSPOSED_BLOCKS,
    TileSettings,
    column_sums_over_row_blocks,
    compiler_params,
    fit_tile,
    fp8_outputs,
    interpret_default,
    inverse_columns,
    layout,
    quantized,
    tile_amax,
)
from bert_jax.kernels.sharding import WHOLE, RowShards, flat, per_shard, rows_per_shard

_SQRT_HALF = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327

# ---------------------------------------------------------------------------------------------
# erf from exp, one division and a polynomial (the kernels' own; also used by the tests).
#
# erfc(z) = exp(-z^2) * erfcx(z), and erfcx (1 at z = 0, ~1/(z sqrt pi) for large z) is smooth
# in u = p z / (1 + p z) in [0, 1): erfcx ~ 1 + u * S(u). S's coefficients minimize the largest
# absolute error of erfc over z >= 0 (iteratively reweighted least squares, Lawson's method,
# with p chosen by a scan): 2.4e-8. Writing erf(z) = (1 - e) - e * (u * S(u)), e = exp(-z^2),
# rather than 1 - erfc, keeps the float32 result's error near z = 0, where erf is small, at
# ~1e-7 (the erfc-first form's rounding reached 3-4e-7 there). The error is absolute, not
# relative, in the tail too (erfc's relative error reaches 1e-3 at z = 4), and the kernels form
# Phi and the GELU from 0.5 +- erf/2, which in float32 keeps ~3e-8 of absolute precision where
# Phi is tiny (x < -4), as XLA's float32 ``0.5 + 0.5 * erf`` does.
#
# The kernels are near the GPU's arithmetic limit as much as its memory limit (XLA's own erf
# GELU fusions are: more memory bandwidth does not speed them up), so the evaluation is trimmed to
# ~20 operations: the 1/sqrt(2) and log2(e) scales are folded into the constants and the
# exponential is one exp2 (``exp`` lowers to libdevice's longer ``__nv_expf``); the polynomial
# gives erf/2 directly (S/2's coefficients); and the GELU is 0.5 x + |x| erf(|x|/sqrt 2) / 2,
# with no select on the sign.
_ERF_P = 0.4425
_ERF_S = (-2.550007334, 2.556952847, -1.015667746, -0.2508743905, 0.27593787)
_HALF_S = tuple(0.5 * c for c in _ERF_S)
_ERF_Z_MAX = 10.0  # erf(10) = 1 in float32; the clamp keeps an infinite input from u = inf/inf
_LOG2E = 1.4426950408889634


def _half_erf_and_gauss(a, scale: float):
    """``(erf(z) / 2, exp(-z^2))`` in float32 for ``z = a * scale``, ``a >= 0`` (any jax
    array: kernel or not)."""
    a = jnp.minimum(a, _ERF_Z_MAX / scale)
    pz = (_ERF_P * scale) * a
    u = pz / (1.0 + pz)
    e = jnp.exp2((a * a) * (-_LOG2E * scale * scale))
    s = _HALF_S[-1]
    for c in _HALF_S[-2::-1]:  # Horner
        s = s * u + c
    return (0.5 - 0.5 * e) - e * (u * s), e


def erf(x):
    """float32 ``erf`` as the kernels compute it (max abs error 1.2e-7 in float32)."""
    x = jnp.asarray(x, jnp.float32)
    h, _ = _half_erf_and_gauss(jnp.abs(x), 1.0)
    return jnp.where(x < 0, -2.0 * h, 2.0 * h)


def _gelu(x):
    """float32 ``x * Phi(x) = x/2 + |x| erf(|x|/sqrt 2) / 2``."""
    a = jnp.abs(x)
    h, _ = _half_erf_and_gauss(a, _SQRT_HALF)
    return 0.5 * x + a * h


def _cdf_and_gauss(x):
    """float32 ``(Phi(x), exp(-x^2/2))``: the normal CDF, and the Gaussian without its
    ``1/sqrt(2 pi)`` (``phi(x) = _INV_SQRT_2PI * exp(-x^2/2)``), sharing one exponential."""
    h, e = _half_erf_and_gauss(jnp.abs(x), _SQRT_HALF)
    return 0.5 + jnp.where(x < 0, -h, h), e


# ---------------------------------------------------------------------------------------------
# Settings (``row_tiles.TileSettings``).

# Default tiles (block_rows, block_cols, num_warps), and the backward's row blocks per program
# aimed at about BACKWARD_PROGRAMS row groups: enough programs to fill the GPU several times
# over (x width / block_cols column tiles), few enough that the [row groups, width] float32
# partial sums stay a few percent of the traffic (3 MB at [32768, 3072]: 8 row blocks per
# program). In the sweeps (docs/performance.md, "Kernels against XLA") tiles of 2-4 rows x
# 512-1024 columns with 2-4 warps were within noise of each other; 1-row and 2048-column tiles
# were slower, and one row block per backward program (tens of MB of partial sums) much
# slower. Callers override them for every shape with ``blocks`` and ``sum_blocks``
# (``kernels.gelu_blocks``, ``gelu_sum_blocks``).
BLOCKS = (4, 512, 2)
BACKWARD_PROGRAMS = 1024
BACKWARD_STAGES = 2  # software pipelining of the backward's loop over row blocks
COLS_FASTEST = True  # launch order (TileSettings.cols_fastest)


def blocks_for(rows: int, blocks: tuple | None = None, sum_blocks: int | None = None,
               defaults: tuple = BLOCKS) -> tuple[int, int, int, int]:
    """The kernel settings (block_rows, block_cols, num_warps, sum_blocks) for ``rows`` tokens
    per shard (before fitting them to the shape): ``blocks`` (block_rows, block_cols,
    num_warps; None entries: ``defaults``') and ``sum_blocks`` where given, else the
    defaults; the default ``sum_blocks`` follows the row blocks."""
    block_rows, block_cols, num_warps = (
        defaults if blocks is None
        else tuple(d if v is None else v for v, d in zip(blocks, defaults, strict=True)))
    if sum_blocks is None:
        sum_blocks = max(1, rows // (block_rows * BACKWARD_PROGRAMS))
    return block_rows, block_cols, num_warps, sum_blocks


def supported(width: int) -> bool:
    """Widths the kernels handle: a multiple of 16 (the column tile is then >= 16)."""
    return width % 16 == 0


# ---------------------------------------------------------------------------------------------
# Kernels. One program per tile of [block_rows (x sum_blocks), block_cols] elements, over
# (row blocks, column tiles) (launched column tiles first: ``row_tiles.launch_grid``).
# Refs: y/out/g/dx [R, C], b [C]; partial sums [1, C].

def _pre_activation(y, b):
    """float32 ``x = y + b`` (``b`` [C] broadcast over the rows), rounded to the dtype of
    ``y + b`` (bfloat16 for bfloat16 inputs) as the unfused ``gelu_erf(y + b)`` rounds it (XLA
    does, on GPUs too: its bf16 outputs equal ``gelu_erf`` of the rounded sum bit for bit), so
    that both compute the same function of the same ``x``."""
    x = y.astype(jnp.float32) + b.astype(jnp.float32)[None, :]
    sum_dtype = jnp.promote_types(y.dtype, b.dtype)
    if jnp.finfo(sum_dtype).bits < 32:
        x = x.astype(sum_dtype).astype(jnp.float32)
    return x


def _forward_kernel(y_ref, b_ref, o_ref):
    o_ref[...] = _gelu(_pre_activation(y_ref[...], b_ref[...])).astype(o_ref.dtype)


def _gelu_grad(g, y, b):
    """float32 ``g * gelu'(y + b)`` of one tile."""
    x = _pre_activation(y, b)
    cdf, gauss = _cdf_and_gauss(x)
    return g.astype(jnp.float32) * (cdf + x * (_INV_SQRT_2PI * gauss))


def _backward_kernel(g_ref, y_ref, b_ref, dx_ref, sums_ref, *, s: TileSettings):
    """One program: ``s.sum_blocks`` blocks of ``s.block_rows`` rows of one column chunk.
    Writes ``dx`` and ``sums_ref[0]``, the float32 column sums of ``dx`` over all its rows."""
    b = b_ref[...]

    def block(rs):
        dx = _gelu_grad(g_ref[rs, :], y_ref[rs, :], b)
        dx_ref[rs, :] = dx.astype(dx_ref.dtype)
        return dx

    column_sums_over_row_blocks(block, sums_ref, s)


def _forward_call(y, b, s: TileSettings):
    from jax.experimental import pallas as pl

    n, width = y.shape
    at = layout(n, width, s.block_rows, s)
    return pl.pallas_call(
        _forward_kernel,
        grid=at.grid,
        in_specs=[at.tile, at.column],
        out_specs=at.tile,
        out_shape=jax.ShapeDtypeStruct((n, width), y.dtype),
        interpret=s.interpret, name="bert_bias_gelu_forward", **compiler_params(s),
    )(y, b)


def _backward_call(g, y, b, s: TileSettings):
    from jax.experimental import pallas as pl

    n, width = y.shape
    at = layout(n, width, s.block_rows * s.sum_blocks, s)
    return pl.pallas_call(
        functools.partial(_backward_kernel, s=s),
        grid=at.grid,
        in_specs=[at.tile, at.tile, at.column],
        out_specs=[at.tile, at.sums],
        out_shape=[jax.ShapeDtypeStruct((n, width), y.dtype), at.sums_shape],
        interpret=s.interpret, name="bert_bias_gelu_backward",
        **compiler_params(s, s.num_stages),
    )(g, y, b)


# ---------------------------------------------------------------------------------------------
# Per shard (``s.shards``): [batch, ..., width] arrays flattened to rows.

def _forward(y, b, s: TileSettings):
    def local(y, b):
        return (_forward_call(flat(y), b, s).reshape(y.shape),)

    return per_shard(local, (y,), (b,), (y.ndim,), s.shards)[0]


def _backward(g, y, b, s: TileSettings):
    def local(g, y, b):
        dx, sums = _backward_call(flat(g), flat(y), b, s)
        return dx.reshape(y.shape), sums

    return per_shard(local, (g, y), (b,), (y.ndim, 2), s.shards)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _bias_gelu(y, b, s: TileSettings):
    return _forward(y, b, s)


def _bias_gelu_fwd(y, b, s):
    return _forward(y, b, s), (y, b)  # only the inputs: the backward recomputes x


def _bias_gelu_bwd(s, saved, g):
    y, b = saved
    dx, sums = _backward(g, y, b, s)
    return dx, jnp.sum(sums, axis=0).astype(b.dtype)


_bias_gelu.defvjp(_bias_gelu_fwd, _bias_gelu_bwd)


def bias_gelu(y, b, *, block_rows: int | None = None, block_cols: int | None = None,
              num_warps: int | None = None, sum_blocks: int | None = None,
              num_stages: int | None = None, interpret: bool | None = None,
              shards: RowShards = WHOLE):
    """``gelu_erf(y + b)`` (``reference.gelu_erf``, exact erf GELU) computed in float32, returned in
    ``y.dtype``, one kernel each way. ``y`` is [..., width] (e.g. [batch, seq, width]; under a
    mesh the first axis is the batch), ``b`` [width]. The bias gradient comes back in
    ``b.dtype``. The tile (``block_rows`` x ``block_cols``, ``num_warps``) and ``sum_blocks``
    (row blocks per backward program) default to :func:`blocks_for` (rows per shard) and are
    fitted to the shape (powers of two dividing the rows per shard and the width);
    ``num_stages`` > 1 (default :data:`BACKWARD_STAGES`) software-pipelines the backward's
    loop over row blocks. ``interpret`` (Pallas interpret mode) defaults to "not on a GPU".
    ``shards``: run per batch shard of a mesh (the width whole); default one call on the
    whole arrays."""
    s = tile_settings(y, b, block_rows=block_rows, block_cols=block_cols, num_warps=num_warps,
                      sum_blocks=sum_blocks, num_stages=num_stages, interpret=interpret,
                      shards=shards)
    return _bias_gelu(y, b, s)


def tile_settings(y, b, *, block_rows: int | None = None, block_cols: int | None = None,
                  num_warps: int | None = None, sum_blocks: int | None = None,
                  num_stages: int | None = None, interpret: bool | None = None,
                  transposed: bool = False, shards: RowShards = WHOLE) -> TileSettings:
    """The kernels' settings for ``y`` [..., width] and bias ``b`` [width] (see
    :func:`bias_gelu` for the arguments), after checking the shapes; with ``transposed`` the
    defaults of the float8 kernels that also write transposed copies
    (``row_tiles.TRANSPOSED_BLOCKS``)."""
    if y.ndim < 2:
        raise ValueError(f"bias_gelu needs y of shape [..., width] with a leading (row) axis; "
                         f"got y {y.shape}")
    width = y.shape[-1]
    if b.shape != (width,):
        raise ValueError(f"bias_gelu needs b of shape [width] = ({width},) for y {y.shape}; "
                         f"got b {b.shape}")
    if not supported(width):
        raise ValueError(f"bias_gelu needs a width divisible by 16; got y {y.shape}")
    interpret = interpret_default(interpret)
    rows = rows_per_shard(y, shards)
    block_rows, block_cols, num_warps, sum_blocks, num_stages = fit_tile(
        blocks_for(rows, (block_rows, block_cols, num_warps), sum_blocks,
                   TRANSPOSED_BLOCKS if transposed else BLOCKS), rows, width,
        (None, None, None, None, BACKWARD_STAGES if num_stages is None else num_stages))
    return TileSettings(block_rows, block_cols, num_warps, interpret, sum_blocks,
                        num_stages, COLS_FASTEST, shards)


# ---------------------------------------------------------------------------------------------
# FP8 outputs (``modeling/fp8.py``'s MLP): the forward writes the activation, and the backward
# the pre-activation's gradient, straight in float8 (``x / scale`` saturated to the format's
# range) instead of in ``y.dtype``, with one absolute maximum per program of the unquantized
# float32 values (the tensor's maximum for the scaling history: the largest of them). Each
# replaces a kernel's bf16 write plus XLA's separate quantizing pass (a read of the bf16
# array, a maximum and a float8 write). The backward's bias-gradient sums stay float32 sums
# of the unquantized gradient. ``inv_ref``: ``1 / scale`` broadcast over the columns.

def _forward_fp8_kernel(y_ref, b_ref, inv_ref, q_ref, amax_ref, qt_ref=None):
    """One tile of the activation in float8, its maximum, and with ``qt_ref`` the same float8
    tile transposed (a [block_cols, block_rows] block of the [width, rows] copy)."""
    out = _gelu(_pre_activation(y_ref[...], b_ref[...]))
    q = quantized(out, inv_ref[...], q_ref.dtype)
    q_ref[...] = q
    if qt_ref is not None:
        qt_ref[...] = q.T
    amax_ref[...] = tile_amax(out)


def _backward_fp8_kernel(g_ref, y_ref, b_ref, inv_ref, dq_ref, sums_ref, amax_ref,
                         dqt_ref=None, *, s: TileSettings):
    """:func:`_backward_kernel` writing ``dx`` in float8 (and with ``dqt_ref`` transposed
    too), and its maximum."""
    b, inv = b_ref[...], inv_ref[...]

    def block(rs):
        dx = _gelu_grad(g_ref[rs, :], y_ref[rs, :], b)
        dq = quantized(dx, inv, dq_ref.dtype)
        dq_ref[rs, :] = dq
        if dqt_ref is not None:
            dqt_ref[:, rs] = dq.T
        return dx

    column_sums_over_row_blocks(block, sums_ref, s, amax_ref)


def _forward_fp8_call(y, b, inv, dtype, s: TileSettings, transposed: bool):
    from jax.experimental import pallas as pl

    n, width = y.shape
    at = layout(n, width, s.block_rows, s)
    specs, shapes = fp8_outputs(at, n, width, s.block_rows, s, dtype, transposed)
    return pl.pallas_call(
        _forward_fp8_kernel,
        grid=at.grid,
        in_specs=[at.tile, at.column, at.column],
        out_specs=[at.tile, *specs],
        out_shape=[jax.ShapeDtypeStruct((n, width), dtype), *shapes],
        interpret=s.interpret,
        name="bert_bias_gelu_forward_fp8" + ("_t" if transposed else ""),
        **compiler_params(s),
    )(y, b, inv)


def _backward_fp8_call(g, y, b, inv, dtype, s: TileSettings, transposed: bool):
    from jax.experimental import pallas as pl

    n, width = y.shape
    rows = s.block_rows * s.sum_blocks
    at = layout(n, width, rows, s)
    specs, shapes = fp8_outputs(at, n, width, rows, s, dtype, transposed)
    return pl.pallas_call(
        functools.partial(_backward_fp8_kernel, s=s),
        grid=at.grid,
        in_specs=[at.tile, at.tile, at.column, at.column],
        out_specs=[at.tile, at.sums, *specs],
        out_shape=[jax.ShapeDtypeStruct((n, width), dtype), at.sums_shape, *shapes],
        interpret=s.interpret,
        name="bert_bias_gelu_backward_fp8" + ("_t" if transposed else ""),
        **compiler_params(s, s.num_stages),
    )(g, y, b, inv)


def forward_fp8(y, b, scale, dtype, s: TileSettings, transposed: bool = False):
    """``gelu_erf(y + b) / scale`` in float8 ``dtype`` (saturated), shaped like ``y``, and the
    absolute maximum of ``gelu_erf(y + b)`` (float32 scalar). ``s``: :func:`tile_settings`.
    With ``transposed`` the kernel also writes the float8 values transposed, [width, rows]
    (rows: ``y``'s leading axes flattened), returned between the two."""
    inv = inverse_columns(scale, y.shape[-1])

    def local(y, b, inv):
        q, amax, *qt = _forward_fp8_call(flat(y), b, inv, dtype, s, transposed)
        return q.reshape(y.shape), amax, *qt

    q, amax, *qt = per_shard(local, (y,), (b, inv), (y.ndim, 2) + (2,) * transposed,
                             s.shards, (0, 0) + (1,) * transposed)
    return (q, *qt, jnp.max(amax))


def backward_fp8(g, y, b, scale, dtype, s: TileSettings, transposed: bool = False):
    """The gradient of ``gelu_erf(y + b)`` for output gradient ``g``: (``dx / scale`` in float8
    ``dtype``, saturated, shaped like ``y``; with ``transposed`` the same float8 values as
    [width, rows]; the bias gradient, float32 [width]; the absolute maximum of ``dx``,
    float32)."""
    inv = inverse_columns(scale, y.shape[-1])

    def local(g, y, b, inv):
        dq, sums, amax, *dqt = _backward_fp8_call(flat(g), flat(y), b, inv, dtype, s,
                                                  transposed)
        return dq.reshape(y.shape), sums, amax, *dqt

    dq, sums, amax, *dqt = per_shard(local, (g, y), (b, inv),
                                     (y.ndim, 2, 2) + (2,) * transposed, s.shards,
                                     (0, 0, 0) + (1,) * transposed)
    return (dq, *dqt, jnp.sum(sums, axis=0), jnp.max(amax))


def reference(y, b):
    """The same computation with jax.numpy (``reference.gelu_erf(y + b)``; tests)."""
    from bert_jax.kernels.reference import gelu_erf

    return gelu_erf(y + b)
