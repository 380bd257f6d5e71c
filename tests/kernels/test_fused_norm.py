"""The fused bias + hidden dropout + residual add + LayerNorm kernel
(``bert_jax/kernels/fused_norm.py``, Pallas interpret mode on the CPU): values and gradients
against jax.numpy, the same mask as ``hash_dropout``, per-shard runs under a mesh, a train step
with ``kernels.layer_norm_impl=fused``, and the Triton lowering for the GPU."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_sums import assert_same_sums
from triton_lowering import cuda_lowering_text

from bert_jax.config import BertConfig, KernelOptions, get_preset
from bert_jax.errors import BertJaxError
from bert_jax.kernels import fused_norm
from bert_jax.kernels.dropout import hash_dropout, salt_from_rng
from bert_jax.kernels.sharding import WHOLE, RowShards


def _inputs(shape=(2, 16, 96), dtype=jnp.float32, seed=0):
    k = jax.random.split(jax.random.key(seed), 6)
    hidden = shape[-1]
    return (jax.random.normal(k[0], shape).astype(dtype),
            (2.0 * jax.random.normal(k[1], shape) + 0.5).astype(dtype),
            0.1 * jax.random.normal(k[2], (hidden,)),
            1.0 + 0.1 * jax.random.normal(k[3], (hidden,)),
            0.1 * jax.random.normal(k[4], (hidden,)),
            salt_from_rng(k[5]))


@functools.cache
def _outputs_and_grads(fn, rate, kwargs=()):
    """Jitted (out, gradients of sum(out * probe) for residual, y, b, gamma, beta) of ``fn``
    at ``rate``; one program per (fn, rate, kwargs), so the reference compiles once per rate
    for every kernel variant it is compared with."""
    def loss(r, y, b, gamma, beta, salt, probe):
        out = fn(r, y, b, gamma, beta, salt=salt, rate=rate, epsilon=1e-12, **dict(kwargs))
        return jnp.sum(out * probe), out

    def run(*args):
        (_, out), grads = jax.value_and_grad(loss, range(5), has_aux=True)(*args)
        return out, grads

    return jax.jit(run)


@pytest.mark.parametrize("rate,recompute,sum_blocks", [(0.0, True, 1), (0.1, True, 1),
                                                        (0.1, False, 1), (0.1, True, 4),
                                                        (0.1, False, 2)])
def test_values_and_gradients_match_jax(rate, recompute, sum_blocks):
    """Both backward variants (recomputed chunks, rows held in registers), with one or several
    row blocks per backward program (parameter-gradient sums carried across them), against
    jax.numpy."""
    r, y, b, gamma, beta, salt = _inputs()
    probe = jax.random.normal(jax.random.key(9), r.shape)
    args = (r, y, b, gamma, beta, salt, probe)
    got, grads = _outputs_and_grads(fused_norm.residual_dropout_layer_norm, rate,
                                    (("recompute", recompute), ("sum_blocks", sum_blocks)))(
        *args)
    want, wants = _outputs_and_grads(fused_norm.reference, rate)(*args)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for name, g, w in zip(("residual", "y", "b", "gamma", "beta"), grads, wants, strict=True):
        scale = float(jnp.abs(w).max())
        assert float(jnp.abs(g - w).max()) <= 1e-5 * max(scale, 1.0), name


@pytest.mark.parametrize("sum_blocks", [1, 2])
def test_split_output_adds_both_consumers_gradients(sum_blocks):
    """``split_output=True``: the same output twice, each handle used by its own consumer;
    the kernel sums the two gradients as it reads them. Values and every gradient equal the
    single-output kernel whose output feeds both consumers (XLA adds the gradients there),
    and the jax.numpy reference."""
    r, y, b, gamma, beta, salt = _inputs()
    p1 = jax.random.normal(jax.random.key(3), r.shape)
    p2 = jax.random.normal(jax.random.key(4), r.shape)

    def consumers(a, c):  # two different functions of the two handles
        return jnp.sum(a * p1) + jnp.sum(jnp.tanh(c) * p2)

    def split(*args):
        a, c = fused_norm.residual_dropout_layer_norm(*args, salt=salt, rate=0.1,
                                                      sum_blocks=sum_blocks, split_output=True)
        return consumers(a, c)

    def single(fn):
        def loss(*args):
            out = fn(*args, salt=salt, rate=0.1)
            return consumers(out, out)
        return loss

    args = (r, y, b, gamma, beta)
    a, c = fused_norm.residual_dropout_layer_norm(*args, salt=salt, rate=0.1,
                                                  split_output=True)
    assert a is c or bool(jnp.all(a == c))
    got = jax.jit(jax.value_and_grad(split, range(5)))(*args)
    for want in (jax.jit(jax.value_and_grad(single(fused_norm.residual_dropout_layer_norm),
                                            range(5)))(*args),
                 jax.jit(jax.value_and_grad(single(fused_norm.reference), range(5)))(*args)):
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
        for name, g, w in zip(("residual", "y", "b", "gamma", "beta"), got[1], want[1],
                              strict=True):
            scale = float(jnp.abs(w).max())
            assert float(jnp.abs(g - w).max()) <= 1e-5 * max(scale, 1.0), name
    # One of the two gradients wrong (the second handle's dropped) would show.
    one = jax.grad(lambda *x: jnp.sum(fused_norm.residual_dropout_layer_norm(
        *x, salt=salt, rate=0.1, split_output=True)[0] * p1), range(5))(*args)
    assert float(jnp.abs(one[0] - got[1][0]).max()) > 1e-3


def test_mask_is_hash_dropouts():
    """Same salt, same dropped elements as hash_dropout (rowcol) on the [batch, seq, hidden]
    array; a different salt drops different ones."""
    r, y, b, gamma, beta, salt = _inputs()
    rate = 0.3
    x = r + hash_dropout(y + b, salt, rate, "rowcol")
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    want = (x - mean) / jnp.sqrt(var + 1e-12) * gamma + beta
    got = fused_norm.residual_dropout_layer_norm(r, y, b, gamma, beta, salt=salt, rate=rate)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    other = fused_norm.residual_dropout_layer_norm(r, y, b, gamma, beta, salt=salt + 1,
                                                   rate=rate)
    assert float(jnp.abs(other - got).max()) > 0.1


def test_bfloat16_inputs_and_output_dtype():
    r, y, b, gamma, beta, salt = _inputs(dtype=jnp.bfloat16)
    out = fused_norm.residual_dropout_layer_norm(r, y, b, gamma, beta, salt=salt, rate=0.1)
    assert out.dtype == jnp.bfloat16
    f32 = fused_norm.residual_dropout_layer_norm(r, y, b, gamma, beta, salt=salt, rate=0.1,
                                                 out_dtype=jnp.float32)
    assert f32.dtype == jnp.float32
    np.testing.assert_allclose(out.astype(jnp.float32), f32, rtol=2e-2, atol=2e-2)
    grads = jax.grad(lambda r, y: jnp.sum(fused_norm.residual_dropout_layer_norm(
        r, y, b, gamma, beta, salt=salt, rate=0.1).astype(jnp.float32)), (0, 1))(r, y)
    assert [g.dtype for g in grads] == [jnp.bfloat16, jnp.bfloat16]


def test_bad_input_is_named():
    r, y, b, gamma, beta, salt = _inputs()
    with pytest.raises(ValueError, match="same .batch, seq, hidden. shape"):
        fused_norm.residual_dropout_layer_norm(r, y[:, :8], b, gamma, beta)
    with pytest.raises(ValueError, match="salt"):
        fused_norm.residual_dropout_layer_norm(r, y, b, gamma, beta, rate=0.1)
    with pytest.raises(BertJaxError, match="layer_norm_impl"):
        KernelOptions(layer_norm_impl="fused", hidden_dropout_impl="prng")


@pytest.mark.parametrize("sum_blocks,split", [(1, False), (2, True)])
def test_per_shard_under_a_mesh_matches_one_device(sum_blocks, split):
    """Under a 2-device data mesh the kernels run per batch shard (shard_map); values and
    gradients (parameter gradients summed over the shards) equal the one-device run, also
    with the output split into two handles (two upstream gradients per shard)."""
    if jax.device_count() < 2:
        pytest.skip("needs 2 devices (XLA_FLAGS=--xla_force_host_platform_device_count)")
    from bert_jax import parallel

    r, y, b, gamma, beta, salt = _inputs(shape=(4, 16, 64))

    def loss(r, y, b, gamma, beta, shards=WHOLE):
        out = fused_norm.residual_dropout_layer_norm(r, y, b, gamma, beta, salt=salt, rate=0.1,
                                                     sum_blocks=sum_blocks, split_output=split,
                                                     shards=shards)
        a, c = out if split else (out, out)
        return jnp.sum(a * jnp.cos(c))

    want = jax.value_and_grad(loss, range(5))(r, y, b, gamma, beta)
    mesh = parallel.create_mesh({"data": 2, "fsdp": 1, "tensor": 1}, None, jax.devices()[:2])
    shards = RowShards(mesh, ("data", "fsdp"))
    fn = jax.value_and_grad(functools.partial(loss, shards=shards), range(5))
    got = jax.jit(fn)(r, y, b, gamma, beta)
    text = jax.jit(fn).lower(r, y, b, gamma, beta).as_text()
    assert text.count("manual_computation") + text.count("shard_map") >= 2  # fwd + bwd
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)


def test_split_norm_grads_in_the_encoder():
    """``BertConfig.split_norm_grads``: every fused LayerNorm with two consumers returns two
    handles (within each layer, and between layers but after the last), so the gradient
    has 2 x layers - 1 fewer XLA sums (``add_any``) over [tokens, hidden]; loss and every
    parameter gradient are unchanged, also when the layers are rematerialized."""
    from bert_jax import modeling

    cfg = get_preset("tiny", vocab_size=128, kernels=KernelOptions(layer_norm_impl="fused"))
    ids = jax.random.randint(jax.random.key(0), (2, 16), 5, 128)
    mask = jnp.ones_like(ids).at[1, 12:].set(0)
    params = jax.jit(modeling.BertForPreTraining(cfg).init)(jax.random.key(1), ids, mask)

    def loss_of(split, remat="none"):
        model = modeling.BertForPreTraining(cfg.replace(remat_policy=remat).with_kernels(
            split_norm_grads=split))

        def loss(p):
            out = model.apply(p, ids, mask, deterministic=False,
                              rngs={"dropout": jax.random.key(2)})
            return jnp.sum(jnp.sin(out["mlm_logits"].astype(jnp.float32)))
        return loss

    def adds(jaxpr):
        count = 0
        for eqn in jaxpr.eqns:
            count += eqn.primitive.name == "add_any" and eqn.outvars[0].aval.shape[-1:] == (
                cfg.hidden_size,) and len(eqn.outvars[0].aval.shape) == 3
            for sub in jax.core.subjaxprs(eqn) if hasattr(jax.core, "subjaxprs") else ():
                count += adds(sub)
        return count

    results, counts = [], []
    for split, remat in ((False, "none"), (True, "none"), (True, "full")):
        # One trace per run: the add_any count read from the jaxpr that is compiled.
        traced = jax.jit(jax.value_and_grad(loss_of(split, remat))).trace(params)
        results.append(traced.lower().compile()(params))
        counts.append(adds(traced.jaxpr.jaxpr))
    v0, g0 = results[0]
    # The paths add the same two gradients at different points; what differs is the
    # rounding of the sums downstream: per layer, the parameter gradients' sums over the
    # tokens and LayerNorm's row sums over hidden.
    summands = cfg.num_hidden_layers * (ids.size + cfg.hidden_size)
    for v1, g1 in results[1:]:
        np.testing.assert_allclose(v1, v0, rtol=1e-6)
        for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0), strict=True):
            assert_same_sums(a, b, summands)
    assert counts[0] - counts[1] == 2 * cfg.num_hidden_layers - 1, counts


def test_train_step_with_fused_layer_norm_learns():
    """A tiny BertForPreTraining (one layer) with layer_norm_impl=fused: dropout active, loss
    falls."""
    import optax

    from bert_jax import modeling

    cfg = get_preset("tiny", vocab_size=128, num_hidden_layers=1,
                     kernels=KernelOptions(layer_norm_impl="fused"))
    model = modeling.BertForPreTraining(cfg)
    ids = jax.random.randint(jax.random.key(0), (4, 16), 5, 128)
    mask = jnp.ones_like(ids)
    positions = jnp.tile(jnp.arange(1, 4)[None], (4, 1))
    labels = jnp.take_along_axis(ids, positions, axis=1)
    params = jax.jit(model.init)(jax.random.key(1), ids, mask)
    tx = optax.adam(3e-3)
    opt = tx.init(params)

    def loss(p, rng):
        out = model.apply(p, ids, mask, masked_lm_positions=positions, deterministic=False,
                          rngs={"dropout": rng})
        logp = jax.nn.log_softmax(out["mlm_logits"].astype(jnp.float32))
        return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], -1))

    @jax.jit
    def step(p, o, rng):
        value, g = jax.value_and_grad(loss)(p, rng)
        updates, o = tx.update(g, o, p)
        return optax.apply_updates(p, updates), o, value

    losses = []
    for i in range(30):
        params, opt, value = step(params, opt, jax.random.key(100 + i))
        losses.append(float(value))
    assert np.isfinite(losses).all() and np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5])


@pytest.mark.parametrize("hidden,sum_blocks", [(384, 1), (768, 1), (1024, 1), (768, 4)])
def test_triton_lowering_for_the_gpu(hidden, sum_blocks):
    """The kernels lower to Triton for CUDA from this CPU machine (power-of-two chunks of the
    hidden units: 3 x 128, 3 x 256, 4 x 256), forward and backward, the backward also with a
    loop over row blocks."""
    sd = jax.ShapeDtypeStruct

    def loss(r, y, b, gamma, beta, salt):
        out = fused_norm.residual_dropout_layer_norm(r, y, b, gamma, beta, salt=salt, rate=0.1,
                                                     sum_blocks=sum_blocks, interpret=False)
        return jnp.sum(out.astype(jnp.float32))

    shape, vec = (8, 128, hidden), (hidden,)
    text = cuda_lowering_text(jax.grad(loss, range(5)), sd(shape, jnp.bfloat16),
                              sd(shape, jnp.bfloat16), sd(vec, jnp.float32),
                              sd(vec, jnp.float32), sd(vec, jnp.float32), sd((), jnp.int32))
    assert text.count("xla.gpu.triton") == 2


def test_config_tiles_reach_the_kernel():
    """BertConfig.norm_blocks sets the fused LayerNorm's row blocks in the model (32 tokens: 8
    programs of the default 4 rows, 4 of 8 rows)."""
    import re

    from bert_jax.modeling import BertModel

    cfg = get_preset("tiny", vocab_size=128, kernels=KernelOptions(layer_norm_impl="fused"))
    ids = jnp.ones((2, 16), jnp.int32)
    params = jax.jit(BertModel(cfg).init)(jax.random.key(0), ids)

    def grids(config):
        text = str(jax.make_jaxpr(lambda p: BertModel(config).apply(
            p, ids, deterministic=False, rngs={"dropout": jax.random.key(1)}))(params))
        return set(re.findall(r"grid=\(\d+,\)", text))

    assert grids(cfg) == {"grid=(8,)"}
    assert grids(cfg.with_kernels(norm_blocks=(8, 1, False), norm_sum_blocks=2)) == {"grid=(4,)"}


def test_auto_resolution(monkeypatch):
    """layer_norm_impl=auto: the fused kernel on GPU where it applies, two_stage elsewhere."""
    from bert_jax.modeling import encoder

    auto = BertConfig(kernels=KernelOptions(layer_norm_impl="auto"))
    assert encoder.use_fused_norm(BertConfig(kernels=KernelOptions(layer_norm_impl="fused")))
    assert not encoder.use_fused_norm(auto)  # CPU
    assert not encoder.use_fused_norm(BertConfig())  # two_stage
    monkeypatch.setattr(encoder.jax, "default_backend", lambda: "gpu")
    assert encoder.use_fused_norm(auto)
    assert not encoder.use_fused_norm(auto.with_kernels(hidden_dropout_impl="prng"))
    assert not encoder.use_fused_norm(auto.with_kernels(dropout_hash="flat"))
    assert not encoder.use_fused_norm(auto.replace(hidden_size=40, num_attention_heads=4))


def test_uneven_batch_under_a_mesh_falls_back_to_one_call():
    """A batch that does not split over the mesh (a ragged evaluation batch) runs the kernel
    once on the gathered arrays instead of failing."""
    if jax.device_count() < 2:
        pytest.skip("needs 2 devices")
    from bert_jax import parallel

    r, y, b, gamma, beta, _ = _inputs(shape=(3, 16, 64))
    mesh = parallel.create_mesh({"data": 2, "fsdp": 1, "tensor": 1}, None, jax.devices()[:2])
    shards = RowShards(mesh, ("data", "fsdp"))
    fn = functools.partial(fused_norm.residual_dropout_layer_norm, b=b, gamma=gamma, beta=beta,
                           shards=shards)
    np.testing.assert_allclose(jax.jit(fn)(r, y), fused_norm.reference(r, y, b, gamma, beta),
                               rtol=1e-5, atol=1e-5)


def test_few_rows_get_power_of_two_blocks():
    """Three rows (batch 1, sequence 3): blocks of one row, still the reference's values."""
    r, y, b, gamma, beta, salt = _inputs(shape=(1, 3, 64))
    got = fused_norm.residual_dropout_layer_norm(r, y, b, gamma, beta, salt=salt, rate=0.1)
    want = fused_norm.reference(r, y, b, gamma, beta, salt=salt, rate=0.1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
