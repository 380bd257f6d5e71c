"""Fused attention with dropout inside the kernel for TPUs (Pallas, Mosaic).

The TPU counterpart of ``flash.py`` (the GPU kernel): the attention probabilities never leave
the chip's vector memory, and the dropout mask is the same counter hash of (salt, query index,
key index) (``dropout.py``), recomputed bit-identically in the backward kernel. For the same
salts the mask is the one the GPU kernel and ``flash.reference_attention`` apply, so a run
drops the same attention weights on either backend.

BERT's sequences are at most 512 tokens, so one program holds every key of its (example,
head): the forward pass takes a block of queries against all keys and normalizes the whole
softmax row at once (no running maximum across key blocks), and the backward pass is one
program per (example, head) that recomputes the probabilities block by block, writes dQ per
query block and accumulates dK and dV. Nothing per row is saved between the passes except the
output (the backward pass recomputes each row's maximum and sum; ``rowsum(dO * O)`` gives the
softmax correction, dropout included).

Layout: [batch, seq, heads, head_dim] in and out (the model's), [batch, heads, seq, head_dim]
inside (TPU blocks need whole trailing dimensions). Padding: keys at positions >= the example's
length (``kv_lengths``, right padding) get no weight; with segment ids (packed sequences,
query ids [batch, seq, 1] and key ids [batch, 1, seq] in vector memory) only keys of the
query's own nonzero id do, and padding queries write 0. The salts ([batch, heads] int32) and
lengths ([batch]) live in scalar memory. Off TPU the kernels run in Pallas interpret mode
(tests).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from bert_jax.kernels.dropout import column_code, keep_from_codes, keep_from_index, row_code

MAX_KV = 2048  # every key of a row is in one program: [block_q, kv] float32 scores
MASK_VALUE = -1e30
MASK_HASHES = ("rowcol", "flat")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Static kernel settings (a custom_vjp non-differentiable argument)."""

    scale: float
    dropout_rate: float
    block_q: int
    mask_hash: str
    interpret: bool
    segments: bool = False  # the kernels take query and key segment ids after v


def supported(seq_len: int, kv_seq_len: int, head_dim: int) -> bool:
    """Shapes the compiled (Mosaic) kernel takes: lengths multiples of 128 up to MAX_KV (TPU
    tiles are 8 x 128; BERT's 128 and 512), any head_dim up to 256."""
    return (seq_len % 128 == 0 and kv_seq_len % 128 == 0 and kv_seq_len <= MAX_KV
            and 0 < head_dim <= 256)


def _keep(q_start, block_q: int, kv_len: int, salt, s: Settings):
    """bool [block_q, kv_len]: the counter-hash mask of queries q_start .. q_start + block_q
    (the same expressions as ``flash.dropout_keep_mask``)."""
    rows = q_start + lax.broadcasted_iota(jnp.int32, (block_q, 1), 0)
    cols = lax.broadcasted_iota(jnp.int32, (1, kv_len), 1)
    if s.mask_hash == "rowcol":
        return keep_from_codes(row_code(rows, salt), column_code(cols), s.dropout_rate)
    return keep_from_index(rows * kv_len + cols, salt, s.dropout_rate)


def _dot(a, b, trans_b: bool = False):
    dims = (((1,), (1 if trans_b else 0,)), ((), ()))
    return lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


def _probabilities(q, k, length, s: Settings, segs=None):
    """Softmax over all keys of a [block_q, head_dim] query block (float32), padded keys 0.
    ``segs``: (query ids [block_q, 1], key ids [1, kv]): only keys of the query's own nonzero
    id count, and queries of id 0 get probabilities 0."""
    scores = _dot(q, k, trans_b=True) * s.scale  # [block_q, kv]
    cols = lax.broadcasted_iota(jnp.int32, scores.shape, 1)
    valid = cols < length
    if segs is not None:
        q_seg, k_seg = segs
        valid = valid & (q_seg == k_seg) & (k_seg != 0)
    scores = jnp.where(valid, scores, MASK_VALUE)
    p = jnp.exp(scores - jnp.max(scores, axis=1, keepdims=True))
    p = p / jnp.sum(p, axis=1, keepdims=True)
    if segs is not None:  # a padding query sees no key: output 0, no gradient
        p = jnp.where(segs[0] != 0, p, 0.0)
    return p


def _segment_refs(refs, s: Settings):
    """((query ids ref, key ids ref) or None, the remaining refs)."""
    return (refs[:2], refs[2:]) if s.segments else (None, refs)


def _forward_kernel(salt_ref, length_ref, q_ref, k_ref, v_ref, *refs, s: Settings):
    from jax.experimental import pallas as pl

    seg_refs, (o_ref,) = _segment_refs(refs, s)
    b, h, i = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    salt, length = salt_ref[b, h], length_ref[b]
    q, k, v = q_ref[...], k_ref[...], v_ref[...]
    p = _probabilities(q, k, length, s, None if seg_refs is None else
                       (seg_refs[0][...], seg_refs[1][...]))
    if s.dropout_rate > 0.0:
        keep = _keep(i * s.block_q, q.shape[0], k.shape[0], salt, s)
        p = jnp.where(keep, p * (1.0 / (1.0 - s.dropout_rate)), 0.0)
    o_ref[...] = _dot(p.astype(v.dtype), v).astype(o_ref.dtype)


def _backward_kernel(salt_ref, length_ref, q_ref, k_ref, v_ref, *refs, s: Settings):
    from jax.experimental import pallas as pl

    seg_refs, (o_ref, do_ref, dq_ref, dk_ref, dv_ref) = _segment_refs(refs, s)
    k_seg = None if seg_refs is None else seg_refs[1][...]
    b, h = pl.program_id(0), pl.program_id(1)
    salt, length = salt_ref[b, h], length_ref[b]
    k, v = k_ref[...], v_ref[...]
    q_len, kv_len = q_ref.shape[0], k.shape[0]
    dk = jnp.zeros(k.shape, jnp.float32)
    dv = jnp.zeros(v.shape, jnp.float32)
    for start in range(0, q_len, s.block_q):  # a few blocks: BERT's rows are short
        rows = slice(start, start + s.block_q)
        q, do = q_ref[rows, :], do_ref[rows, :]
        segs = None if seg_refs is None else (seg_refs[0][rows, :], k_seg)
        p = _probabilities(q, k, length, s, segs)  # [block_q, kv]
        dp = _dot(do, v, trans_b=True)  # dL/d(dropped probabilities)
        p_used = p
        if s.dropout_rate > 0.0:
            keep = _keep(start, s.block_q, kv_len, salt, s)
            inv = 1.0 / (1.0 - s.dropout_rate)
            p_used = jnp.where(keep, p * inv, 0.0)
            dp = jnp.where(keep, dp * inv, 0.0)
        # rowsum(dP * P) = rowsum(dO * O): the softmax's correction, dropout included.
        delta = jnp.sum(do.astype(jnp.float32) * o_ref[rows, :].astype(jnp.float32), axis=1,
                        keepdims=True)
        ds = p * (dp - delta)  # dL/dscores / scale
        dv = dv + _dot(p_used.T.astype(do.dtype), do)
        dk = dk + _dot(ds.T.astype(q.dtype), q)
        dq_ref[rows, :] = (_dot(ds.astype(k.dtype), k) * s.scale).astype(dq_ref.dtype)
    dk_ref[...] = (dk * s.scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _grid_spec(grid, in_specs, out_specs):
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=2, grid=grid, in_specs=in_specs,
                                        out_specs=out_specs)


def _compiler_params(s: Settings, semantics):
    if s.interpret:
        return {}
    from jax.experimental.pallas import tpu as pltpu

    return {"compiler_params": pltpu.CompilerParams(dimension_semantics=semantics)}


def _segment_specs(segs, block_q: int | None, q_len: int, kv_len: int):
    """BlockSpecs of the query ids [batch, q, 1] (tiles of ``block_q`` rows on a (batch,
    heads, query block) grid, or every row on a (batch, heads) grid) and the key ids [batch,
    1, kv] (every key), or none without segment ids."""
    from jax.experimental import pallas as pl

    if segs is None:
        return []
    if block_q is None:
        q_ids = pl.BlockSpec((None, q_len, 1), lambda b, h, *_: (b, 0, 0))
    else:
        q_ids = pl.BlockSpec((None, block_q, 1), lambda b, h, i, *_: (b, i, 0))
    return [q_ids, pl.BlockSpec((None, 1, kv_len), lambda b, h, *_: (b, 0, 0))]


def _forward(q, k, v, salt, lengths, segs, s: Settings):
    """q/k/v [batch, heads, seq, head_dim] -> output, same layout."""
    from jax.experimental import pallas as pl

    batch, heads, q_len, head_dim = q.shape
    kv_len = k.shape[2]
    q_spec = pl.BlockSpec((None, None, s.block_q, head_dim), lambda b, h, i, *_: (b, h, i, 0))
    kv_spec = pl.BlockSpec((None, None, kv_len, head_dim), lambda b, h, i, *_: (b, h, 0, 0))
    itemsize = q.dtype.itemsize
    cost = pl.CostEstimate(  # so that XLA's cost analysis counts the kernel
        flops=4 * batch * heads * q_len * kv_len * head_dim,
        transcendentals=batch * heads * q_len * kv_len,
        bytes_accessed=itemsize * batch * heads * head_dim * (2 * q_len + 2 * kv_len))
    return pl.pallas_call(
        functools.partial(_forward_kernel, s=s), cost_estimate=cost,
        grid_spec=_grid_spec((batch, heads, q_len // s.block_q),
                             [q_spec, kv_spec, kv_spec]
                             + _segment_specs(segs, s.block_q, q_len, kv_len), q_spec),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        interpret=s.interpret, name="bert_flash_tpu_forward",
        **_compiler_params(s, ("parallel", "parallel", "parallel")),
    )(salt, lengths, q, k, v, *(segs or ()))


def _backward(q, k, v, o, do, salt, lengths, segs, s: Settings):
    from jax.experimental import pallas as pl

    batch, heads, q_len, head_dim = q.shape
    kv_len = k.shape[2]
    q_spec = pl.BlockSpec((None, None, q_len, head_dim), lambda b, h, *_: (b, h, 0, 0))
    kv_spec = pl.BlockSpec((None, None, kv_len, head_dim), lambda b, h, *_: (b, h, 0, 0))
    cost = pl.CostEstimate(  # scores recomputed, dP, dV, dK, dQ: five matmuls
        flops=10 * batch * heads * q_len * kv_len * head_dim,
        transcendentals=batch * heads * q_len * kv_len,
        bytes_accessed=q.dtype.itemsize * batch * heads * head_dim * (6 * q_len + 4 * kv_len))
    return pl.pallas_call(
        functools.partial(_backward_kernel, s=s), cost_estimate=cost,
        grid_spec=_grid_spec((batch, heads), [q_spec, kv_spec, kv_spec]
                             + _segment_specs(segs, None, q_len, kv_len) + [q_spec, q_spec],
                             [q_spec, kv_spec, kv_spec]),
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                   jax.ShapeDtypeStruct(k.shape, k.dtype),
                   jax.ShapeDtypeStruct(v.shape, v.dtype)],
        interpret=s.interpret, name="bert_flash_tpu_backward",
        **_compiler_params(s, ("parallel", "parallel")),
    )(salt, lengths, q, k, v, *(segs or ()), o, do)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _attention(q, k, v, salt, lengths, segs, s: Settings):
    return _forward(q, k, v, salt, lengths, segs, s)


def _attention_fwd(q, k, v, salt, lengths, segs, s):
    o = _forward(q, k, v, salt, lengths, segs, s)
    return o, (q, k, v, o, salt, lengths, segs)


def _attention_bwd(s, residuals, do):
    q, k, v, o, salt, lengths, segs = residuals
    dq, dk, dv = _backward(q, k, v, o, do, salt, lengths, segs, s)
    dsegs = None if segs is None else tuple(np.zeros(x.shape, jax.dtypes.float0)
                                            for x in segs)
    return (dq, dk, dv, np.zeros(salt.shape, jax.dtypes.float0),
            np.zeros(lengths.shape, jax.dtypes.float0), dsegs)


_attention.defvjp(_attention_fwd, _attention_bwd)


def flash_attention(query, key, value, kv_lengths, *, salt=None, dropout_rate: float = 0.0,
                    mask_hash: str = "rowcol", block_q: int = 128,
                    interpret: bool | None = None, segment_ids=None):
    """Attention over [batch, seq, heads, head_dim] with right padding given as key lengths
    ([batch]) and, when ``dropout_rate > 0``, dropout on the probabilities from the counter
    hash ``mask_hash`` of ``salt`` (int32 [batch, heads], ``flash.salt_from_rng``). Returns
    the context, same shape as query. ``interpret``: None = interpret mode unless this
    process runs on a TPU (a caller tracing for another platform passes it).

    ``segment_ids``: optional int32 [batch, seq] for packed sequences (several examples per
    row, query and key lengths equal): 0 = padding, 1..n = the example a token belongs to. A
    query attends only to keys of its own nonzero id (and within ``kv_lengths``); padding
    queries get output 0 and pass no gradient; the dropout mask is unchanged. ``None``:
    padding from ``kv_lengths`` alone."""
    batch, q_len, heads, head_dim = query.shape
    kv_len = key.shape[1]
    if mask_hash not in MASK_HASHES:
        raise ValueError(f"mask_hash must be one of {MASK_HASHES}, got {mask_hash!r}")
    if dropout_rate > 0.0 and salt is None:
        raise ValueError("attention dropout needs a salt (flash.salt_from_rng)")
    if interpret is None:
        interpret = jax.default_backend() != "tpu"
    if not interpret and not supported(q_len, kv_len, head_dim):
        raise ValueError(f"the TPU attention kernel needs lengths that are multiples of 128 "
                         f"up to {MAX_KV} and head_dim <= 256; got q {q_len}, kv {kv_len}, "
                         f"head_dim {head_dim}")
    if kv_len > MAX_KV:
        raise ValueError(f"the TPU attention kernel holds whole rows: kv {kv_len} > {MAX_KV}")
    segs = None
    if segment_ids is not None:
        segment_ids = jnp.asarray(segment_ids)
        if q_len != kv_len or segment_ids.shape != (batch, q_len):
            raise ValueError(f"segment_ids must be [batch, seq] = [{batch}, {q_len}] with as "
                             f"many keys as queries (kv {kv_len}), got {segment_ids.shape}")
        ids = segment_ids.astype(jnp.int32)
        segs = (ids[:, :, None], ids[:, None, :])  # query ids [b, q, 1], key ids [b, 1, k]
    block = math.gcd(q_len, block_q)
    if block % 8 and block != q_len:
        block = q_len
    s = Settings(1.0 / math.sqrt(head_dim), float(dropout_rate), block, mask_hash,
                 bool(interpret), segs is not None)
    if salt is None:
        salt = jnp.zeros((batch, heads), jnp.int32)
    q, k, v = (jnp.swapaxes(x, 1, 2) for x in (query, key, value))  # [b, h, s, d]
    out = _attention(q, k, v, salt.astype(jnp.int32), kv_lengths.astype(jnp.int32), segs, s)
    return jnp.swapaxes(out, 1, 2)
