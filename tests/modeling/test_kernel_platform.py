"""Kernel choices follow the platform a step is traced for (``parallel.target_platform``), not the
machine it is traced on: a step compiled on one machine for another picks that one's kernels."""

import jax.numpy as jnp

from bert_jax.config import get_preset
from bert_jax.modeling.encoder import use_fused_norm
from bert_jax.modeling.ops import use_fused_gelu
from bert_jax.parallel import targeting


def test_auto_kernels_follow_the_target_platform():
    cfg = get_preset("mini")
    y, bias = jnp.zeros((8, 1024), jnp.float32), jnp.zeros((1024,), jnp.float32)
    assert not use_fused_norm(cfg) and not use_fused_gelu(y, bias, "gelu", "auto")  # CPU host
    with targeting("gpu"):
        assert use_fused_norm(cfg) and use_fused_gelu(y, bias, "gelu", "auto")
    with targeting("tpu"):
        assert not use_fused_norm(cfg) and not use_fused_gelu(y, bias, "gelu", "auto")
    assert not use_fused_gelu(y, bias, "gelu", "off")
