"""Flash attention with dropout inside the kernel (Pallas; Triton on GPUs).

BERT trains with dropout on the attention probabilities. Neither cuDNN's fused attention as
JAX exposes it nor XLA's fused path apply dropout, so without this kernel training falls back to
the explicit einsum attention, which writes the [batch, heads, q, k] scores, probabilities and
dropout mask to memory in the forward pass and reads them back in the backward pass (a
large share of a BERT-Base/128 step, more at length 512: docs/performance.md).

Here the probabilities never leave the chip. The dropout mask is not stored either: it is a
counter-based hash of (salt, query index, key index), recomputed bit-identically in the
backward kernels. ``salt`` is one random int32 per (example, head), drawn from the layer's
dropout PRNG key, so masks differ between layers, steps, examples and heads, and a run is
reproducible from its seed. ``dropout_keep_mask`` computes the same mask with jax.numpy for
tests and for the explicit reference path.

Layout: query/key/value [batch, seq, heads, head_dim] (the model's own, no transposes), or
packed as one [batch, seq, 3, heads, head_dim] array (``flash_attention_packed``: the output of
one query/key/value matmul, read in place; the gradient comes back packed too, so that the
backward pass needs one input-gradient and one weight-gradient matmul); padding is an additive
key bias [batch, kv_seq] (0 for real keys, a large negative number for padding); packed
sequences add segment ids [batch, seq] (example ids, 0 = padding), masked per block as
``q_id == k_id and k_id != 0``, padding queries writing 0. Forward: one program per (example,
head, block of queries) runs the online softmax over blocks of keys. Backward, recomputing
probabilities from the saved log-sum-exp: up to FUSED_BACKWARD_MAX_KV keys one program per
(example, head) computes dQ, dK and dV in one pass; longer sequences use one kernel per block
of keys (dK, dV, looping over queries) and one per block of queries (dQ, looping over keys).
On the CPU the kernels run in Pallas interpret mode, which is how the tests check them
against the explicit attention.
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
from bert_jax.kernels.dropout import salt_from_rng as _salts

LOG2E = math.log2(math.e)
FUSED_BACKWARD_MAX_KV = 128  # ``backward="auto"``: one-pass backward up to this many keys
# The split backward's dQ kernel: 128-query tiles stepping over 64 keys, 4 warps, 3 stages
# (faster than the dK/dV kernel's 64 x 64 in the sweep of docs/performance.md, "Kernels
# against XLA"); () would give it the dK/dV kernel's blocks, warps and stages.
SPLIT_DQ_KERNEL = (128, 64, 4, 3)
BACKWARDS = ("auto", "fused", "split")
MASK_VALUE = -1e9  # additive bias of padded keys (log2 units once scaled; exp2 gives 0)
EMPTY_ROW_LSE = 1e30  # log-sum-exp of a query that sees no key: exp2(score - it) is 0


@dataclasses.dataclass(frozen=True)
class FlashSettings:
    """Static kernel settings (hashable: a custom_vjp non-differentiable argument). Blocks are
    already fitted to the lengths (``fit_block``): each divides its length."""
    scale: float
    dropout_rate: float
    block_q: int
    block_k: int
    block_q_bwd: int
    block_k_bwd: int
    num_warps: int
    num_stages: int
    interpret: bool
    backward: str = "split"  # fused | split (``flash_attention``), never auto
    mask_hash: str = "rowcol"
    bias_grads: bool = False  # the backward kernels also write partial sums of dQ, dK, dV
    packed: bool = False  # q/k/v are slots 0/1/2 of one [b, s, 3, heads, d] array (and dQKV)
    # The split backward's dQ kernel: (block_q, block_k, num_warps, num_stages); () = the
    # dK/dV kernel's (block_q_bwd, block_k_bwd, num_warps, num_stages).
    dq_kernel: tuple = ()
    segments: bool = False  # the kernels take segment ids [batch, seq] after the salt

    def for_dq(self) -> FlashSettings:
        """The settings the split backward's dQ kernel runs with."""
        if not self.dq_kernel:
            return self
        block_q, block_k, warps, stages = self.dq_kernel
        return dataclasses.replace(self, block_q_bwd=block_q, block_k_bwd=block_k,
                                   num_warps=warps, num_stages=stages)


def supported(seq_len: int, kv_seq_len: int, head_dim: int) -> bool:
    """Shapes the kernels handle: lengths divisible by 16, head_dim a power of two >= 16."""
    return (seq_len % 16 == 0 and kv_seq_len % 16 == 0 and head_dim >= 16
            and head_dim & (head_dim - 1) == 0)


# ---------------------------------------------------------------------------------------------
# The dropout mask: the counter hash of ``dropout.py`` with (query, key) as (row, column):
# ``rowcol`` codes each query row and each key column once per block and mixes them per element;
# ``flat`` hashes the flat index q * kv_seq + k.

def _mask_rows(rows, salt, mask_hash: str):
    """What the mask needs of a block's query indices (their codes, or the indices)."""
    return row_code(rows, salt) if mask_hash == "rowcol" else rows


def _mask_cols(cols, mask_hash: str):
    """What the mask needs of a block's key indices (their codes, or the indices)."""
    return column_code(cols) if mask_hash == "rowcol" else cols


def _keep(rows, cols, salt, kv_seq_len: int, rate: float, mask_hash: str):
    """bool [rows, cols]: True where the element is kept (probability 1 - rate); ``rows`` and
    ``cols`` come from ``_mask_rows`` and ``_mask_cols``."""
    if mask_hash == "rowcol":
        return keep_from_codes(rows[:, None], cols[None, :], rate)
    return keep_from_index(rows[:, None] * kv_seq_len + cols[None, :], salt, rate)


def dropout_keep_mask(salt, q_len: int, kv_len: int, rate: float, mask_hash: str = "rowcol"):
    """The kernels' mask with jax.numpy: salt int32 [batch, heads] -> bool [b, h, q, k]."""
    rows = jnp.arange(q_len, dtype=jnp.int32)
    cols = _mask_cols(jnp.arange(kv_len, dtype=jnp.int32), mask_hash)
    return jax.vmap(jax.vmap(lambda s: _keep(_mask_rows(rows, s, mask_hash), cols, s, kv_len,
                                             rate, mask_hash)))(salt)


def salt_from_rng(rng, batch: int, heads: int):
    """One random int32 per (example, head) from a PRNG key."""
    return _salts(rng, (batch, heads))


# ---------------------------------------------------------------------------------------------
# Kernels. Scores are kept in log2 units (exp2 is the hardware's native exponential).

def _dot(a, b, trans_a: bool = False, trans_b: bool = False):
    """2-D matmul with float32 accumulation (what Triton's tl.dot does); transposes are
    folded into the contraction dimensions."""
    dims = (((0 if trans_a else 1,), (1 if trans_b else 0,)), ((), ()))
    return lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


def _iota(n: int, offset):
    return offset + lax.broadcasted_iota(jnp.int32, (n,), 0)


def _forward_kernel(q_ref, k_ref, v_ref, bias_ref, salt_ref, *refs, s: FlashSettings):
    from jax.experimental import pallas as pl

    seg_ref, (o_ref, lse_ref) = _segment_ref(refs, s)
    block_q, block_k = q_ref.shape[0], s.block_k
    kv_len = k_ref.shape[0]
    q = q_ref[...]
    salt = salt_ref[...]
    start_q = pl.program_id(2) * block_q
    rows = _mask_rows(_iota(block_q, start_q), salt, s.mask_hash)
    q_seg = None if seg_ref is None else seg_ref[pl.ds(start_q, block_q)]
    qk_scale = s.scale * LOG2E

    def body(j, carry):
        m, denom, acc = carry
        keys = pl.ds(j * block_k, block_k)
        k, v = k_ref[keys, :], v_ref[keys, :]
        scores = _scores(q, k, bias_ref[keys], qk_scale, _segments(q_seg, seg_ref, keys))
        m_new = jnp.maximum(m, jnp.max(scores, axis=1))
        p = jnp.exp2(scores - m_new[:, None])
        alpha = jnp.exp2(m - m_new)
        denom = denom * alpha + jnp.sum(p, axis=1)
        if s.dropout_rate > 0.0:
            cols = _mask_cols(_iota(block_k, j * block_k), s.mask_hash)
            p = jnp.where(_keep(rows, cols, salt, kv_len, s.dropout_rate, s.mask_hash), p, 0.0)
        acc = acc * alpha[:, None] + _dot(p.astype(v.dtype), v)
        return m_new, denom, acc

    init = (jnp.full((block_q,), -jnp.inf, jnp.float32), jnp.zeros((block_q,), jnp.float32),
            jnp.zeros(q.shape, jnp.float32))
    m, denom, acc = lax.fori_loop(0, kv_len // block_k, body, init)
    inv = 1.0 / (denom * (1.0 - s.dropout_rate))
    lse = m + jnp.log2(denom)
    if q_seg is not None:  # padding queries see no key: output 0, no probability backward
        inv = jnp.where(q_seg != 0, inv, 0.0)
        lse = jnp.where(q_seg != 0, lse, EMPTY_ROW_LSE)
    o_ref[...] = (acc * inv[:, None]).astype(o_ref.dtype)
    lse_ref[...] = lse


def _segment_ref(refs, s: FlashSettings):
    """(segment ids ref or None, the remaining refs): with ``s.segments`` the kernels' first
    ref after the salt holds the example's [seq] segment ids."""
    return (refs[0], refs[1:]) if s.segments else (None, refs)


def _segments(q_seg, seg_ref, keys):
    """(query ids [block_q], key ids [block_k]) of a block, or None without segment ids."""
    return None if seg_ref is None else (q_seg, seg_ref[keys])


def _probabilities(q, k, bias, lse, qk_scale, segs=None):
    return jnp.exp2(_scores(q, k, bias, qk_scale, segs) - lse[:, None])


def _scores(q, k, bias, qk_scale, segs=None):
    """Scaled scores plus the padding bias; with ``segs`` = (query ids, key ids), pairs of
    different ids and keys with id 0 get MASK_VALUE."""
    scores = _dot(q, k, trans_b=True) * qk_scale + bias[None, :]
    if segs is None:
        return scores
    q_seg, k_seg = segs
    same = (q_seg[:, None] == k_seg[None, :]) & (k_seg[None, :] != 0)
    return jnp.where(same, scores, MASK_VALUE)


def _dropped(p, dp, rows, cols, salt, kv_len, s: FlashSettings):
    """(P', dP') with the dropped elements zeroed; ``rows``/``cols`` as ``_keep``. The
    backward kernels compute P already divided by 1 - rate (``_backward_rows``), so that the
    first is P * Z (Z = keep / (1 - rate)), what dV sums, and dS = P / (1 - rate) * (dP' -
    delta) with ``_backward_rows``' delta: no multiply per element."""
    if s.dropout_rate == 0.0:
        return p, dp
    keep = _keep(rows, cols, salt, kv_len, s.dropout_rate, s.mask_hash)
    return jnp.where(keep, p, 0.0), jnp.where(keep, dp, 0.0)


def _backward_rows(out, lse, do, rate: float):
    """The per-query rows the backward kernels read: (log-sum-exp, delta) such that
    ``exp2(score - lse)`` is P / (1 - rate) and ``P / (1 - rate) * (dP_kept - delta)`` is dS.
    delta = rowsum(dO * O) (with dropout, rowsum(dP_dropped * Z * P) equals it too), times
    1 - rate; lse lowered by log2(1 / (1 - rate))."""
    delta = jnp.einsum("bqhd,bqhd->bhq", do.astype(jnp.float32), out.astype(jnp.float32))
    if rate == 0.0:
        return lse, delta
    return lse + math.log2(1.0 - rate), delta * (1.0 - rate)


def _store(ref, s: FlashSettings, slot: int, local, start: int | jax.Array, size: int, value,
           example_head):
    """Writes a [size, head_dim] gradient tile: at rows ``local`` of its own block ref, or
    (packed) into slot ``slot`` of the whole [batch, seq, 3, heads, head_dim] gradient at
    sequence rows start .. start + size of ``example_head`` (the program's ids, read at the
    kernel's top level: interpret mode has no program_id inside loops)."""
    from jax.experimental import pallas as pl

    if s.packed:
        example, head = example_head
        ref[example, pl.ds(start, size), slot, head, :] = value.astype(ref.dtype)
    else:
        ref[local, :] = value.astype(ref.dtype)


def _dkdv_kernel(q_ref, k_ref, v_ref, bias_ref, salt_ref, *refs, s: FlashSettings):
    """dK and dV of one block of keys, looping over blocks of queries. With three output refs
    (dq, dk, dv) the block holds every key (the fused backward for short sequences) and each
    query block's dQ is complete after its step, so it is written there: probabilities and
    the mask are computed once instead of again in the dQ kernel. (One kernel per key block
    that also adds its share of dQ with float32 atomics, or writes dS for an XLA matmul, was
    measured slower than the separate dQ kernel at length 512; rowsum(dO * O) computed here
    from O instead of XLA's pass measured the same: docs/performance.md.)"""
    from jax.experimental import pallas as pl

    seg_ref, (do_ref, lse_ref, delta_ref, *out_refs) = _segment_ref(refs, s)
    fused = s.backward == "fused"
    dq_ref = out_refs[0] if fused else None
    if s.packed:  # one whole-array output holds dQ (fused), dK and dV
        dk_ref = dv_ref = out_refs[0]
        sums = out_refs[1:]
    else:
        dk_ref, dv_ref = out_refs[int(fused):int(fused) + 2]
        sums = out_refs[int(fused) + 2:]  # ([sq], sk, sv) when s.bias_grads
    block_k, block_q = k_ref.shape[0], s.block_q_bwd
    q_len = q_ref.shape[0]
    kv_len = bias_ref.shape[0]
    start_k = pl.program_id(2) * block_k
    ids = pl.program_id(0), pl.program_id(1)
    k, v = k_ref[...], v_ref[...]
    bias = bias_ref[pl.ds(start_k, block_k)]
    salt = salt_ref[...]
    cols = _mask_cols(_iota(block_k, start_k), s.mask_hash)
    k_seg = None if seg_ref is None else seg_ref[pl.ds(start_k, block_k)]
    qk_scale = s.scale * LOG2E

    def body(i, carry):
        dk, dv, sq = carry
        queries = pl.ds(i * block_q, block_q)
        q, do = q_ref[queries, :], do_ref[queries, :]
        segs = None if seg_ref is None else (seg_ref[queries], k_seg)
        p = _probabilities(q, k, bias, lse_ref[queries], qk_scale, segs)
        dp = _dot(do, v, trans_b=True)
        rows = _mask_rows(_iota(block_q, i * block_q), salt, s.mask_hash)
        p_kept, dp = _dropped(p, dp, rows, cols, salt, kv_len, s)
        dv = dv + _dot(p_kept.astype(do.dtype), do, trans_a=True)
        ds = p * (dp - delta_ref[queries][:, None])
        dk = dk + _dot(ds.astype(q.dtype), q, trans_a=True)
        if dq_ref is not None:
            dq = _dot(ds.astype(k.dtype), k) * s.scale
            _store(dq_ref, s, 0, queries, i * block_q, block_q, dq, ids)
            if s.bias_grads:
                sq = sq + jnp.sum(dq, axis=0)
        return dk, dv, sq

    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv, sq = lax.fori_loop(0, q_len // block_q, body,
                               (zeros, zeros, jnp.zeros(k.shape[1:], jnp.float32)))
    dk = dk * s.scale
    _store(dk_ref, s, 1, slice(None), start_k, block_k, dk, ids)
    _store(dv_ref, s, 2, slice(None), start_k, block_k, dv, ids)
    if s.bias_grads:
        for ref, total in zip(sums, ((sq,) if fused else ()) + (
                jnp.sum(dk, axis=0), jnp.sum(dv, axis=0)), strict=True):
            ref[...] = total


def _dq_kernel(q_ref, k_ref, v_ref, bias_ref, salt_ref, *refs, s: FlashSettings):
    """dQ of one block of queries, looping over blocks of keys. Packed, the first of ``refs``
    is the dK/dV kernel's whole-array output, aliased to this kernel's output (slot 0 is
    written here)."""
    from jax.experimental import pallas as pl

    seg_ref, (do_ref, lse_ref, delta_ref, *refs) = _segment_ref(refs, s)
    block_q, block_k = q_ref.shape[0], s.block_k_bwd
    kv_len = k_ref.shape[0]
    q, do = q_ref[...], do_ref[...]
    lse, delta = lse_ref[...], delta_ref[...]
    salt = salt_ref[...]
    start_q = pl.program_id(2) * block_q
    rows = _mask_rows(_iota(block_q, start_q), salt, s.mask_hash)
    q_seg = None if seg_ref is None else seg_ref[pl.ds(start_q, block_q)]
    qk_scale = s.scale * LOG2E

    def body(j, dq):
        keys = pl.ds(j * block_k, block_k)
        k, v = k_ref[keys, :], v_ref[keys, :]
        p = _probabilities(q, k, bias_ref[keys], lse, qk_scale, _segments(q_seg, seg_ref, keys))
        dp = _dot(do, v, trans_b=True)
        cols = _mask_cols(_iota(block_k, j * block_k), s.mask_hash)
        _, dp = _dropped(p, dp, rows, cols, salt, kv_len, s)
        ds = p * (dp - delta[:, None])
        return dq + _dot(ds.astype(k.dtype), k)

    dq = lax.fori_loop(0, kv_len // block_k, body, jnp.zeros(q.shape, jnp.float32)) * s.scale
    dq_ref, *sum_ref = refs[int(s.packed):]
    _store(dq_ref, s, 0, slice(None), start_q, block_q, dq,
           (pl.program_id(0), pl.program_id(1)))
    if s.bias_grads:
        sum_ref[0][...] = jnp.sum(dq, axis=0)


# ---------------------------------------------------------------------------------------------
# pallas_call wrappers

def _compiler_params(s: FlashSettings):
    if s.interpret:
        return {}
    from jax.experimental.pallas import triton as plgpu

    return {"compiler_params": plgpu.CompilerParams(num_warps=s.num_warps,
                                                    num_stages=s.num_stages)}


def _tile_spec(length: int, block: int | None, head_dim: int, slot: int | None = None):
    """BlockSpec of one [block, head_dim] tile per (example, head, i) of a [batch, seq, heads,
    head_dim] array (tile i when ``block`` is set, else the whole sequence), or of slot
    ``slot`` of a packed [batch, seq, 3, heads, head_dim] array."""
    from jax.experimental import pallas as pl

    size = block or length
    if slot is None:
        return pl.BlockSpec((None, size, None, head_dim),
                            lambda b, h, i: (b, i if block else 0, h, 0))
    return pl.BlockSpec((None, size, None, None, head_dim),
                        lambda b, h, i: (b, i if block else 0, slot, h, 0))


def _specs(q_len, kv_len, head_dim, q_block, k_block, packed: bool = False):
    """BlockSpecs (query, key and value sources; q-like and k-like [b, s, h, d] tiles; bias;
    salt; per-query rows) for a (batch, heads, tile) grid: the last grid axis tiles queries
    when ``q_block`` is set, keys when ``k_block`` is set; the other side is whole. Packed,
    the sources are the slots of one [b, s, 3, h, d] array."""
    from jax.experimental import pallas as pl

    qb = q_block or q_len
    q_spec = _tile_spec(q_len, q_block, head_dim)
    k_spec = _tile_spec(kv_len, k_block, head_dim)
    sources = (q_spec, k_spec, k_spec)
    if packed:
        sources = (_tile_spec(q_len, q_block, head_dim, 0),
                   _tile_spec(kv_len, k_block, head_dim, 1),
                   _tile_spec(kv_len, k_block, head_dim, 2))
    row_index = (lambda b, h, i: (b, h, i)) if q_block else (lambda b, h, i: (b, h, 0))
    bias_spec = pl.BlockSpec((None, kv_len), lambda b, h, i: (b, 0))
    salt_spec = pl.BlockSpec((None, None), lambda b, h, i: (b, h))
    row_spec = pl.BlockSpec((None, None, qb), row_index)
    return sources, q_spec, k_spec, bias_spec, salt_spec, row_spec


def _whole_spec():
    """The whole array as one ref (no block), indexed by the kernel (packed gradients)."""
    from jax.experimental import pallas as pl

    return pl.BlockSpec(memory_space=pl.ANY)


def _sources(srcs, s: FlashSettings):
    """The kernels' query, key and value operands: the packed array once per slot."""
    return srcs * 3 if s.packed else srcs


def _shape(srcs, s: FlashSettings):
    """(batch, q_len, kv_len, heads, head_dim) of the query/key/value sources."""
    if s.packed:
        batch, q_len, _, heads, head_dim = srcs[0].shape
        return batch, q_len, q_len, heads, head_dim
    batch, q_len, heads, head_dim = srcs[0].shape
    return batch, q_len, srcs[1].shape[1], heads, head_dim


def _forward(srcs, bias, salt, segs, s: FlashSettings):
    """(context [b, s, h, d], log-sum-exp [b, h, s]) from the (query, key, value) sources."""
    from jax.experimental import pallas as pl

    batch, q_len, kv_len, heads, head_dim = _shape(srcs, s)
    sources, q_spec, _, bias_spec, salt_spec, row_spec = _specs(
        q_len, kv_len, head_dim, s.block_q, None, s.packed)
    dtype = srcs[0].dtype
    return pl.pallas_call(
        functools.partial(_forward_kernel, s=s),
        grid=(batch, heads, q_len // s.block_q),
        in_specs=[*sources, bias_spec, salt_spec] + [bias_spec] * s.segments,
        out_specs=[q_spec, row_spec],
        out_shape=[jax.ShapeDtypeStruct((batch, q_len, heads, head_dim), dtype),
                   jax.ShapeDtypeStruct((batch, heads, q_len), jnp.float32)],
        interpret=s.interpret, name="bert_flash_forward", **_compiler_params(s),
    )(*_sources(srcs, s), bias, salt, *_segment_args(segs))


def _segment_args(segs):
    """The kernels' segment ids operand: [segs] ([batch, seq] int32), or none."""
    return () if segs is None else (segs,)


def _backward(srcs, bias, salt, segs, out, lse, do, s: FlashSettings):
    """((dQ, dK, dV), bias-gradient partial sums); packed: ((dQKV,), sums)."""
    from jax.experimental import pallas as pl

    batch, q_len, kv_len, heads, head_dim = _shape(srcs, s)
    block_q, block_k = s.block_q_bwd, s.block_k_bwd
    lse, delta = _backward_rows(out, lse, do, s.dropout_rate)
    grads = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in srcs[:1 if s.packed else 3]]

    def sums(n_tiles):  # per-(example, head, tile) partial sums of a gradient, [.., head_dim]
        spec = pl.BlockSpec((None, None, None, head_dim), lambda b, h, i: (b, h, i, 0))
        return spec, jax.ShapeDtypeStruct((batch, heads, n_tiles, head_dim), jnp.float32)

    n_sums = int(s.bias_grads)
    if s.backward == "fused":
        sources, q_full, k_full, bias_spec, salt_spec, row_full = _specs(
            q_len, kv_len, head_dim, None, None, s.packed)
        spec, shape = sums(1)
        out = pl.pallas_call(
            functools.partial(_dkdv_kernel, s=s),
            grid=(batch, heads, 1),
            in_specs=[*sources, bias_spec, salt_spec] + [bias_spec] * s.segments
            + [q_full, row_full, row_full],
            out_specs=([_whole_spec()] if s.packed else [q_full, k_full, k_full])
            + [spec] * 3 * n_sums,
            out_shape=grads + [shape] * 3 * n_sums,
            interpret=s.interpret, name="bert_flash_backward", **_compiler_params(s),
        )(*_sources(srcs, s), bias, salt, *_segment_args(segs), do, lse, delta)
        return out[:len(grads)], out[len(grads):]

    sources, q_spec, k_tile, bias_spec, salt_spec, row_full = _specs(
        q_len, kv_len, head_dim, None, block_k, s.packed)
    spec, shape = sums(kv_len // block_k)
    n_kv = 1 if s.packed else 2  # dK and dV outputs (one packed array, or two)
    dkdv = pl.pallas_call(
        functools.partial(_dkdv_kernel, s=s),
        grid=(batch, heads, kv_len // block_k),
        in_specs=[*sources, bias_spec, salt_spec] + [bias_spec] * s.segments
        + [q_spec, row_full, row_full],
        out_specs=([_whole_spec()] if s.packed else [k_tile, k_tile]) + [spec] * 2 * n_sums,
        out_shape=grads[-1:] * n_kv + [shape] * 2 * n_sums,
        interpret=s.interpret, name="bert_flash_dkdv", **_compiler_params(s),
    )(*_sources(srcs, s), bias, salt, *_segment_args(segs), do, lse, delta)
    kv_grads, kv_sums = dkdv[:n_kv], dkdv[n_kv:]

    s_dq = s.for_dq()  # its own blocks, warps and stages
    block_q = s_dq.block_q_bwd
    sources, q_tile, _, bias_spec, salt_spec, row_tile = _specs(
        q_len, kv_len, head_dim, block_q, None, s.packed)
    spec, shape = sums(q_len // block_q)
    args = [*_sources(srcs, s), bias, salt, *_segment_args(segs), do, lse, delta]
    extra = {}
    if s.packed:  # dQ goes into slot 0 of the dK/dV kernel's output, in place
        args.append(kv_grads[0])
        extra["input_output_aliases"] = {len(args) - 1: 0}
    dq, *q_sums = pl.pallas_call(
        functools.partial(_dq_kernel, s=s_dq),
        grid=(batch, heads, q_len // block_q),
        in_specs=[*sources, bias_spec, salt_spec] + [bias_spec] * s.segments
        + [q_tile, row_tile, row_tile] + [_whole_spec()] * int(s.packed),
        out_specs=[_whole_spec() if s.packed else q_tile] + [spec] * n_sums,
        out_shape=grads[:1] + [shape] * n_sums,
        interpret=s.interpret, name="bert_flash_dq", **extra, **_compiler_params(s_dq),
    )(*args)
    return ((dq,) if s.packed else (dq, *kv_grads)), (*q_sums, *kv_sums)


def _with_biases(srcs, qkv_bias, packed: bool):
    """The query/key/value sources plus their biases (XLA's adds, as the projections make
    them), or unchanged without biases. Packed, the [3, heads, head_dim] bias is added as a
    vector over the flattened [.., 3 * heads * head_dim] output, the shape of the projection's
    matmul (XLA still runs it as one pass: docs/performance.md)."""
    if qkv_bias is None:
        return srcs
    if packed:
        (qkv,) = srcs
        flat = qkv.reshape(*qkv.shape[:2], -1) + qkv_bias.reshape(-1).astype(qkv.dtype)
        return (flat.reshape(qkv.shape),)
    return tuple(x + b.astype(x.dtype) for x, b in zip(srcs, qkv_bias, strict=True))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _flash(srcs, bias, salt, segs, qkv_bias, settings):
    return _forward(_with_biases(srcs, qkv_bias, settings.packed), bias, salt, segs,
                    settings)[0]


def _flash_fwd(srcs, bias, salt, segs, qkv_bias, settings):
    srcs = _with_biases(srcs, qkv_bias, settings.packed)
    out, lse = _forward(srcs, bias, salt, segs, settings)
    return out, (srcs, bias, salt, segs, qkv_bias, out, lse)


def _flash_bwd(settings, residuals, do):
    srcs, bias, salt, segs, qkv_bias, out, lse = residuals
    grads, sums = _backward(srcs, bias, salt, segs, out, lse, do, settings)
    dbias = None
    if qkv_bias is not None:  # the kernels' partial sums over (example, tile), q/k/v order
        totals = [jnp.sum(p, axis=(0, 2)) for p in sums]
        if settings.packed:
            dbias = jnp.stack(totals).astype(qkv_bias.dtype)
        else:
            dbias = tuple(t.astype(b.dtype) for t, b in zip(totals, qkv_bias, strict=True))
    dsegs = None if segs is None else np.zeros(segs.shape, jax.dtypes.float0)
    return (tuple(grads), jnp.zeros_like(bias), np.zeros(salt.shape, jax.dtypes.float0),
            dsegs, dbias)


_flash.defvjp(_flash_fwd, _flash_bwd)


def flash_attention(query, key, value, kv_lengths, *, salt=None, dropout_rate: float = 0.0,
                    block_q: int | None = None, block_k: int | None = None,
                    block_q_bwd: int | None = None, block_k_bwd: int = 64,
                    num_warps: int = 4, num_stages: int = 3,
                    backward: str = "auto", interpret: bool | None = None,
                    mask_hash: str = "rowcol", qkv_bias=None, dq_kernel=None,
                    segment_ids=None):
    """Attention over [batch, seq, heads, head_dim] with right padding given as key lengths
    and, when ``dropout_rate > 0``, dropout on the probabilities driven by ``salt``
    (int32 [batch, heads], e.g. ``salt_from_rng``) through the counter hash ``mask_hash``
    (``rowcol`` or ``flat``, see ``dropout.py``). Returns the context, same shape as query.

    ``qkv_bias``: optional (query, key, value) biases, each [heads, head_dim], for attention
    over ``query + bq`` etc.: the projections' bias adds, done here so that the backward
    kernels can sum the biases' gradients as they write dQ, dK and dV (no pass that reads
    them again).

    ``backward``: ``split`` (one kernel per key block for dK/dV, one per query block for dQ,
    any length), ``fused`` (one kernel per (example, head) holding every key: no recomputed
    probabilities; for short sequences) or ``auto`` (fused up to FUSED_BACKWARD_MAX_KV keys,
    split beyond). Defaults (``None``) are what the sweeps in docs/performance.md found
    fastest: the forward 128 queries per program stepping over 32 keys (fused backward,
    length 128) or 64 keys (split, length 512); the fused backward 16 queries per step; the
    split backward's dK/dV kernel 64 keys per program stepping over 64 queries, its dQ kernel
    ``SPLIT_DQ_KERNEL``; 4 warps and 3 pipeline stages throughout. ``dq_kernel``: (block_q,
    block_k, num_warps, num_stages) of the split backward's dQ kernel, overriding that.

    ``segment_ids``: optional int32 [batch, seq] for packed sequences (several examples per
    row; self-attention, so query and key lengths must be equal): 0 = padding, 1..n = the
    example a token belongs to. A query attends only to keys of its own nonzero id (and
    within ``kv_lengths``); padding queries (id 0) get output 0 and pass no gradient. The
    dropout mask stays the same function of (salt, row, column). ``None``: padding from
    ``kv_lengths`` alone, as without the argument.
    """
    batch, q_len, heads, head_dim = query.shape
    if qkv_bias is not None:
        qkv_bias = tuple(jnp.asarray(b) for b in qkv_bias)
        if len(qkv_bias) != 3 or any(b.shape != (heads, head_dim) for b in qkv_bias):
            raise ValueError(f"qkv_bias must be three [heads, head_dim] = [{heads}, {head_dim}] "
                             f"arrays, got {[getattr(b, 'shape', b) for b in qkv_bias]}")
    ids = _segment_ids(segment_ids)
    settings, bias, salt = _prepare(
        batch, q_len, key.shape[1], heads, head_dim, kv_lengths, salt, dropout_rate,
        blocks=(block_q, block_k, block_q_bwd, block_k_bwd), num_warps=num_warps,
        num_stages=num_stages, backward=backward, interpret=interpret, mask_hash=mask_hash,
        bias_grads=qkv_bias is not None, packed=False, dq_kernel=dq_kernel,
        segment_ids=ids)
    return _flash((query, key, value), bias, salt, ids, qkv_bias, settings)


def flash_attention_packed(qkv, kv_lengths, *, salt=None, dropout_rate: float = 0.0,
                           block_q: int | None = None, block_k: int | None = None,
                           block_q_bwd: int | None = None, block_k_bwd: int = 64,
                           num_warps: int = 4, num_stages: int = 3, backward: str = "auto",
                           interpret: bool | None = None, mask_hash: str = "rowcol",
                           qkv_bias=None, dq_kernel=None, segment_ids=None):
    """``flash_attention`` over query, key and value packed as one [batch, seq, 3, heads,
    head_dim] array (slots 0, 1, 2), as one matmul with the [embed, 3, heads, head_dim] kernel
    makes them: the kernels read the slots in place (no slice copies) and the gradient comes
    back as one packed array, so that autodiff needs a single input-gradient matmul and a
    single weight-gradient matmul (no sum of three input gradients, no concatenation).
    ``qkv_bias``: optional [3, heads, head_dim] bias, added here (its gradient summed by the
    backward kernels). ``segment_ids``: optional int32 [batch, seq] example ids of packed
    sequences, as ``flash_attention``'s. Same values and gradients as ``flash_attention`` on
    the slots."""
    if qkv.ndim != 5 or qkv.shape[2] != 3:
        raise ValueError(f"packed qkv must be [batch, seq, 3, heads, head_dim], got "
                         f"{qkv.shape}")
    batch, q_len, _, heads, head_dim = qkv.shape
    if qkv_bias is not None:
        qkv_bias = jnp.asarray(qkv_bias)
        if qkv_bias.shape != (3, heads, head_dim):
            raise ValueError(f"packed qkv_bias must be [3, heads, head_dim] = [3, {heads}, "
                             f"{head_dim}], got {qkv_bias.shape}")
    ids = _segment_ids(segment_ids)
    settings, bias, salt = _prepare(
        batch, q_len, q_len, heads, head_dim, kv_lengths, salt, dropout_rate,
        blocks=(block_q, block_k, block_q_bwd, block_k_bwd), num_warps=num_warps,
        num_stages=num_stages, backward=backward, interpret=interpret, mask_hash=mask_hash,
        bias_grads=qkv_bias is not None, packed=True, dq_kernel=dq_kernel,
        segment_ids=ids)
    return _flash((qkv,), bias, salt, ids, qkv_bias, settings)


def _segment_ids(segment_ids):
    """int32 segment ids, or None."""
    return None if segment_ids is None else jnp.asarray(segment_ids).astype(jnp.int32)


def _prepare(batch, q_len, kv_len, heads, head_dim, kv_lengths, salt, dropout_rate, *, blocks,
             num_warps, num_stages, backward, interpret, mask_hash, bias_grads, packed,
             dq_kernel=None, segment_ids=None):
    """Checks the arguments; returns (FlashSettings, padding bias [batch, kv_len], salt)."""
    if not supported(q_len, kv_len, head_dim):
        raise ValueError(f"flash attention needs lengths divisible by 16 and a power-of-two "
                         f"head_dim >= 16; got q {q_len}, kv {kv_len}, head_dim {head_dim}")
    if dropout_rate > 0.0 and salt is None:
        raise ValueError("flash attention with dropout needs a salt (salt_from_rng)")
    if segment_ids is not None and (q_len != kv_len or segment_ids.shape != (batch, q_len)):
        raise ValueError(f"segment_ids must be [batch, seq] = [{batch}, {q_len}] with as many "
                         f"keys as queries (kv {kv_len}), got {segment_ids.shape}")
    if salt is None:
        salt = jnp.zeros((batch, heads), jnp.int32)
    if interpret is None:
        interpret = jax.default_backend() != "gpu"
    bias = jnp.where(jnp.arange(kv_len)[None, :] < kv_lengths[:, None], 0.0,
                     MASK_VALUE).astype(jnp.float32)
    if mask_hash not in ("rowcol", "flat"):
        raise ValueError(f"mask_hash must be rowcol or flat, got {mask_hash!r}")
    if backward not in BACKWARDS:
        raise ValueError(f"backward must be one of {BACKWARDS}, got {backward!r}")
    if backward == "auto":
        backward = "fused" if kv_len <= FUSED_BACKWARD_MAX_KV else "split"
    fused = backward == "fused"
    block_q, block_k, block_q_bwd, block_k_bwd = blocks
    if block_q is None:
        block_q = 128
    if block_q_bwd is None:
        block_q_bwd = 16 if fused else 64
    if block_k is None:
        block_k = 32 if fused else 64
    fitted = [fit_block(b, n) for b, n in ((block_q, q_len), (block_k, kv_len),
                                       (block_q_bwd, q_len), (block_k_bwd, kv_len))]
    if dq_kernel is None:
        dq_kernel = SPLIT_DQ_KERNEL if backward == "split" else ()
    if dq_kernel:
        if len(dq_kernel) != 4:
            raise ValueError(f"dq_kernel must be (block_q, block_k, num_warps, num_stages), "
                             f"got {dq_kernel!r}")
        dq_kernel = (fit_block(dq_kernel[0], q_len), fit_block(dq_kernel[1], kv_len),
                     int(dq_kernel[2]), int(dq_kernel[3]))
    settings = FlashSettings(1.0 / math.sqrt(head_dim), float(dropout_rate), *fitted,
                             num_warps, num_stages, bool(interpret), backward, mask_hash,
                             bias_grads, packed, tuple(dq_kernel), segment_ids is not None)
    return settings, bias, salt.astype(jnp.int32)


def fit_block(block: int, length: int) -> int:
    """The largest power of two <= ``block`` that divides ``length`` (Triton's blocks are
    powers of two: a length of 6 gets 2, not 6)."""
    fitted = 1
    while fitted * 2 <= block and length % (fitted * 2) == 0:
        fitted *= 2
    return fitted


def reference_attention(query, key, value, kv_lengths, *, salt=None, dropout_rate=0.0,
                        mask_hash: str = "rowcol", segment_ids=None):
    """The same computation with jax.numpy (materialized probabilities; tests), the ground
    truth of the kernels' ``segment_ids``: keys within ``kv_lengths`` with the query's own
    nonzero id; queries of id 0 get probabilities 0 (output 0, no gradient)."""
    depth = query.shape[-1]
    scores = jnp.einsum("bqhd,bkhd->bhqk", query, key,
                        preferred_element_type=jnp.float32) / jnp.float32(math.sqrt(depth))
    valid = jnp.arange(key.shape[1])[None, :] < kv_lengths[:, None]
    valid = valid[:, None, None, :]  # [b, 1, 1, k]
    if segment_ids is not None:
        q_seg, k_seg = segment_ids[:, None, :, None], segment_ids[:, None, None, :]
        valid = valid & (q_seg == k_seg) & (k_seg != 0)  # [b, 1, q, k]
    scores = jnp.where(valid, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    if segment_ids is not None:
        probs = jnp.where(segment_ids[:, None, :, None] != 0, probs, 0.0)
    if dropout_rate > 0.0:
        keep = dropout_keep_mask(salt, query.shape[1], key.shape[1], dropout_rate, mask_hash)
        probs = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
    return jnp.einsum("bhqk,bkhd->bqhd", probs.astype(value.dtype), value)
