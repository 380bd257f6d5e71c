"""Scaled dot-product attention backends behind one function.

Padding is expressed as per-example key lengths (``kv_lengths``, right-padded inputs, which
every bert-jax pipeline produces) so that cuDNN's fused kernel can skip it; a general boolean
mask is used only where lengths cannot describe it. The explicit (einsum) path is used when
attention probabilities are requested or attention dropout is active, since fused kernels
return neither.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def resolve_implementation(name: str) -> str:
    """``auto`` -> cudnn on GPU, xla elsewhere."""
    if name == "auto":
        return "cudnn" if jax.default_backend() == "gpu" else "xla"
    return name


def lengths_to_mask(kv_lengths: jax.Array, seq_len: int) -> jax.Array:
    """[batch] lengths -> bool[batch, 1, 1, seq] key mask."""
    return (jnp.arange(seq_len)[None, :] < kv_lengths[:, None])[:, None, None, :]


def explicit_attention(query, key, value, kv_lengths, *, dropout_rng=None, dropout_rate=0.0,
                       deterministic=True):
    """Attention with materialized probabilities. Returns (context, probs).

    query/key/value: [batch, seq, heads, head_dim]; probs: [batch, heads, q_seq, kv_seq].
    """
    depth = query.shape[-1]
    scores = jnp.einsum("bqhd,bkhd->bhqk", query, key,
                        preferred_element_type=jnp.float32) / jnp.sqrt(depth).astype(jnp.float32)
    mask = lengths_to_mask(kv_lengths, key.shape[1])
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    attn = probs
    if not deterministic and dropout_rate > 0.0:
        keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs.shape)
        attn = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
    context = jnp.einsum("bhqk,bkhd->bqhd", attn.astype(value.dtype), value)
    return context, probs


def fused_attention(query, key, value, kv_lengths, implementation: str):
    """``jax.nn.dot_product_attention`` (XLA or cuDNN) with padding given as key lengths."""
    impl = resolve_implementation(implementation)
    if impl == "splash":
        from bert_jax.modeling.splash import splash_attention

        return splash_attention(query, key, value, kv_lengths)
    if impl == "cudnn" and query.dtype not in (jnp.bfloat16, jnp.float16):
        impl = "xla"  # cuDNN fused attention needs half precision inputs
    return jax.nn.dot_product_attention(
        query, key, value, key_value_seq_lengths=kv_lengths.astype(jnp.int32),
        implementation=impl)
