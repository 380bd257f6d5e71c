"""Splash attention (``kernels/splash.py``) with segment ids for packed rows, in Pallas
interpret mode: values and gradients against the reference, each example of a packed row as
if alone, and an ahead-of-time compile for a TPU chip (libtpu, no TPU needed)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from packing import assert_packed_equals_alone, qkv, segment_ids

from bert_jax.kernels import flash
from bert_jax.kernels.splash import splash_attention

# Packed rows of 256 tokens (two 128-token blocks): three examples (40, 110, 50), the second
# straddling the block boundary, and 56 padding tokens; two examples filling a row.
PACKED = ((40, 110, 50), (100, 156))


def test_segment_ids_match_reference():
    q, k, v = qkv(0, 2, 256, 2, 32)
    ids = segment_ids(PACKED, 256)
    lengths = jnp.sum(ids != 0, axis=1)
    cot = jax.random.normal(jax.random.key(1), q.shape)

    def run(fn):
        def loss(q, k, v):
            out = fn(q, k, v, lengths, segment_ids=ids)
            return jnp.sum(out * cot), out

        return jax.value_and_grad(loss, (0, 1, 2), has_aux=True)(q, k, v)

    (_, out), grads = run(splash_attention)
    (_, ref), ref_grads = run(flash.reference_attention)
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=2e-5)
    for g, r in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(g, r, atol=5e-5, rtol=5e-5)
    assert float(jnp.abs(out[np.asarray(ids) == 0]).max()) == 0.0
    with pytest.raises(ValueError, match="segment_ids"):
        splash_attention(q, k, v, lengths, segment_ids=ids[:, :128])


def test_packed_rows_equal_examples_alone():
    q, k, v = qkv(2, 2, 256, 2, 32)
    assert_packed_equals_alone(splash_attention, q, k, v, segment_ids(PACKED, 256), atol=2e-5)


def test_compiles_for_tpu_with_segment_ids():
    from jax.sharding import SingleDeviceSharding

    from bert_jax.tpu.topologies import abstract_devices, parse_slice

    sharding = SingleDeviceSharding(abstract_devices(parse_slice("v5e-1"))[0])
    x = jax.ShapeDtypeStruct((2, 512, 16, 64), jnp.bfloat16, sharding=sharding)
    ints = jax.ShapeDtypeStruct((2,), jnp.int32, sharding=sharding)
    ids = jax.ShapeDtypeStruct((2, 512), jnp.int32, sharding=sharding)

    def step(q, k, v, lengths, ids):
        def loss(q, k, v):
            out = splash_attention(q, k, v, lengths, interpret=False, segment_ids=ids)
            return out.astype(jnp.float32).sum()
        return jax.grad(loss, (0, 1, 2))(q, k, v)

    compiled = jax.jit(step).lower(x, x, x, ints, ids).compile()
    assert compiled.memory_analysis() is not None
