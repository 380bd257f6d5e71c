"""The float8 cast kernel (``kernels/fp8_cast.py``): scaled, saturated float8 values with their
transposed copy and maximum against jax.numpy, per-shard runs under a mesh, the Triton lowering
for the GPU, and bad input named. Pallas interpret mode on the CPU."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from triton_lowering import cuda_lowering_text

from bert_jax.kernels import fp8_cast
from bert_jax.kernels.sharding import RowShards

E4M3, E5M2 = jnp.float8_e4m3fn, jnp.float8_e5m2


def _x(shape, dtype=jnp.bfloat16, seed=0):
    return (3.0 * jax.random.normal(jax.random.key(seed), shape)).astype(dtype)


@pytest.mark.parametrize("shape,dtype", [((256, 96), E4M3), ((128, 192), E5M2),
                                         ((64, 48), E4M3)])
def test_values_transposed_copy_and_maximum(shape, dtype):
    """The float8 values equal quantizing the float32 values (saturated at the format's
    maximum, never NaN), the transposed copy holds the same values, and the maximum is the
    exact max |x|, for a scale that fits and one 4x too small."""
    x = _x(shape)
    peak = float(jnp.abs(x.astype(jnp.float32)).max())
    limit = float(jnp.finfo(dtype).max)
    for fit in (1.0, 0.25):
        scale = fit * peak / limit
        q, qt, amax = jax.jit(lambda x, sc: fp8_cast.cast_transposed(x, sc, dtype))(x, scale)
        want_q, _, want_max = fp8_cast.reference(x, scale, dtype)
        assert q.dtype == dtype and q.shape == shape and qt.shape == shape[::-1]
        got = np.asarray(q, np.float32)
        assert not np.isnan(got).any()
        np.testing.assert_array_equal(got, np.asarray(want_q, np.float32))
        np.testing.assert_array_equal(np.asarray(qt, np.float32), got.T)
        assert float(amax) == float(want_max) == peak
        assert float(np.abs(got).max()) == (limit if fit < 1 else
                                            float(np.abs(np.asarray(want_q, np.float32)).max()))


def test_per_shard_under_a_mesh_matches_one_device():
    """Under a 2-device data mesh the kernel runs per batch shard: the same values, the
    transposed copy split on its second axis, the maximum over both shards."""
    if jax.device_count() < 2:
        pytest.skip("needs 2 devices (XLA_FLAGS=--xla_force_host_platform_device_count)")
    from bert_jax import parallel

    x = _x((256, 64))
    want = jax.jit(lambda x: fp8_cast.cast_transposed(x, 0.02, E4M3))(x)
    mesh = parallel.create_mesh({"data": 2, "fsdp": 1, "tensor": 1}, None, jax.devices()[:2])
    shards = RowShards(mesh, ("data", "fsdp"))
    fn = functools.partial(fp8_cast.cast_transposed, scale=0.02, dtype=E4M3, shards=shards)
    got = jax.jit(fn)(x)
    text = jax.jit(fn).lower(x).as_text()
    assert text.count("manual_computation") + text.count("shard_map") >= 1
    for a, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(w, np.float32))


def test_lowers_to_triton():
    x = jax.ShapeDtypeStruct((32768, 1024), jnp.bfloat16)
    s = fp8_cast.tile_settings(x, interpret=False)
    assert (s.block_rows, s.block_cols, s.num_warps) == fp8_cast.BLOCKS
    text = cuda_lowering_text(lambda x: fp8_cast.cast_transposed(x, 0.01, E4M3, s), x)
    assert text.count("xla.gpu.triton") == 1 and '"bert_fp8_cast_transposed' in text


def test_bad_input_is_named():
    with pytest.raises(ValueError, match=r"cast_transposed needs x of shape \[rows, width\]"):
        fp8_cast.tile_settings(jnp.zeros((4, 8, 32)))
    with pytest.raises(ValueError, match="divisible by 16"):
        fp8_cast.tile_settings(jnp.zeros((64, 40)))
