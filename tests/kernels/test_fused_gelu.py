"""The bias + erf GELU kernel pair (``bert_jax/kernels/fused_gelu.py``, Pallas interpret mode
on the CPU): values and gradients against ``ops.add_bias_activate``, its own erf against
float64 ``math.erf``, per-shard runs under a mesh, the Triton lowering for the GPU, and the
``BertConfig.fused_gelu`` choice."""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from triton_lowering import cuda_lowering_text

from bert_jax.kernels import fused_gelu
from bert_jax.kernels.sharding import WHOLE, RowShards
from bert_jax.modeling import ops


def _inputs(shape, dtype=jnp.float32, seed=0):
    k = jax.random.split(jax.random.key(seed), 3)
    width = shape[-1]
    y = (2.0 * jax.random.normal(k[0], shape)).astype(dtype)  # x spans both GELU tails
    b = (0.5 * jax.random.normal(k[1], (width,))).astype(dtype)
    g = jax.random.normal(k[2], shape).astype(dtype)
    return y, b, g


def _vjp(fn, y, b, g):
    out, pullback = jax.vjp(fn, y, b)
    return (out, *pullback(g))


def _reference_vjp(y, b, g):
    return _vjp(lambda y, b: ops.add_bias_activate(y, b, "gelu", fused="off"), y, b, g)


def _close(got, want, tol, name):
    scale = max(float(jnp.abs(want).max()), 1.0)
    err = float(jnp.abs(got.astype(jnp.float32) - want.astype(jnp.float32)).max())
    assert err <= tol * scale, f"{name}: max error {err:.3g} > {tol} x {scale:.3g}"


@pytest.mark.parametrize("shape,block_rows,block_cols,sum_blocks", [
    ((2, 16, 96), None, None, None),  # defaults: 3 column tiles of 32
    ((2, 32, 768), 4, 256, 4),        # 3 column tiles of 256, 4 row blocks per bwd program
    ((64, 384), 8, 128, 2),           # 2-D [tokens, width], 3 column tiles of 128
])
def test_values_and_gradients_match_add_bias_activate(shape, block_rows, block_cols,
                                                      sum_blocks):
    """Output, dy and db (the column sums carried over several row blocks per program, then
    summed over the programs) equal the XLA path's in float32."""
    y, b, g = _inputs(shape)

    def fused(y, b):
        return fused_gelu.bias_gelu(y, b, block_rows=block_rows, block_cols=block_cols,
                                    sum_blocks=sum_blocks)

    got = _vjp(fused, y, b, g)
    want = _reference_vjp(y, b, g)
    for name, a, w in zip(("out", "dy", "db"), got, want, strict=True):
        assert a.shape == w.shape and a.dtype == w.dtype, name
        _close(a, w, 1e-6, name)
    # The reference itself: not a constant or a pass-through.
    assert float(jnp.abs(want[0] - (y + b)).max()) > 1.0
    assert float(jnp.abs(want[2]).max()) > 1.0


def test_default_blocks_group_row_blocks_for_long_inputs():
    """blocks_for: the backward groups row blocks to ~BACKWARD_PROGRAMS programs; given tiles
    and row blocks apply to every shape (None entries keep the defaults)."""
    rows, cols, warps, sums = fused_gelu.blocks_for(1 << 20)
    assert (rows, cols, warps) == fused_gelu.BLOCKS
    assert (1 << 20) // (rows * sums) == fused_gelu.BACKWARD_PROGRAMS
    assert fused_gelu.blocks_for(64)[3] == 1
    assert fused_gelu.blocks_for(64, (2, 128, 1), 8) == (2, 128, 1, 8)
    assert fused_gelu.blocks_for(1 << 20, (None, 1024, None))[:3] == (4, 1024, 2)
    # The default row blocks per program follow the given block rows.
    assert fused_gelu.blocks_for(1 << 20, (2, None, None))[3] == (1 << 20) // (
        2 * fused_gelu.BACKWARD_PROGRAMS)


def test_bfloat16_inputs_and_output_dtype():
    """bf16 in, bf16 out: computed in float32 from y + b rounded to bf16, as the XLA path
    rounds it, so for x > -3 the outputs are the same bf16 numbers (but where the two float32
    results straddle a rounding boundary: none on the CPU); below, where x Phi(x) < 0.004 and
    both float32 evaluations lose digits to 0.5 +- erf/2, they agree to ~1e-6 |x|. Gradients
    agree to bf16 precision."""
    y, b, g = _inputs((2, 16, 256), jnp.bfloat16)
    got = _vjp(fused_gelu.bias_gelu, y, b, g)
    want = _reference_vjp(y, b, g)
    assert [a.dtype for a in got] == [jnp.bfloat16] * 3
    out, ref = got[0].astype(jnp.float32), want[0].astype(jnp.float32)
    x = (y + b).astype(jnp.float32)
    assert 0.9 < float(jnp.mean(x > -3.0)) < 0.99  # both regions are tested
    same = jnp.where(x > -3.0, out == ref, True)
    assert float(jnp.mean(same)) >= 0.999, float(jnp.mean(same))
    np.testing.assert_allclose(out, ref, rtol=2.0**-7, atol=1e-6)
    np.testing.assert_array_equal(ref, fused_gelu.reference(y, b).astype(jnp.float32))
    _close(got[1], want[1], 1e-2, "dy")
    _close(got[2], want[2], 1e-2, "db")  # float32 sums of dx vs sums of bf16-rounded dx


def test_erf_accuracy_against_float64():
    """The kernels' float32 erf within 3e-7 of float64 math.erf over a dense grid of [-8, 8]
    (documented: 1.2e-7), odd, and the normal CDF within 1.5e-7 over [-12, 12]."""
    x = np.linspace(-8.0, 8.0, 1_600_001, dtype=np.float32)
    got = np.asarray(jax.jit(fused_gelu.erf)(x), np.float64)
    want = np.vectorize(math.erf)(x.astype(np.float64))
    err = np.abs(got - want)
    assert err.max() <= 3e-7, f"erf max abs error {err.max():.3g} at x = {x[err.argmax()]}"
    np.testing.assert_array_equal(got, -got[::-1])  # odd (the grid is symmetric)
    assert got[-1] == 1.0 and got[0] == -1.0

    xs = np.linspace(-12.0, 12.0, 480_001, dtype=np.float32)
    cdf, gauss = jax.jit(fused_gelu._cdf_and_gauss)(xs)
    x64 = xs.astype(np.float64)
    want_cdf = np.vectorize(lambda v: 0.5 * math.erfc(-v / math.sqrt(2.0)))(x64)
    assert np.abs(np.asarray(cdf, np.float64) - want_cdf).max() <= 1.5e-7
    # exp(-x^2/2) to the float32 rounding of its argument (up to 72 here: ~1e-5 relative)
    np.testing.assert_allclose(gauss, np.exp(-0.5 * x64 * x64), rtol=2e-5, atol=1e-30)


def test_gelu_tails_and_non_finite_inputs():
    """Far tails: 0 and x; infinities as the XLA path gives them (nan for -inf: -inf * 0)."""
    y = jnp.array([[-1e4, -30.0, -6.0, 0.0, 6.0, 30.0, 1e4, jnp.inf,
                    -jnp.inf, jnp.nan, 1e-3, -1e-3, 0.5, -0.5, 2.0, -2.0]], jnp.float32)
    b = jnp.zeros((16,), jnp.float32)
    got = np.asarray(fused_gelu.bias_gelu(y, b))[0]
    want = np.asarray(ops.add_bias_activate(y, b, "gelu"))[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert got[0] == 0.0 and got[6] == 1e4 and got[7] == np.inf
    assert np.isnan(got[8]) and np.isnan(got[9])


def test_per_shard_under_a_mesh_matches_one_device():
    """Under a 2-device data mesh the kernels run per batch shard (shard_map); values and
    gradients (bias-gradient partial sums of both shards summed) equal the one-device run."""
    if jax.device_count() < 2:
        pytest.skip("needs 2 devices (XLA_FLAGS=--xla_force_host_platform_device_count)")
    from bert_jax import parallel

    y, b, _ = _inputs((4, 16, 128))

    def loss(y, b, shards=WHOLE):
        out = fused_gelu.bias_gelu(y, b, block_rows=4, sum_blocks=2, shards=shards)
        return jnp.sum(out * jnp.cos(out))

    want = jax.value_and_grad(loss, (0, 1))(y, b)
    mesh = parallel.create_mesh({"data": 2, "fsdp": 1, "tensor": 1}, None, jax.devices()[:2])
    shards = RowShards(mesh, ("data", "fsdp"))
    fn = jax.value_and_grad(functools.partial(loss, shards=shards), (0, 1))
    got = jax.jit(fn)(y, b)
    text = jax.jit(fn).lower(y, b).as_text()
    assert text.count("manual_computation") + text.count("shard_map") >= 2  # fwd + bwd
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-6, atol=2e-6)


def test_split_mlp_axis_is_refused():
    """Tensor parallelism splits the intermediate axis (rule mlp -> tensor): the model's
    placement of the kernels gives a clear error naming the logical axis, not a wrong
    per-shard result."""
    if jax.device_count() < 2:
        pytest.skip("needs 2 devices")
    from bert_jax import parallel
    from bert_jax.modeling import placement

    y, b, _ = _inputs((2, 8, 64))
    mesh = parallel.create_mesh({"data": 1, "fsdp": 1, "tensor": 2}, None, jax.devices()[:2])
    fn = parallel.traced_in_mesh(
        lambda y, b: fused_gelu.bias_gelu(y, b, shards=placement.gelu_shards()), mesh,
        parallel.DEFAULT_RULES)
    with pytest.raises(ValueError, match="logical axis 'mlp'.*tensor"):
        jax.jit(fn)(y, b)


@pytest.mark.parametrize("lead,width,sum_blocks", [
    ((8, 128), 384, 1), ((8, 128), 3072, 1), ((8, 128), 3072, 4), ((8, 128), 4096, 2),
    ((2, 3), 128, 4),  # 6 rows (an MLM head's masked positions): row blocks of 2
])
def test_triton_lowering_for_the_gpu(lead, width, sum_blocks):
    """The kernels lower to Triton for CUDA from this CPU machine (power-of-two tiles: the
    width in 3 x 128, 6 x 512, 8 x 512 columns; row blocks dividing the rows), forward and
    backward, the backward also with a loop over row blocks."""
    sd = jax.ShapeDtypeStruct

    def loss(y, b):
        out = fused_gelu.bias_gelu(y, b, sum_blocks=sum_blocks, interpret=False)
        return jnp.sum(out.astype(jnp.float32))

    text = cuda_lowering_text(jax.grad(loss, (0, 1)), sd((*lead, width), jnp.bfloat16),
                              sd((width,), jnp.bfloat16))
    assert text.count("xla.gpu.triton") == 2
    assert "bert_bias_gelu_forward" in text and "bert_bias_gelu_backward" in text


def test_bad_input_is_named():
    y, b, _ = _inputs((2, 8, 96))
    with pytest.raises(ValueError, match=r"divisible by 16; got y \(2, 8, 40\)"):
        fused_gelu.bias_gelu(y[..., :40], b[:40])
    with pytest.raises(ValueError, match=r"b of shape .* \(96,\) for y \(2, 8, 96\); got b "
                                         r"\(64,\)"):
        fused_gelu.bias_gelu(y, b[:64])
    with pytest.raises(ValueError, match=r"leading \(row\) axis; got y \(96,\)"):
        fused_gelu.bias_gelu(y[0, 0], b)
    assert fused_gelu.supported(3072) and fused_gelu.supported(16)
    assert not fused_gelu.supported(40)


def _has_kernel(fn, *args) -> bool:
    return "pallas_call" in str(jax.make_jaxpr(lambda *a: fn(*a))(*args))


def test_fused_choice_routes_gelu_through_the_kernels():
    """add_bias_activate(..., "gelu", fused="force") runs the kernels (interpret mode here)
    with the XLA path's values and gradients; "off", other activations, widths not divisible
    by 16 and "auto" off GPUs keep the XLA path."""
    y, b, g = _inputs((2, 16, 192))

    def gelu(y, b):
        return ops.add_bias_activate(y, b, "gelu", fused="force")

    want = _vjp(lambda y, b: ops.add_bias_activate(y, b, "gelu", fused="off"), y, b, g)
    assert not _has_kernel(lambda y, b: ops.add_bias_activate(y, b, "gelu", fused="off"), y, b)
    assert _has_kernel(lambda y, b: ops.add_bias_activate(y, b, "gelu", fused="auto"),
                       y, b) == (jax.default_backend() == "gpu")  # auto: GPUs only
    assert _has_kernel(gelu, y, b)
    assert _has_kernel(jax.grad(lambda y, b: jnp.sum(gelu(y, b)), (0, 1)), y, b)
    got = _vjp(gelu, y, b, g)
    for name, a, w in zip(("out", "dy", "db"), got, want, strict=True):
        _close(a, w, 1e-6, name)
    assert not _has_kernel(lambda y, b: ops.add_bias_activate(y, b, "relu", fused="force"),
                           y, b)
    assert not _has_kernel(gelu, y[..., :40], b[:40])


def test_model_with_fused_gelu_matches_xla():
    """A tiny BertForPreTraining (2 MLP GELUs of width 512 and the MLM transform's of 128):
    loss and gradients with fused_gelu="force" (the kernels, with the config's tiles) equal
    those with "off"."""
    from bert_jax import modeling
    from bert_jax.config import KernelOptions, get_preset

    cfg = get_preset("tiny", vocab_size=128, kernels=KernelOptions(fused_gelu="off"))
    ids = jax.random.randint(jax.random.key(0), (2, 16), 5, 128)
    mask = jnp.ones_like(ids)
    positions = jnp.tile(jnp.arange(1, 4)[None], (2, 1))
    params = jax.jit(modeling.BertForPreTraining(cfg).init)(jax.random.key(1), ids, mask)

    def loss_of(config):
        def loss(p):
            out = modeling.BertForPreTraining(config).apply(p, ids, mask,
                                                            masked_lm_positions=positions)
            return jnp.mean(out["mlm_logits"].astype(jnp.float32) ** 2)
        return loss

    want = jax.jit(jax.value_and_grad(loss_of(cfg)))(params)
    fused = cfg.with_kernels(fused_gelu="force", gelu_blocks=(8, 64, 1), gelu_sum_blocks=2)
    jaxpr = str(jax.make_jaxpr(loss_of(fused))(params))
    assert jaxpr.count(" name=bert_bias_gelu_forward") == 3
    tile = "block_shape=(Blocked(block_size=8), Blocked(block_size=64))"  # gelu_blocks
    assert tile in jaxpr
    assert tile not in str(jax.make_jaxpr(loss_of(fused.with_kernels(gelu_blocks=None)))(params))
    got = jax.jit(jax.value_and_grad(loss_of(fused)))(params)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        _close(g, w, 1e-5, "model")


# ---- float8 outputs (modeling/fp8.py's MLP) --------------------------------------------------
E4M3, E5M2 = jnp.float8_e4m3fn, jnp.float8_e5m2


def _fp8_settings(y, b, **tiles):
    return fused_gelu.tile_settings(y, b, interpret=True, **tiles)


@pytest.mark.parametrize("tiles", [dict(block_rows=4, block_cols=128, sum_blocks=2),
                                   dict(block_rows=8, block_cols=64, sum_blocks=1)])
def test_float8_outputs_are_the_quantized_values_with_their_maxima(tiles):
    """forward_fp8 writes gelu(y + b) / scale in e4m3 and backward_fp8 dy / scale in e5m2, each
    equal to quantizing the float32 values (saturated at the format's maximum, never NaN), with
    the exact absolute maximum of the unquantized values; the bias gradient is the float32 sum
    of the unquantized dy."""
    y, b, g = _inputs((2, 32, 256))
    out, dy, db = _reference_vjp(y, b, g)
    s = _fp8_settings(y, b, **tiles)

    def quantize(v, scale, dtype):
        limit = float(jnp.finfo(dtype).max)
        return jnp.clip(v / scale, -limit, limit).astype(dtype)

    # a scale that fits the maximum, and one 4x too small (the largest values saturate)
    for fit in (1.0, 0.25):
        scale = fit * float(jnp.abs(out).max()) / 448.0
        q, amax = jax.jit(lambda y, b, sc: fused_gelu.forward_fp8(y, b, sc, E4M3, s))(
            y, b, scale)
        assert q.dtype == E4M3 and q.shape == y.shape
        np.testing.assert_allclose(amax, jnp.abs(out).max(), rtol=1e-6)
        want = quantize(out, scale, E4M3).astype(jnp.float32)
        got = q.astype(jnp.float32)
        assert not jnp.isnan(got).any()
        assert float(jnp.mean(got == want)) > 0.99  # rounding ties of float32 vs ulp apart
        # at most one float8 step apart (e4m3: 1/8 of the value, 2^-9 below the normal range;
        # e5m2: 1/4, 2^-16), or as far as the kernel's own erf (absolute error ~1e-7, module
        # docstring) moves a tiny value
        np.testing.assert_allclose(got, want, rtol=0.126, atol=2.0 ** -9 + 1e-6 / scale)
        assert float(jnp.abs(got).max()) == (448.0 if fit < 1 else float(jnp.abs(want).max()))

        gscale = fit * float(jnp.abs(dy).max()) / 57344.0
        dq, dbias, gmax = jax.jit(
            lambda g, y, b, sc: fused_gelu.backward_fp8(g, y, b, sc, E5M2, s))(g, y, b, gscale)
        assert dq.dtype == E5M2 and dq.shape == y.shape and dbias.dtype == jnp.float32
        np.testing.assert_allclose(gmax, jnp.abs(dy).max(), rtol=1e-6)
        _close(dbias, db, 1e-5, "db")
        got, want = dq.astype(jnp.float32), quantize(dy, gscale, E5M2).astype(jnp.float32)
        assert not jnp.isnan(got).any() and float(jnp.mean(got == want)) > 0.99
        np.testing.assert_allclose(got, want, rtol=0.251, atol=2.0 ** -16 + 1e-6 / gscale)


@pytest.mark.parametrize("tiles", [dict(), dict(block_rows=16, block_cols=64, sum_blocks=2)])
def test_float8_transposed_copies_hold_the_same_values(tiles):
    """With ``transposed`` each kernel also writes its float8 output as [width, rows] (the
    default tiles of the transposing kernels, and smaller ones looping over row blocks): the
    same values as the row-major output, bit for bit, and the same maxima and bias sums."""
    y, b, g = _inputs((2, 64, 256))
    s = fused_gelu.tile_settings(y, b, interpret=True, transposed=True, **tiles)
    assert s.block_rows >= 16

    def flat_t(a):
        return np.asarray(a, np.float32).reshape(-1, a.shape[-1]).T

    q, amax = fused_gelu.forward_fp8(y, b, 0.01, E4M3, s)
    q2, qt, amax2 = fused_gelu.forward_fp8(y, b, 0.01, E4M3, s, transposed=True)
    assert qt.dtype == E4M3 and qt.shape == (256, 128)
    np.testing.assert_array_equal(np.asarray(q2, np.float32), np.asarray(q, np.float32))
    np.testing.assert_array_equal(np.asarray(qt, np.float32), flat_t(q))
    assert float(amax2) == float(amax)
    dq, db, gmax = fused_gelu.backward_fp8(g, y, b, 1e-3, E5M2, s)
    dq2, dqt, db2, gmax2 = fused_gelu.backward_fp8(g, y, b, 1e-3, E5M2, s, transposed=True)
    assert dqt.dtype == E5M2 and dqt.shape == (256, 128)
    np.testing.assert_array_equal(np.asarray(dq2, np.float32), np.asarray(dq, np.float32))
    np.testing.assert_array_equal(np.asarray(dqt, np.float32), flat_t(dq))
    np.testing.assert_array_equal(db2, db)
    assert float(gmax2) == float(gmax)


def test_float8_outputs_per_shard_under_a_mesh_match_one_device():
    """Under a 2-device data mesh the float8 kernels run per batch shard: the same float8
    values, maxima over both shards and summed bias gradients as one device."""
    if jax.device_count() < 2:
        pytest.skip("needs 2 devices (XLA_FLAGS=--xla_force_host_platform_device_count)")
    from bert_jax import parallel

    y, b, g = _inputs((4, 16, 128))
    one = _fp8_settings(y[:2], b, block_rows=4, sum_blocks=2)  # the tiles of one shard

    def both(y, b, g, s=one):
        return (fused_gelu.forward_fp8(y, b, 0.01, E4M3, s),
                fused_gelu.backward_fp8(g, y, b, 1e-5, E5M2, s),
                fused_gelu.forward_fp8(y, b, 0.01, E4M3, s, transposed=True),
                fused_gelu.backward_fp8(g, y, b, 1e-5, E5M2, s, transposed=True))

    want = jax.jit(both)(y, b, g)
    mesh = parallel.create_mesh({"data": 2, "fsdp": 1, "tensor": 1}, None, jax.devices()[:2])
    fn = functools.partial(both, s=dataclasses.replace(
        one, shards=RowShards(mesh, ("data", "fsdp"))))
    got = jax.jit(fn)(y, b, g)
    text = jax.jit(fn).lower(y, b, g).as_text()
    assert text.count("manual_computation") + text.count("shard_map") >= 4  # fwd + bwd, x2
    for a, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(w, np.float32),
                                   rtol=1e-6, atol=1e-6)


def test_float8_kernels_lower_to_triton():
    """The float8 variants lower for CUDA too (Triton's float8 casts, one [1, 1] maximum per
    program), the backward with its loop over row blocks."""
    sd = jax.ShapeDtypeStruct
    y = sd((8, 128, 3072), jnp.bfloat16)
    b = sd((3072,), jnp.bfloat16)
    s = fused_gelu.tile_settings(y, b, sum_blocks=4, interpret=False)

    t = fused_gelu.tile_settings(y, b, interpret=False, transposed=True)

    def both(y, b):
        q, amax = fused_gelu.forward_fp8(y, b, 0.01, E4M3, s)
        dq, dbias, gmax = fused_gelu.backward_fp8(y, y, b, 1e-6, E5M2, s)
        transposed = (fused_gelu.forward_fp8(y, b, 0.01, E4M3, t, transposed=True),
                      fused_gelu.backward_fp8(y, y, b, 1e-6, E5M2, t, transposed=True))
        return q, amax, dq, dbias, gmax, transposed

    text = cuda_lowering_text(both, y, b)
    assert text.count("xla.gpu.triton") == 4
    for name in ("forward_fp8", "backward_fp8", "forward_fp8_t", "backward_fp8_t"):
        assert f'"bert_bias_gelu_{name}' in text, name
