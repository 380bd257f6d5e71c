"""FP8 matmuls (``BertConfig.fp8``, ``modeling/fp8.py``): the delayed-scaling arithmetic, the
new scaling state as the "gradient", the encoder's layers in float8, and fp8=false unchanged.
XLA on CPU emulates the float8 dots."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import modeling
from bert_jax.config import BertConfig, get_preset
from bert_jax.errors import BertJaxError
from bert_jax.modeling.fp8 import FP8_COLLECTION, fp8_matmul

E4M3_MAX, E5M2_MAX = 448.0, 57344.0


def _meta(history=4, **values):
    meta = {f"{t}_{k}": (jnp.ones(()) if k == "scale" else jnp.zeros((history,)))
            for t in ("input", "kernel", "output_grad") for k in ("scale", "amax_history")}
    meta.update({k: jnp.asarray(v, jnp.float32) for k, v in values.items()})
    return meta


def test_scales_come_from_the_history_and_the_new_state_is_the_gradient():
    x = jax.random.normal(jax.random.key(0), (2, 8, 32), jnp.float32) * 3.0
    kernel = jax.random.normal(jax.random.key(1), (32, 16), jnp.float32) * 0.05
    g = jax.random.normal(jax.random.key(2), (2, 8, 16), jnp.float32) * 1e-4
    meta = _meta(input_amax_history=[0.0, 4.0, 2.0, 0.0],
                 kernel_amax_history=[0.2, 0.0, 0.0, 0.0],
                 output_grad_amax_history=[5e-4, 0.0, 0.0, 0.0])
    y, pullback = jax.vjp(lambda a, b, m: fp8_matmul(a, b, m, 1), x, kernel, meta)
    dx, dk, new = pullback(g)

    sx, sk, sg = 4.0 / E4M3_MAX, 0.2 / E4M3_MAX, 5e-4 / E5M2_MAX
    np.testing.assert_allclose(new["input_scale"], sx, rtol=1e-6)
    np.testing.assert_allclose(new["kernel_scale"], sk, rtol=1e-6)
    np.testing.assert_allclose(new["output_grad_scale"], sg, rtol=1e-6)
    # newest maximum in front, the oldest entry dropped
    np.testing.assert_allclose(new["input_amax_history"],
                               [float(jnp.max(jnp.abs(x))), 0.0, 4.0, 2.0], rtol=1e-6)
    np.testing.assert_allclose(new["kernel_amax_history"][:2],
                               [float(jnp.max(jnp.abs(kernel))), 0.2], rtol=1e-6)
    np.testing.assert_allclose(new["output_grad_amax_history"][0], float(jnp.max(jnp.abs(g))),
                               rtol=1e-6)

    # The same products from explicitly quantized operands (values beyond the scale's range
    # saturate).
    def q(a, s, dtype):
        limit = float(jnp.finfo(dtype).max)
        return jnp.clip(a / s, -limit, limit).astype(dtype).astype(jnp.float32) * s

    qx, qk = q(x, sx, jnp.float8_e4m3fn), q(kernel, sk, jnp.float8_e4m3fn)
    qg = q(g, sg, jnp.float8_e5m2)
    np.testing.assert_allclose(y, qx @ qk, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dx, qg @ qk.T, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(dk, jnp.einsum("bsi,bso->io", qx, qg), rtol=1e-5, atol=1e-9)
    # The next step scales by the maxima just recorded: close to the exact products
    # (float8: 3 and 2 mantissa bits), where the first step saturated x.
    def rel(a, b):
        return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))

    assert rel(y, x @ kernel) > 0.1
    y, pullback = jax.vjp(lambda a, b: fp8_matmul(a, b, new, 1), x, kernel)
    dx, dk = pullback(g)
    assert rel(y, x @ kernel) < 0.05
    assert rel(dx, g @ kernel.T) < 0.1
    assert rel(dk, jnp.einsum("bsi,bso->io", x, g)) < 0.1


def test_an_empty_history_keeps_the_previous_scale():
    x = jnp.full((4, 8), 2.0)
    kernel = jnp.full((8, 8), 0.5)
    new = jax.vjp(lambda m: fp8_matmul(x, kernel, m, 1),
                  _meta(input_scale=0.25, kernel_scale=2.0))[1](jnp.ones((4, 8)))[0]
    assert float(new["input_scale"]) == 0.25 and float(new["kernel_scale"]) == 2.0
    assert float(new["input_amax_history"][0]) == 2.0


def _model_and_batch(**overrides):
    cfg = get_preset("tiny", vocab_size=128, hidden_size=32, intermediate_size=64,
                     max_position_embeddings=16, dtype="bfloat16", **overrides)
    ids = jax.random.randint(jax.random.key(0), (2, 16), 5, 128)
    mask = jnp.ones_like(ids).at[0, 12:].set(0)
    return modeling.BertForPreTraining(cfg), cfg, ids, mask


def _float8_dots(jaxpr) -> int:
    """dot_generals with float8 operands, inside nested jaxprs too."""
    count, eqns = 0, list(jaxpr.eqns)
    while eqns:
        eqn = eqns.pop()
        if eqn.primitive.name == "dot_general":
            count += all(v.aval.dtype in (jnp.float8_e4m3fn, jnp.float8_e5m2)
                         for v in eqn.invars)
        for value in eqn.params.values():
            for inner in value if isinstance(value, tuple | list) else (value,):
                inner = getattr(inner, "jaxpr", inner)
                if hasattr(inner, "eqns"):
                    eqns.extend(inner.eqns)
    return count


@pytest.mark.parametrize("scan_layers", [False, True])
def test_encoder_layers_run_in_fp8_close_to_bfloat16(scan_layers):
    model, cfg, ids, mask = _model_and_batch(fp8=True, fp8_amax_history=8,
                                             scan_layers=scan_layers)
    variables = jax.jit(model.init)(jax.random.key(1), ids, mask)
    state = variables[FP8_COLLECTION]
    layers = cfg.num_hidden_layers
    names = ({"layers"} if scan_layers else {f"layer_{i}" for i in range(layers)})
    assert set(state["bert"]["encoder"]) == names  # the embeddings and heads stay bfloat16
    shape = (layers, 8) if scan_layers else (8,)
    for path, leaf in jax.tree_util.tree_leaves_with_path(state):
        expect = shape if "history" in jax.tree_util.keystr(path) else shape[:-1]
        assert leaf.shape == expect, jax.tree_util.keystr(path)
    # 4 projections per layer: query/key/value, attention output, MLP in and out
    forward = jax.make_jaxpr(lambda v: model.apply(v, ids, mask))(variables)
    assert _float8_dots(forward.jaxpr) == 4 * (1 if scan_layers else layers)
    train = jax.make_jaxpr(jax.grad(lambda v: jnp.sum(
        model.apply(v, ids, mask)["mlm_logits"].astype(jnp.float32))))(variables)
    assert _float8_dots(train.jaxpr) == 3 * 4 * (1 if scan_layers else layers)

    # Scales from a history of earlier steps (here: one step's maxima, recorded by a
    # gradient): then the outputs follow the bfloat16 model's.
    _, new_state = jax.jit(jax.grad(lambda p, s: jnp.sum(model.apply(
        {"params": p, FP8_COLLECTION: s}, ids, mask)["mlm_logits"].astype(jnp.float32)),
        argnums=(0, 1)))(variables["params"], state)
    fp8_out = jax.jit(model.apply)({"params": variables["params"], FP8_COLLECTION: new_state},
                                   ids, mask)["mlm_logits"].astype(jnp.float32)
    plain = jax.jit(modeling.BertForPreTraining(cfg.replace(fp8=False)).apply)(
        {"params": variables["params"]}, ids, mask)["mlm_logits"].astype(jnp.float32)
    rel = float(jnp.linalg.norm(fp8_out - plain) / jnp.linalg.norm(plain))
    assert 0.0 < rel < 0.1, rel


def test_without_the_scaling_state_the_model_computes_in_its_dtype():
    model, cfg, ids, mask = _model_and_batch(fp8=True)
    params = jax.jit(model.init)(jax.random.key(1), ids, mask)["params"]
    jaxpr = jax.make_jaxpr(lambda p: model.apply({"params": p}, ids, mask))(params)
    assert _float8_dots(jaxpr.jaxpr) == 0
    plain = modeling.BertForPreTraining(cfg.replace(fp8=False))
    assert str(jaxpr) == str(jax.make_jaxpr(lambda p: plain.apply({"params": p}, ids, mask))(
        params))


def test_fp8_off_has_no_scaling_state_and_no_float8():
    model, _, ids, mask = _model_and_batch()
    variables = model.init(jax.random.key(1), ids, mask)
    assert set(variables) == {"params"}
    grad = jax.make_jaxpr(jax.grad(lambda v: jnp.sum(
        model.apply(v, ids, mask)["mlm_logits"].astype(jnp.float32))))(variables)
    assert _float8_dots(grad.jaxpr) == 0
    assert "f8" not in str(grad)


def test_config_fields():
    assert (BertConfig().fp8, BertConfig().fp8_amax_history) == (False, 1024)
    with pytest.raises(BertJaxError, match="fp8_amax_history"):
        BertConfig(fp8=True, fp8_amax_history=0)
    with pytest.raises(BertJaxError, match="BertConfig.fp8: .*share_layers"):
        BertConfig(fp8=True, share_layers=True)
    with pytest.raises(BertJaxError, match="BertConfig.fp8"):
        BertConfig(fp8="yes")
