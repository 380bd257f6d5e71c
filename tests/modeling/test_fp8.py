"""FP8 matmuls (``BertConfig.fp8``, ``modeling/fp8.py``): the scaled products, the maxima as the
scales' "gradient", the delayed-scaling state, the encoder's layers in float8, and fp8=false
unchanged.
XLA on CPU emulates the float8 dots."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from training.helpers import random_variables

from bert_jax import modeling
from bert_jax.config import BertConfig, KernelOptions, get_preset
from bert_jax.errors import BertJaxError
from bert_jax.modeling import fp8
from bert_jax.modeling.fp8 import FP8_COLLECTION, SCALES, fp8_matmul

E4M3_MAX, E5M2_MAX = 448.0, 57344.0


def _scales(**values):
    return {name: jnp.asarray(values.get(name, 1.0), jnp.float32) for name in SCALES}


def test_scaled_products_and_the_maxima_as_the_scales_gradient():
    x = jax.random.normal(jax.random.key(0), (2, 8, 32), jnp.float32) * 3.0
    kernel = jax.random.normal(jax.random.key(1), (32, 16), jnp.float32) * 0.05
    g = jax.random.normal(jax.random.key(2), (2, 8, 16), jnp.float32) * 1e-4
    sx, sk, sg = 4.0 / E4M3_MAX, 0.2 / E4M3_MAX, 5e-4 / E5M2_MAX
    meta = _scales(input_scale=sx, kernel_scale=sk, output_grad_scale=sg)
    y, pullback = jax.vjp(lambda a, b, m: fp8_matmul(a, b, m, 1), x, kernel, meta)
    dx, dk, amaxes = pullback(g)
    np.testing.assert_allclose(amaxes["input_scale"], jnp.max(jnp.abs(x)), rtol=1e-6)
    np.testing.assert_allclose(amaxes["kernel_scale"], jnp.max(jnp.abs(kernel)), rtol=1e-6)
    np.testing.assert_allclose(amaxes["output_grad_scale"], jnp.max(jnp.abs(g)), rtol=1e-6)

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

    # Scales from the maxima just recorded: close to the exact products (float8: 3 and 2
    # mantissa bits), where the first step saturated x.
    def rel(a, b):
        return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))

    assert rel(y, x @ kernel) > 0.1
    state = fp8.next_state(fp8.initial_state({"m": meta}, 4), {"m": amaxes})["scale"]["m"]
    y, pullback = jax.vjp(lambda a, b: fp8_matmul(a, b, state, 1), x, kernel)
    dx, dk = pullback(g)
    assert rel(y, x @ kernel) < 0.05
    assert rel(dx, g @ kernel.T) < 0.1
    assert rel(dk, jnp.einsum("bsi,bso->io", x, g)) < 0.1


def test_the_state_keeps_one_history_row_per_tensor():
    # two matmuls: one plain, one scanned over 2 layers -> 3 + 6 tensors
    collection = {"a": _scales(), "b": {k: jnp.ones((2,)) for k in SCALES}}
    state = fp8.initial_state(collection, 3)
    assert state["amax_history"].shape == (9, 3) and not state["amax_history"].any()
    step = jax.jit(fp8.next_state)
    state = step(state, {"a": _scales(input_scale=2.0, kernel_scale=0.0,
                                      output_grad_scale=1e-3),
                         "b": {k: jnp.asarray([4.0, 8.0]) for k in SCALES}})
    a, b = state["scale"]["a"], state["scale"]["b"]
    np.testing.assert_allclose(a["input_scale"], 2.0 / E4M3_MAX, rtol=1e-6)
    assert float(a["kernel_scale"]) == 1.0  # nothing recorded yet: the previous scale
    np.testing.assert_allclose(a["output_grad_scale"], 1e-3 / E5M2_MAX, rtol=1e-6)
    np.testing.assert_allclose(b["input_scale"], [4.0 / E4M3_MAX, 8.0 / E4M3_MAX], rtol=1e-6)
    np.testing.assert_allclose(b["output_grad_scale"], [4.0 / E5M2_MAX, 8.0 / E5M2_MAX],
                               rtol=1e-6)
    # newest in front; the scale follows the largest maximum of the window, a non-finite
    # one ignored, and the oldest entry dropped
    for amax in (0.5, float("inf"), 0.25):
        state = step(state, {"a": _scales(input_scale=amax, kernel_scale=amax,
                                          output_grad_scale=amax),
                             "b": {k: jnp.asarray([amax, amax]) for k in SCALES}})
    np.testing.assert_allclose(state["amax_history"][0], [0.25, np.inf, 0.5], rtol=1e-6)
    np.testing.assert_allclose(state["scale"]["a"]["input_scale"], 0.5 / E4M3_MAX, rtol=1e-6)
    np.testing.assert_allclose(state["scale"]["b"]["input_scale"], [0.5 / E4M3_MAX] * 2,
                               rtol=1e-6)


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
    variables = random_variables(model, ids, mask, std=0.02)
    state = variables[FP8_COLLECTION]
    layers = cfg.num_hidden_layers
    names = ({"layers"} if scan_layers else {f"layer_{i}" for i in range(layers)})
    assert set(state["bert"]["encoder"]) == names  # the embeddings and heads stay bfloat16
    for path, leaf in jax.tree_util.tree_leaves_with_path(state):
        assert leaf.shape == ((layers,) if scan_layers else ()), jax.tree_util.keystr(path)
        assert jax.tree_util.keystr(path).endswith(tuple(f"'{k}']" for k in SCALES))
    # 4 projections per layer: query/key/value, attention output, MLP in and out
    forward = jax.make_jaxpr(lambda v: model.apply(v, ids, mask))(variables)
    assert _float8_dots(forward.jaxpr) == 4 * (1 if scan_layers else layers)
    train = jax.make_jaxpr(jax.grad(lambda v: jnp.sum(
        model.apply(v, ids, mask)["mlm_logits"].astype(jnp.float32))))(variables)
    assert _float8_dots(train.jaxpr) == 3 * 4 * (1 if scan_layers else layers)

    # Scales from a history of earlier steps (here: one step's maxima, recorded by a
    # gradient): then the outputs follow the bfloat16 model's.
    _, amaxes = jax.jit(jax.grad(lambda p, s: jnp.sum(model.apply(
        {"params": p, FP8_COLLECTION: s}, ids, mask)["mlm_logits"].astype(jnp.float32)),
        argnums=(0, 1)))(variables["params"], state)
    scales = fp8.next_state(fp8.initial_state(state, 8), amaxes)["scale"]
    fp8_out = jax.jit(model.apply)({"params": variables["params"], FP8_COLLECTION: scales},
                                   ids, mask)["mlm_logits"].astype(jnp.float32)
    plain = jax.jit(modeling.BertForPreTraining(cfg.replace(fp8=False)).apply)(
        {"params": variables["params"]}, ids, mask)["mlm_logits"].astype(jnp.float32)
    rel = float(jnp.linalg.norm(fp8_out - plain) / jnp.linalg.norm(plain))
    assert 0.0 < rel < 0.1, rel


def _assert_step_close(got, want, amax_rtol):
    """Two (loss, (parameter gradients, scale maxima)) results: the loss within 1%, each
    gradient within 5% (relative norm), each maximum within ``amax_rtol``."""
    def rel(a, b):
        a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
        norm = float(jnp.linalg.norm(b))  # 0: a parameter outside the MLM loss (the pooler)
        return float(jnp.linalg.norm(a - b) / norm) if norm else float(jnp.abs(a).max())

    assert rel(got[0], want[0]) < 0.01
    for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got[1][0]),
                            jax.tree.leaves(want[1][0]), strict=True):
        assert rel(g, w) < 0.05, jax.tree_util.keystr(path)
    for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got[1][1]),
                            jax.tree.leaves(want[1][1]), strict=True):
        np.testing.assert_allclose(g, w, rtol=amax_rtol, err_msg=jax.tree_util.keystr(path))


def _step(m, ids, mask):
    """(loss, (parameter gradients, scale maxima)) of ``m``: the sum of squared MLM logits."""
    return jax.value_and_grad(lambda p, s: jnp.sum(m.apply(
        {"params": p, FP8_COLLECTION: s}, ids, mask)["mlm_logits"].astype(jnp.float32) ** 2),
        argnums=(0, 1))


def _steps_at_recorded_scales(model, reference, variables, ids, mask):
    """``model``'s and ``reference``'s steps at the scales one reference step recorded (a
    history of 4), the reference compiled once for both of its steps: (got, want)."""
    step_reference = jax.jit(_step(reference, ids, mask))
    _, (_, amaxes) = step_reference(variables["params"], variables[FP8_COLLECTION])
    scales = fp8.next_state(fp8.initial_state(variables[FP8_COLLECTION], 4), amaxes)["scale"]
    return (jax.jit(_step(model, ids, mask))(variables["params"], scales),
            step_reference(variables["params"], scales))


def test_gelu_kernels_write_the_mlp_activation_in_fp8():
    """With the fused LayerNorm and GELU kernels (interpret mode here), ``fp8_gelu_quantize``
    routes each MLP through ``fp8_gelu_mlp``: the GELU kernels write the activation and its
    gradient in float8, the parameters and scales are the same variables, and outputs,
    gradients and recorded maxima follow the path where XLA quantizes the kernels' bf16
    outputs (float8 roundings of float32 instead of bfloat16 values may differ by a step)."""
    kernels = dict(fp8=True, fp8_amax_history=4, hidden_dropout_prob=0.0,
                   attention_probs_dropout_prob=0.0,
                   kernels=KernelOptions(layer_norm_impl="fused", fused_gelu="force",
                                         fp8_cast_kernel=False))  # the cast kernel: own test
    model, cfg, ids, mask = _model_and_batch(**kernels)
    xla = modeling.BertForPreTraining(cfg.with_kernels(fp8_gelu_quantize=False))
    variables = random_variables(model, ids, mask, std=0.02)
    assert (jax.tree.structure(variables)
            == jax.tree.structure(random_variables(xla, ids, mask, std=0.02)))

    args = (variables["params"], variables[FP8_COLLECTION])
    text = str(jax.make_jaxpr(_step(model, ids, mask))(*args))
    assert text.count("name=bert_bias_gelu_forward_fp8") == cfg.num_hidden_layers
    assert text.count("name=bert_bias_gelu_backward_fp8") == cfg.num_hidden_layers
    assert "name=bert_bias_gelu_forward_fp8" not in str(
        jax.make_jaxpr(_step(xla, ids, mask))(*args))

    _assert_step_close(*_steps_at_recorded_scales(model, xla, variables, ids, mask),
                       amax_rtol=0.02)


def test_transposed_float8_copies_give_the_same_step():
    """``fp8_gelu_transpose`` (the GELU kernels also writing the float8 activation and its
    gradient transposed for the weight-gradient GEMMs) computes the same outputs, gradients
    and maxima as XLA transposing the kernels' float8 outputs: the same float8 values in
    another layout."""
    kernels = dict(fp8=True, fp8_amax_history=4, hidden_dropout_prob=0.0,
                   attention_probs_dropout_prob=0.0,
                   kernels=KernelOptions(layer_norm_impl="fused", fused_gelu="force",
                                         fp8_cast_kernel=False))
    model, cfg, ids, mask = _model_and_batch(**kernels)
    assert cfg.kernels.fp8_gelu_transpose is True
    plain = modeling.BertForPreTraining(cfg.with_kernels(fp8_gelu_transpose=False))
    variables = random_variables(model, ids, mask, std=0.02)

    args = (variables["params"], variables[FP8_COLLECTION])
    on = str(jax.make_jaxpr(_step(model, ids, mask))(*args))
    off = str(jax.make_jaxpr(_step(plain, ids, mask))(*args))
    for name in ("name=bert_bias_gelu_forward_fp8_t", "name=bert_bias_gelu_backward_fp8_t"):
        assert on.count(name) == cfg.num_hidden_layers and name not in off
    got, want = _steps_at_recorded_scales(model, plain, variables, ids, mask)
    for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got),
                            jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32),
                                   rtol=2e-5, atol=1e-6, err_msg=jax.tree_util.keystr(path))


def test_cast_kernel_quantizes_every_fp8_matmul():
    """With the fused LayerNorm kernels, ``fp8_cast_kernel`` quantizes each FP8 matmul's input
    and output gradient with ``kernels/fp8_cast.py`` (query/key/value, attention output and
    the MLP: six casts a layer, no XLA transposes for the weight gradients): the same maxima,
    and outputs and gradients as XLA's casts (which scale in bfloat16, the kernel in float32:
    a value may land one float8 step apart)."""
    kernels = dict(fp8=True, fp8_amax_history=4, hidden_dropout_prob=0.0,
                   attention_probs_dropout_prob=0.0,
                   kernels=KernelOptions(layer_norm_impl="fused", fused_gelu="force"))
    model, cfg, ids, mask = _model_and_batch(**kernels)
    assert cfg.kernels.fp8_cast_kernel is True
    xla = modeling.BertForPreTraining(cfg.with_kernels(fp8_cast_kernel=False))
    variables = random_variables(model, ids, mask, std=0.02)

    args = (variables["params"], variables[FP8_COLLECTION])
    assert str(jax.make_jaxpr(_step(model, ids, mask))(*args)).count(
        "name=bert_fp8_cast_transposed") == 6 * cfg.num_hidden_layers
    assert "bert_fp8_cast_transposed" not in str(jax.make_jaxpr(_step(xla, ids, mask))(*args))
    got, want = _steps_at_recorded_scales(model, xla, variables, ids, mask)

    # maxima: the first matmul's input exactly; later tensors follow the float8 values
    # before them
    def first(tree):
        return tree["bert"]["encoder"]["layer_0"]["attention"]["qkv"]

    assert float(first(got[1][1])["input_scale"]) == float(first(want[1][1])["input_scale"])
    assert float(first(got[1][1])["kernel_scale"]) == float(first(want[1][1])["kernel_scale"])
    _assert_step_close(got, want, amax_rtol=0.05)


def test_without_the_scaling_state_the_model_computes_in_its_dtype():
    model, cfg, ids, mask = _model_and_batch(fp8=True)
    params = random_variables(model, ids, mask, std=0.02)["params"]
    jaxpr = jax.make_jaxpr(lambda p: model.apply({"params": p}, ids, mask))(params)
    assert _float8_dots(jaxpr.jaxpr) == 0
    plain = modeling.BertForPreTraining(cfg.replace(fp8=False))
    assert str(jaxpr) == str(jax.make_jaxpr(lambda p: plain.apply({"params": p}, ids, mask))(
        params))


def test_fp8_off_has_no_scaling_state_and_no_float8():
    model, _, ids, mask = _model_and_batch()
    variables = random_variables(model, ids, mask, std=0.02)
    assert set(variables) == {"params"}
    grad = jax.make_jaxpr(jax.grad(lambda v: jnp.sum(
        model.apply(v, ids, mask)["mlm_logits"].astype(jnp.float32))))(variables)
    assert _float8_dots(grad.jaxpr) == 0
    assert "f8" not in str(grad)


def test_config_fields():
    assert (BertConfig().fp8, BertConfig().fp8_amax_history) == (False, 1024)
    options = BertConfig().kernels
    assert options.fp8_gelu_quantize is True and options.fp8_gelu_transpose is True
    with pytest.raises(BertJaxError, match="BertConfig.kernels.fp8_gelu_quantize"):
        KernelOptions(fp8_gelu_quantize="no")
    with pytest.raises(BertJaxError, match="BertConfig.kernels.fp8_gelu_transpose"):
        KernelOptions(fp8_gelu_transpose=1)
    assert options.fp8_cast_kernel is True
    with pytest.raises(BertJaxError, match="BertConfig.kernels.fp8_cast_kernel"):
        KernelOptions(fp8_cast_kernel="yes")
    with pytest.raises(BertJaxError, match="fp8_amax_history"):
        BertConfig(fp8=True, fp8_amax_history=0)
    with pytest.raises(BertJaxError, match="BertConfig.fp8: .*share_layers"):
        BertConfig(fp8=True, share_layers=True)
    with pytest.raises(BertJaxError, match="BertConfig.fp8"):
        BertConfig(fp8="yes")
