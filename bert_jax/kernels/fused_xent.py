"""The masked-LM decoder's softmax cross-entropy with its passes over the logits as Pallas
kernels (Triton on GPUs).

The MLM loss reads the float32 logits of every masked position over the whole (padded)
vocabulary: [batch x predictions, 30,592] at BERT's vocabulary, 626 MB at Base/128 with batch
256 (20 predictions per sequence). XLA runs the loss and its gradient as four passes over that
array: the row max and the exponential sum of the forward's logsumexp, the backward's
``softmax - one_hot`` that writes the bfloat16 logit gradient for the two decoder matmuls, and
the bias gradient's column sum over the float32 gradient, where one read of the logits plus
one bfloat16 write of their gradient would do.

Here the decoder matmul and the loss are one custom VJP (:func:`decode_cross_entropy`), so the
logit gradient never exists in float32:

* forward: the matmul (XLA, float32 output, as ``reference.decode``), then one kernel over
  [block_rows, block_cols] tiles of the logits that writes each tile's row max and its sum of
  ``exp(z - max)`` (``z = logits + bias``); XLA combines the per-tile pairs of a row into its
  log-sum-exp (the partials are 1/64 of the logits' bytes at 128-column tiles). The label's
  logit is a gather. ``nll = lse - z[label]``; ``correct = z[label] >= max z`` (ties count as
  correct, as ``steps.loss_sums`` counts them);
* backward: one kernel writes ``dz = g * (exp(z - lse) - one_hot(label))`` in the matmul's
  input dtype (bfloat16 in training) and one float32 partial column sum of ``dz`` per program
  (the bias gradient, summed by XLA; a program loops over ``sum_blocks`` row blocks, carrying
  the sums in registers, as ``fused_gelu.py`` does: ``row_tiles.py``); then XLA's two decoder
  matmuls.

Values equal the XLA path's (``optax.softmax_cross_entropy_with_integer_labels`` over the
masked logits) up to float32 summation order; ``correct`` bit for bit (same float32 sums
``logits + bias``). Padded vocabulary entries are excluded by the caller's bias (``NEG_INF``
there, ``heads.masked_bias``): their ``exp`` underflows to 0 and their gradient is 0.

Both kernels run near the memory bandwidth, and the float32 logit gradient no longer exists,
which lowers the step's peak memory (docs/performance.md, "Kernels against XLA"); the tile
matters little (every tile of the sweep was close to the default).

Under a device mesh the kernels run per batch shard (``shards``, ``shard_map``) with the
vocabulary axis unsplit (the model checks it, ``modeling/placement.py``;
``kernels.fused_mlm_loss='auto'`` falls back to XLA where it is split).
On the CPU they run in Pallas interpret mode (tests).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from bert_jax.kernels.reference import decode, decode_grads, logits_cross_entropy
from bert_jax.kernels.row_tiles import (
    TileSettings,
    column_sums_over_row_blocks,
    compiler_params,
    fit_tile,
    interpret_default,
    layout,
)
from bert_jax.kernels.sharding import WHOLE, RowShards, flat, per_shard, rows_per_shard

_LOG2E = 1.4426950408889634


# Default tile (block_rows, block_cols, num_warps) and the backward's row groups (programs
# along the rows; sum_blocks = rows / (block_rows * BACKWARD_GROUPS)). BERT's padded vocabulary
# (30,592 = 239 x 128) admits no power-of-two tile wider than 128 columns.
BLOCKS = (16, 128, 4)
BACKWARD_GROUPS = 32
BACKWARD_STAGES = 2


def blocks_for(rows: int) -> tuple[int, int, int, int]:
    """(block_rows, block_cols, num_warps, sum_blocks) for ``rows`` per shard, before fitting
    to the shape."""
    block_rows, block_cols, num_warps = BLOCKS
    return block_rows, block_cols, num_warps, max(1, rows // (block_rows * BACKWARD_GROUPS))


def supported(vocab: int) -> bool:
    """Vocabulary sizes the kernels handle: a multiple of 16 (BERT's padded vocabularies)."""
    return vocab % 16 == 0


# ---------------------------------------------------------------------------------------------
# Kernels. Refs: logits [R, C] float32 tiles, bias [C]; per-row vectors [R].

def _forward_kernel(x_ref, b_ref, m_ref, s_ref):
    """Row max and ``sum exp(z - max)`` of one tile, as [1, block_rows] rows of the [tiles,
    rows] partials."""
    z = x_ref[...] + b_ref[...][None, :]
    m = jnp.max(z, axis=1)
    s = jnp.sum(jnp.exp2((z - m[:, None]) * _LOG2E), axis=1)
    m_ref[...] = m[None, :]
    s_ref[...] = s[None, :]


def _backward_kernel(x_ref, b_ref, ids_ref, lse_ref, g_ref, dz_ref, sums_ref, *,
                     s: TileSettings):
    """``dz = g * (softmax(z) - one_hot(label))`` over ``s.sum_blocks`` row blocks of one column
    tile, and the tile's float32 column sums of ``dz`` over all those rows."""
    from jax.experimental import pallas as pl

    b = b_ref[...]
    col_tile = pl.program_id(0 if s.cols_fastest else 1)
    cols = col_tile * s.block_cols + lax.broadcasted_iota(jnp.int32, (1, s.block_cols), 1)

    def block(rs):
        z = x_ref[rs, :] + b[None, :]
        p = jnp.exp2((z - lse_ref[rs][:, None]) * _LOG2E)
        hit = cols == ids_ref[rs][:, None]
        dz = g_ref[rs][:, None] * (p - jnp.where(hit, 1.0, 0.0))
        dz_ref[rs, :] = dz.astype(dz_ref.dtype)
        return dz

    column_sums_over_row_blocks(block, sums_ref, s)


def _forward_call(x, b, s: TileSettings):
    """(row max, sum exp) partials, each [column tiles, rows] float32."""
    from jax.experimental import pallas as pl

    n, vocab = x.shape
    tiles = vocab // s.block_cols
    at = layout(n, vocab, s.block_rows, s)
    part = pl.BlockSpec((1, s.block_rows), at.order(lambda i, j: (j, i)))
    shape = jax.ShapeDtypeStruct((tiles, n), jnp.float32)
    return pl.pallas_call(
        _forward_kernel,
        grid=at.grid,
        in_specs=[at.tile, at.column],
        out_specs=[part, part],
        out_shape=[shape, shape],
        interpret=s.interpret, name="bert_mlm_xent_forward", **compiler_params(s),
    )(x, b)


def _backward_call(x, b, ids, lse, g, dtype, s: TileSettings):
    """(dz [rows, vocab] in ``dtype``, partial column sums [row groups, vocab] float32)."""
    from jax.experimental import pallas as pl

    n, vocab = x.shape
    at = layout(n, vocab, s.block_rows * s.sum_blocks, s)
    return pl.pallas_call(
        functools.partial(_backward_kernel, s=s),
        grid=at.grid,
        in_specs=[at.tile, at.column, at.row, at.row, at.row],
        out_specs=[at.tile, at.sums],
        out_shape=[jax.ShapeDtypeStruct((n, vocab), dtype), at.sums_shape],
        interpret=s.interpret, name="bert_mlm_xent_backward",
        **compiler_params(s, s.num_stages),
    )(x, b, ids, lse, g)


# ---------------------------------------------------------------------------------------------
# Per shard (``s.shards``): [batch, ..., vocab] logits flattened to rows.

def _log_sum_exp(x, b, s: TileSettings):
    """(log-sum-exp, max) over the last axis of ``x + b``, each ``x.shape[:-1]``."""
    def local(x, b):
        m, total = _forward_call(flat(x), b, s)
        top = jnp.max(m, axis=0)
        lse = top + jnp.log(jnp.sum(total * jnp.exp(m - top[None, :]), axis=0))
        return lse.reshape(x.shape[:-1]), top.reshape(x.shape[:-1])

    ndim = x.ndim - 1
    return per_shard(local, (x,), (b,), (ndim, ndim), s.shards)


def _logit_gradient(x, b, ids, lse, g, dtype, s: TileSettings):
    def local(x, ids, lse, g, b):
        dz, sums = _backward_call(flat(x), b, ids.reshape(-1), lse.reshape(-1),
                                  g.reshape(-1), dtype, s)
        return dz.reshape(x.shape), sums

    return per_shard(local, (x, ids, lse, g), (b,), (x.ndim, 2), s.shards)


def _label_logits(x, b, ids):
    return jnp.take_along_axis(x, ids[..., None], axis=-1)[..., 0] + b[ids]


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _decode_xent(h, table, bias, ids, s: TileSettings):
    return _decode_xent_fwd(h, table, bias, ids, s)[0]


def _decode_xent_fwd(h, table, bias, ids, s):
    x = decode(h, table)
    lse, top = _log_sum_exp(x, bias, s)
    label = _label_logits(x, bias, ids)
    out = (lse - label, (label >= top).astype(jnp.float32))
    return out, (h, table, bias, ids, x, lse)


def _decode_xent_bwd(s, saved, cotangents):
    h, table, bias, ids, x, lse = saved
    g = cotangents[0].astype(jnp.float32)  # d loss / d nll; ``correct`` has no gradient
    dz, sums = _logit_gradient(x, bias, ids, lse, g, h.dtype, s)
    return (*decode_grads(h, table, dz), jnp.sum(sums, axis=0).astype(bias.dtype),
            np.zeros(ids.shape, jax.dtypes.float0))


_decode_xent.defvjp(_decode_xent_fwd, _decode_xent_bwd)


def decode_cross_entropy(h, table, bias, ids, *, block_rows: int | None = None,
                         block_cols: int | None = None, num_warps: int | None = None,
                         sum_blocks: int | None = None, num_stages: int | None = None,
                         interpret: bool | None = None, shards: RowShards = WHOLE):
    """Per-prediction ``(nll, correct)`` of the tied decoder ``z = h @ table.T + bias``:
    ``nll = logsumexp(z) - z[label]`` and ``correct = 1.0`` where the label's logit is the
    maximum (else 0.0), both float32 of ``ids``' shape. ``h`` [..., embed] and ``table``
    [vocab, embed] in the compute dtype (the logit gradient comes back in ``h.dtype``),
    ``bias`` [vocab] float32 with ``NEG_INF`` at padded entries, ``ids`` int [...] (under a mesh
    the first axis is the batch). Gradients flow to ``h``, ``table`` and ``bias`` through
    ``nll``. Tiles default to :func:`blocks_for` (fitted to powers of two dividing the rows
    per shard and the vocabulary); ``interpret`` (Pallas interpret mode) defaults to "not on a
    GPU". ``shards``: run per batch shard of a mesh (the vocabulary whole); default one call
    on the whole arrays."""
    vocab = table.shape[0]
    if h.ndim < 2 or h.shape[-1] != table.shape[-1] or table.ndim != 2:
        raise ValueError(f"decode_cross_entropy needs h [..., embed] and table [vocab, embed] "
                         f"with the same embed; got h {h.shape}, table {table.shape}")
    if bias.shape != (vocab,) or ids.shape != h.shape[:-1]:
        raise ValueError(f"decode_cross_entropy needs bias [vocab] = ({vocab},) and ids of h's "
                         f"leading shape {h.shape[:-1]}; got bias {bias.shape}, ids {ids.shape}")
    if not supported(vocab):
        raise ValueError(f"decode_cross_entropy needs a vocabulary divisible by 16; got {vocab}")
    interpret = interpret_default(interpret)
    rows = rows_per_shard(h, shards)
    block_rows, block_cols, num_warps, sum_blocks, num_stages = fit_tile(
        blocks_for(rows), rows, vocab, (block_rows, block_cols, num_warps, sum_blocks,
                                        BACKWARD_STAGES if num_stages is None else num_stages))
    s = TileSettings(block_rows, block_cols, num_warps, interpret, sum_blocks, num_stages,
                     shards=shards)
    return _decode_xent(h, table, bias.astype(jnp.float32), ids.astype(jnp.int32), s)


def reference(h, table, bias, ids):
    """The same values through XLA (tests, benchmarks): ``reference.decode`` (its backward casts
    the float32 logit gradient to the compute dtype), then ``reference.logits_cross_entropy``."""
    return logits_cross_entropy(decode(h, table) + bias.astype(jnp.float32), ids)

