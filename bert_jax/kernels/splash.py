"""Pallas splash attention (TPU) for bidirectional attention with right padding or packed
sequences.

Padding is expressed as splash's segment ids (1 = real token, 0 = padding): real queries
attend only to real keys, as with key lengths. Packed rows (several examples per row) pass
their example ids (``segment_ids``: 0 = padding, 1..n = the example) through the same native
segment ids. On the CPU the kernel runs in Pallas interpret mode so it can be validated
against XLA attention in tests.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


@functools.lru_cache(maxsize=32)
def _kernel(num_heads: int, seq_len: int, interpret: bool):
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    block = min(128, seq_len)
    if seq_len % block:
        raise ValueError(f"splash attention needs a sequence length divisible by {block}, "
                         f"got {seq_len}")
    mask = sa.MultiHeadMask([sa.FullMask((seq_len, seq_len)) for _ in range(num_heads)])
    sizes = sa.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                          block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                          block_q_dq=block, block_kv_dq=block)
    return sa.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                              interpret=interpret), sa.SegmentIds


def splash_attention(query, key, value, kv_lengths, *, interpret: bool | None = None,
                     segment_ids=None):
    """query/key/value [batch, seq, heads, head_dim], kv_lengths [batch] -> [batch, seq, heads,
    head_dim].

    ``segment_ids``: optional int32 [batch, seq] example ids of packed sequences (0 =
    padding, 1..n = the example a token belongs to): a query attends only to keys of its own
    nonzero id within ``kv_lengths``; padding queries get output 0 and pass no gradient.
    ``None``: every token within ``kv_lengths`` is one example."""
    _, seq_len, num_heads, head_dim = query.shape
    if interpret is None:
        interpret = jax.default_backend() != "tpu"
    kernel, segment_ids_cls = _kernel(num_heads, seq_len, interpret)
    scale = np.float32(1.0 / np.sqrt(head_dim))
    # [batch, heads, seq, head_dim]; splash expects the softmax scale folded into the query.
    q = jnp.swapaxes(query * scale.astype(query.dtype), 1, 2)
    k, v = jnp.swapaxes(key, 1, 2), jnp.swapaxes(value, 1, 2)
    in_length = jnp.arange(seq_len)[None, :] < kv_lengths[:, None]
    if segment_ids is None:
        segments = in_length.astype(jnp.int32)

        def one(q1, k1, v1, seg):
            return kernel(q1, k1, v1, segment_ids=segment_ids_cls(q=seg, kv=seg))

        out = jax.vmap(one)(q, k, v, segments)
        return jnp.swapaxes(out, 1, 2).astype(query.dtype)
    segment_ids = jnp.asarray(segment_ids)
    if segment_ids.shape != (query.shape[0], seq_len):
        raise ValueError(f"segment_ids must be [batch, seq] = [{query.shape[0]}, {seq_len}], "
                         f"got {segment_ids.shape}")
    q_ids = segment_ids.astype(jnp.int32)
    # Keys past the length get id 0 too. Padding queries (id 0) match the padding keys
    # (splash compares ids only), so their output is zeroed below.
    kv_ids = jnp.where(in_length, q_ids, 0)

    def one_packed(q1, k1, v1, q_seg, kv_seg):
        return kernel(q1, k1, v1, segment_ids=segment_ids_cls(q=q_seg, kv=kv_seg))

    out = jax.vmap(one_packed)(q, k, v, q_ids, kv_ids)  # [batch, heads, seq, head_dim]
    out = jnp.where((q_ids != 0)[:, None, :, None], out, 0.0)
    return jnp.swapaxes(out, 1, 2).astype(query.dtype)
