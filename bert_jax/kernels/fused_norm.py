"""Bias + hidden dropout + residual add + LayerNorm in one Pallas kernel (Triton on GPUs).

Each BERT sublayer ends in ``LayerNorm(residual + dropout(y + b))``, where ``y`` is the output
projection's matmul and ``b`` its bias. XLA compiles this, with its backward pass, into four
to six memory-bound kernels per sublayer that each read a [tokens, hidden] array again: the
statistics, the normalization, the parameter-gradient column sums, the input gradient, the
dropout's gradient and the bias gradient (24 sublayers in BERT-Base; ``bench/profile_step.py``
shows their share of a step). Here one forward kernel reads ``residual`` and ``y`` once and
writes the output, and one backward kernel reads the output gradient, ``residual`` and ``y``
once and writes both input gradients plus partial sums of the three parameter gradients, one
[3 x hidden] row per program (summed by XLA afterwards in one reduction). With
``split_output`` the output is returned twice, one handle per consumer, and the backward
kernel adds the two consumers' gradients as it reads them (no separate XLA sum).

The dropout mask is the ``rowcol`` counter hash of ``dropout.py`` (the row codes of the
[batch, seq] positions and the column codes of the hidden units, computed by XLA and passed
in), so the kernel drops exactly what ``hash_dropout`` drops for the same salt, and the
backward kernel recomputes it instead of reading a stored mask. The forward pass saves
``residual`` and ``y`` (the pre-LayerNorm sum is recomputed) and the per-token mean and 1/std.

Rows are processed in blocks of ``block_rows`` tokens; the hidden axis in power-of-two chunks
(Triton's tensors are powers of two: 768 = 3 x 256), all in float32. Under a device mesh the
kernels run per batch shard (``shard_map``), and the parameter gradients are summed over the
shards by XLA. On the CPU the kernels run in Pallas interpret mode (tests).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from bert_jax.kernels.dropout import keep_from_codes, rowcol_codes
from bert_jax.kernels.flash import fit_block
from bert_jax.kernels.sharding import WHOLE, RowShards, flat, per_shard, rows_per_shard


@dataclasses.dataclass(frozen=True)
class NormSettings:
    """Static kernel settings (hashable: a custom_vjp non-differentiable argument)."""
    rate: float
    epsilon: float
    block_rows: int
    chunk: int
    num_warps: int
    interpret: bool
    # Backward: recompute each chunk's x, xhat and gradient terms in the second pass (reloads
    # that hit the cache) instead of holding the whole rows in registers.
    recompute: bool = True
    # Backward: row blocks one program loops over, keeping the parameter-gradient sums in
    # registers; one [3 x hidden] partial sum per program (XLA sums them afterwards).
    sum_blocks: int = 1
    # Upstream gradients the backward kernel adds as it reads them: 2 when the output is
    # returned twice (``split_output``), once per consumer, so that the sum of the two
    # consumers' gradients is not a separate XLA pass over [tokens, hidden].
    cotangents: int = 1
    # Where the kernels run: whole arrays, or per batch shard of a mesh.
    shards: RowShards = WHOLE


# Kernel settings (block_rows, num_warps, recompute, sum_blocks) from ``python -m bench kernels
# --kernel norm`` sweeps (docs/performance.md, "Kernels against XLA"): many rows per shard
# run fastest in small tiles, 2 rows x 1 warp, with 8 row blocks per backward program; few
# rows in 4 rows x 2 warps. Callers override them for every shape (``kernels.norm_blocks``,
# ``norm_sum_blocks``).
LONG_BLOCKS = (2, 1, True, 8)
SHORT_BLOCKS = (4, 2, True, 1)
LONG_ROWS = 16384  # rows per shard from which LONG_BLOCKS apply


def blocks_for(rows: int) -> tuple[int, int, bool, int]:
    """The kernel settings (block_rows, num_warps, recompute, sum_blocks) for ``rows`` tokens
    per shard when the caller gives none."""
    return LONG_BLOCKS if rows >= LONG_ROWS else SHORT_BLOCKS


def supported(hidden: int) -> bool:
    """Hidden sizes the kernels handle: a multiple of 16 (the chunk is then >= 16)."""
    return hidden % 16 == 0


# ---------------------------------------------------------------------------------------------
# Kernels. Refs: rows [R] (row codes), cols/b/gamma/beta [H], arrays [R, H]; partial sums
# [1, 3 x H] (bias | gamma | beta).

def _pre_norm(r_ref, y_ref, rows, cols_ref, b_ref, rs, sl, s: NormSettings):
    """float32 ``residual + dropout(y + b)`` of one chunk (rows ``rs``, columns ``sl``), and its
    keep mask (or None)."""
    h = y_ref[rs, sl].astype(jnp.float32) + b_ref[sl].astype(jnp.float32)[None, :]
    keep = None
    if s.rate > 0.0:
        keep = keep_from_codes(rows[:, None], cols_ref[sl][None, :], s.rate)
        h = jnp.where(keep, h * (1.0 / (1.0 - s.rate)), 0.0)
    return r_ref[rs, sl].astype(jnp.float32) + h, keep


def _forward_kernel(r_ref, y_ref, rows_ref, cols_ref, b_ref, gamma_ref, beta_ref,
                    o_ref, mean_ref, rstd_ref, *, s: NormSettings, hidden: int):
    from jax.experimental import pallas as pl

    rows = rows_ref[...]
    rs = slice(None)
    slices = [pl.ds(c * s.chunk, s.chunk) for c in range(hidden // s.chunk)]
    xs = [_pre_norm(r_ref, y_ref, rows, cols_ref, b_ref, rs, sl, s)[0] for sl in slices]
    mean = sum(jnp.sum(x, axis=1) for x in xs) / hidden
    var = sum(jnp.sum(jnp.square(x - mean[:, None]), axis=1) for x in xs) / hidden
    rstd = lax.rsqrt(var + s.epsilon)
    for sl, x in zip(slices, xs, strict=True):
        gamma = gamma_ref[sl].astype(jnp.float32)[None, :]
        beta = beta_ref[sl].astype(jnp.float32)[None, :]
        o_ref[:, sl] = ((x - mean[:, None]) * rstd[:, None] * gamma + beta).astype(o_ref.dtype)
    mean_ref[...] = mean
    rstd_ref[...] = rstd


def _backward_kernel(*refs, s: NormSettings, hidden: int):
    """One program: ``s.sum_blocks`` blocks of ``s.block_rows`` rows. Refs: ``s.cotangents``
    upstream gradients (summed as they are read), then residual, y, row codes, column codes,
    b, gamma, mean, rstd; outputs dr, dy, sums. Writes both input gradients and one partial
    sum per parameter gradient, ``sums_ref[0]`` = [bias | gamma | beta] gradients of all its
    rows."""
    from jax.experimental import pallas as pl

    g_refs, refs = refs[:s.cotangents], refs[s.cotangents:]
    (r_ref, y_ref, rows_ref, cols_ref, b_ref, gamma_ref, mean_ref, rstd_ref, dr_ref, dy_ref,
     sums_ref) = refs

    slices = [pl.ds(c * s.chunk, s.chunk) for c in range(hidden // s.chunk)]

    def block(j, acc):
        rs = slice(None) if s.sum_blocks == 1 else pl.ds(j * s.block_rows, s.block_rows)
        rows = rows_ref[rs]
        mean, rstd = mean_ref[rs][:, None], rstd_ref[rs][:, None]

        def terms(sl):
            x, keep = _pre_norm(r_ref, y_ref, rows, cols_ref, b_ref, rs, sl, s)
            xhat = (x - mean) * rstd
            g = g_refs[0][rs, sl].astype(jnp.float32)
            for g_ref in g_refs[1:]:
                g = g + g_ref[rs, sl].astype(jnp.float32)
            return g, xhat, g * gamma_ref[sl].astype(jnp.float32)[None, :], keep

        db, dgamma, dbeta = (list(a) for a in acc)
        held, sum_gx, sum_gx_xhat = [], 0.0, 0.0
        for c, sl in enumerate(slices):
            g, xhat, gx, keep = terms(sl)
            sum_gx = sum_gx + jnp.sum(gx, axis=1)
            sum_gx_xhat = sum_gx_xhat + jnp.sum(gx * xhat, axis=1)
            dgamma[c] = dgamma[c] + jnp.sum(g * xhat, axis=0)
            dbeta[c] = dbeta[c] + jnp.sum(g, axis=0)
            if not s.recompute:
                held.append((xhat, gx, keep))
        mean_gx = (sum_gx / hidden)[:, None]
        mean_gx_xhat = (sum_gx_xhat / hidden)[:, None]
        for c, sl in enumerate(slices):
            xhat, gx, keep = held[c] if held else terms(sl)[1:]
            dx = rstd * (gx - mean_gx - xhat * mean_gx_xhat)
            dr_ref[rs, sl] = dx.astype(dr_ref.dtype)
            dh = dx if keep is None else jnp.where(keep, dx * (1.0 / (1.0 - s.rate)), 0.0)
            dy_ref[rs, sl] = dh.astype(dy_ref.dtype)
            db[c] = db[c] + jnp.sum(dh, axis=0)
        return tuple(db), tuple(dgamma), tuple(dbeta)

    zeros = tuple(jnp.zeros((s.chunk,), jnp.float32) for _ in slices)
    acc = (zeros, zeros, zeros)
    if s.sum_blocks == 1:
        acc = block(0, acc)
    else:
        acc = lax.fori_loop(0, s.sum_blocks, block, acc)
    for k, parts in enumerate(acc):
        for c, part in enumerate(parts):
            sums_ref[0, pl.ds(k * hidden + c * s.chunk, s.chunk)] = part


def _compiler_params(s: NormSettings):
    if s.interpret:
        return {}
    from jax.experimental.pallas import triton as plgpu

    return {"compiler_params": plgpu.CompilerParams(num_warps=s.num_warps, num_stages=1)}


def _forward_call(r, y, rows, cols, b, gamma, beta, s: NormSettings, out_dtype):
    from jax.experimental import pallas as pl

    n, hidden = r.shape
    block = s.block_rows
    tile = pl.BlockSpec((block, hidden), lambda i: (i, 0))
    vec = pl.BlockSpec((hidden,), lambda i: (0,))
    per_row = pl.BlockSpec((block,), lambda i: (i,))
    return pl.pallas_call(
        functools.partial(_forward_kernel, s=s, hidden=hidden),
        grid=(n // block,),
        in_specs=[tile, tile, per_row, vec, vec, vec, vec],
        out_specs=[tile, per_row, per_row],
        out_shape=[jax.ShapeDtypeStruct((n, hidden), out_dtype),
                   jax.ShapeDtypeStruct((n,), jnp.float32),
                   jax.ShapeDtypeStruct((n,), jnp.float32)],
        interpret=s.interpret, name="bert_norm_forward", **_compiler_params(s),
    )(r, y, rows, cols, b, gamma, beta)


def _backward_call(gs, r, y, rows, cols, b, gamma, mean, rstd, s: NormSettings):
    """``gs``: the ``s.cotangents`` upstream gradients, [rows, hidden] each."""
    from jax.experimental import pallas as pl

    n, hidden = r.shape
    block = s.block_rows * s.sum_blocks
    tile = pl.BlockSpec((block, hidden), lambda i: (i, 0))
    vec = pl.BlockSpec((hidden,), lambda i: (0,))
    per_row = pl.BlockSpec((block,), lambda i: (i,))
    partial = pl.BlockSpec((1, 3 * hidden), lambda i: (i, 0))
    return pl.pallas_call(
        functools.partial(_backward_kernel, s=s, hidden=hidden),
        grid=(n // block,),
        in_specs=[tile] * len(gs) + [tile, tile, per_row, vec, vec, vec, per_row, per_row],
        out_specs=[tile, tile, partial],
        out_shape=[jax.ShapeDtypeStruct((n, hidden), r.dtype),
                   jax.ShapeDtypeStruct((n, hidden), y.dtype),
                   jax.ShapeDtypeStruct((n // block, 3 * hidden), jnp.float32)],
        interpret=s.interpret, name="bert_norm_backward", **_compiler_params(s),
    )(*gs, r, y, rows, cols, b, gamma, mean, rstd)


def _fused_forward(residual, y, rows, cols, b, gamma, beta, s: NormSettings, out_dtype):
    def local(r, y, rows, cols, b, gamma, beta):
        out, mean, rstd = _forward_call(flat(r), flat(y), rows.reshape(-1), cols, b, gamma,
                                        beta, s, out_dtype)
        return out.reshape(r.shape), mean.reshape(r.shape[:2]), rstd.reshape(r.shape[:2])

    return per_shard(local, (residual, y, rows), (cols, b, gamma, beta), (3, 2, 2), s.shards)


def _fused_backward(gs, residual, y, rows, cols, b, gamma, mean, rstd, s: NormSettings):
    def local(*args):
        *gs, r, y, rows, mean, rstd, cols, b, gamma = args
        dr, dy, sums = _backward_call(tuple(flat(g) for g in gs), flat(r), flat(y),
                                      rows.reshape(-1), cols, b, gamma, mean.reshape(-1),
                                      rstd.reshape(-1), s)
        return dr.reshape(r.shape), dy.reshape(y.shape), sums

    return per_shard(local, (*gs, residual, y, rows, mean, rstd), (cols, b, gamma), (3, 3, 2),
                     s.shards)


def _outputs(out, s: NormSettings):
    """The primal output: once, or (with ``s.cotangents == 2``) the same array twice."""
    return (out, out) if s.cotangents == 2 else out


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8))
def _fused(residual, y, rows, cols, b, gamma, beta, s: NormSettings, out_dtype):
    return _outputs(_fused_forward(residual, y, rows, cols, b, gamma, beta, s, out_dtype)[0], s)


def _fused_fwd(residual, y, rows, cols, b, gamma, beta, s, out_dtype):
    out, mean, rstd = _fused_forward(residual, y, rows, cols, b, gamma, beta, s, out_dtype)
    return _outputs(out, s), (residual, y, rows, cols, b, gamma, beta, mean, rstd)


def _fused_bwd(s, out_dtype, saved, g):
    del out_dtype
    residual, y, rows, cols, b, gamma, beta, mean, rstd = saved
    gs = tuple(g) if s.cotangents == 2 else (g,)
    dr, dy, sums = _fused_backward(gs, residual, y, rows, cols, b, gamma, mean, rstd, s)
    zero_codes = (np.zeros(rows.shape, jax.dtypes.float0), np.zeros(cols.shape,
                                                                   jax.dtypes.float0))
    db, dgamma, dbeta = jnp.sum(sums, axis=0).reshape(3, -1)  # one reduction for all three
    return (dr, dy, *zero_codes, db.astype(b.dtype), dgamma.astype(gamma.dtype),
            dbeta.astype(beta.dtype))


_fused.defvjp(_fused_fwd, _fused_bwd)


def residual_dropout_layer_norm(residual, y, b, gamma, beta, *, salt=None, rate: float = 0.0,
                                epsilon: float = 1e-12, out_dtype=None,
                                block_rows: int | None = None, num_warps: int | None = None,
                                recompute: bool | None = None, sum_blocks: int | None = None,
                                split_output: bool = False, interpret: bool | None = None,
                                shards: RowShards = WHOLE):
    """``LayerNorm(residual + dropout(y + b)) * gamma + beta`` over the last axis, in one
    kernel each way. ``residual`` and ``y`` are [batch, seq, hidden]; ``b``, ``gamma``,
    ``beta`` [hidden]; ``salt`` an int32 scalar (``dropout.salt_from_rng``) when ``rate > 0``:
    the mask is ``hash_dropout``'s ``rowcol`` mask of a [batch, seq, hidden] array for that
    salt. Returns [batch, seq, hidden] in ``out_dtype`` (default ``residual.dtype``).
    ``block_rows``, ``num_warps``, ``recompute`` and ``sum_blocks`` (row blocks per backward
    program) default to :func:`blocks_for` (rows).

    ``split_output=True`` returns the output twice, ``(out, out)`` (one array, no copy), for a
    caller with two consumers (the next sublayer's matmul and its residual): each handle's
    gradient reaches the backward kernel separately and the kernel adds them as it reads
    them, instead of XLA summing them first in a pass of its own over [tokens, hidden].

    ``shards``: run per batch shard of a mesh (the hidden axis whole); default one call on
    the whole arrays."""
    if residual.ndim != 3 or residual.shape != y.shape:
        raise ValueError(f"residual and y must be the same [batch, seq, hidden] shape; got "
                         f"{residual.shape} and {y.shape}")
    hidden = residual.shape[-1]
    if not supported(hidden):
        raise ValueError(f"the fused LayerNorm needs a hidden size divisible by 16, got {hidden}")
    if rate > 0.0 and salt is None:
        raise ValueError("dropout in the fused LayerNorm needs a salt (salt_from_rng)")
    if interpret is None:
        interpret = jax.default_backend() != "gpu"
    rows = rows_per_shard(residual, shards)
    tuned = blocks_for(rows)
    block_rows = tuned[0] if block_rows is None else block_rows
    num_warps = tuned[1] if num_warps is None else num_warps
    recompute = tuned[2] if recompute is None else recompute
    block_rows = fit_block(block_rows, rows)
    sum_blocks = fit_block(tuned[3] if sum_blocks is None else int(sum_blocks),
                           rows // block_rows)
    chunk = fit_block(256, hidden)  # the hidden axis in power-of-two chunks (768 = 3 x 256)
    s = NormSettings(float(rate), float(epsilon), block_rows, chunk, int(num_warps),
                     bool(interpret), bool(recompute), sum_blocks, 2 if split_output else 1,
                     shards)
    salt = jnp.zeros((), jnp.int32) if salt is None else salt
    rows, cols = rowcol_codes(residual.shape, salt)  # hash_dropout's codes of this shape
    rows = rows[..., 0]
    return _fused(residual, y, rows, cols, b, gamma, beta, s,
                  jnp.dtype(out_dtype or residual.dtype))


def reference(residual, y, b, gamma, beta, *, salt=None, rate: float = 0.0,
              epsilon: float = 1e-12, out_dtype=None):
    """The same computation with jax.numpy in float32 (tests)."""
    from bert_jax.kernels.dropout import dropout_keep_mask

    h = y.astype(jnp.float32) + b.astype(jnp.float32)
    if rate > 0.0:
        keep = dropout_keep_mask(residual.shape, salt, rate, "rowcol")
        h = jnp.where(keep, h / (1.0 - rate), 0.0)
    x = residual.astype(jnp.float32) + h
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    out = (x - mean) * lax.rsqrt(var + epsilon) * gamma.astype(jnp.float32) + beta.astype(
        jnp.float32)
    return out.astype(out_dtype or residual.dtype)
