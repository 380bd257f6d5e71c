"""Attention backends agree: XLA fused, explicit (probabilities), and Pallas splash (interpret
mode on the CPU), forward and backward, on the valid (unpadded) query positions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.config import get_preset
from bert_jax.kernels.splash import splash_attention
from bert_jax.modeling import BertModel
from bert_jax.modeling.attention import explicit_attention, fused_attention


def _inputs(seed, batch=2, seq=128, heads=2, dim=32):
    ks = jax.random.split(jax.random.key(seed), 3)
    q, k, v = (jax.random.normal(kk, (batch, seq, heads, dim)) for kk in ks)
    lengths = jnp.array([seq, seq // 2 + 13])[:batch]
    valid = (jnp.arange(seq)[None, :] < lengths[:, None])[:, :, None, None]
    return q, k, v, lengths, valid


@pytest.mark.parametrize("seed", [0, 1])
def test_backends_agree_forward(seed):
    q, k, v, lengths, valid = _inputs(seed)
    ref, probs = explicit_attention(q, k, v, lengths)
    for out in (fused_attention(q, k, v, lengths, "xla"), splash_attention(q, k, v, lengths)):
        np.testing.assert_allclose(np.where(valid, out, 0), np.where(valid, ref, 0), atol=2e-5)
    # probabilities are zero on padded keys and sum to one
    assert float(probs[1, :, :, int(lengths[1]):].max()) == 0.0
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)


def test_splash_gradient_matches_xla():
    q, k, v, lengths, valid = _inputs(3)

    def loss(fn, q, k, v):
        return jnp.sum(jnp.where(valid, fn(q, k, v, lengths), 0.0) ** 2)

    g_splash = jax.grad(lambda *a: loss(splash_attention, *a), argnums=(0, 1, 2))(q, k, v)
    g_xla = jax.grad(lambda *a: loss(lambda *b: fused_attention(*b, "xla"), *a),
                     argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(g_splash, g_xla, strict=True):
        np.testing.assert_allclose(a, b, atol=5e-5)


def test_model_with_splash_matches_xla():
    cfg = get_preset("tiny", vocab_size=300)
    ids = jax.random.randint(jax.random.key(0), (2, 128), 5, 300)
    mask = jnp.stack([jnp.ones(128, jnp.int32), (jnp.arange(128) < 70).astype(jnp.int32)])
    params = jax.jit(BertModel(cfg).init)(jax.random.key(1), ids, mask)
    outs = [BertModel(cfg.with_kernels(attention_impl=impl)).apply(params, ids, mask)
            for impl in ("xla", "splash")]
    valid = np.asarray(mask, bool)[..., None]
    np.testing.assert_allclose(np.where(valid, outs[0]["sequence_output"], 0),
                               np.where(valid, outs[1]["sequence_output"], 0), atol=1e-4)
