"""Pallas splash attention (TPU) for bidirectional attention with right padding.

Padding is expressed as segment ids (1 = real token, 0 = padding): real queries attend only
to real keys, as with key lengths. On the CPU the kernel runs in Pallas interpret mode so it
can be validated against XLA attention in tests.
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


def splash_attention(query, key, value, kv_lengths, *, interpret: bool | None = None):
    """query/key/value [batch, seq, heads, head_dim], kv_lengths [batch] -> [batch, seq, heads,
    head_dim]."""
    _, seq_len, num_heads, head_dim = query.shape
    if interpret is None:
        interpret = jax.default_backend() != "tpu"
    kernel, segment_ids_cls = _kernel(num_heads, seq_len, interpret)
    scale = np.float32(1.0 / np.sqrt(head_dim))
    # [batch, heads, seq, head_dim]; splash expects the softmax scale folded into the query.
    q = jnp.swapaxes(query * scale.astype(query.dtype), 1, 2)
    k, v = jnp.swapaxes(key, 1, 2), jnp.swapaxes(value, 1, 2)
    segments = (jnp.arange(seq_len)[None, :] < kv_lengths[:, None]).astype(jnp.int32)

    def one(q1, k1, v1, seg):
        return kernel(q1, k1, v1, segment_ids=segment_ids_cls(q=seg, kv=seg))

    out = jax.vmap(one)(q, k, v, segments)
    return jnp.swapaxes(out, 1, 2).astype(query.dtype)
