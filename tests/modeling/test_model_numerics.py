"""Numerical properties of the Flax model: parameter counts of the presets, scan == unrolled,
remat == no remat, bfloat16 close to float32, jitted forward/backward, optional outputs,
vocabulary padding, and config validation / JSON round trips."""

from __future__ import annotations

import functools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from float_sums import assert_same_sums

from bert_jax import modeling
from bert_jax.config import BertConfig, get_preset
from bert_jax.errors import BertJaxError
from bert_jax.modeling.params import flatten_params, to_layout

# The functools.cache'd inits, outputs and gradients below serve many tests: one xdist worker
# runs the file, so each is computed once.
pytestmark = pytest.mark.xdist_group("model_numerics")

TINY = BertConfig(vocab_size=101, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=48, max_position_embeddings=16, hidden_dropout_prob=0.1,
                  attention_probs_dropout_prob=0.1)


def _batch(config, batch=3, seq_len=10, seed=0):
    rng = np.random.default_rng(seed)
    lengths = np.array([seq_len, 6, 2, 8][:batch])
    pos = np.arange(seq_len)[None]
    mask = (pos < lengths[:, None]).astype(np.int32)
    ids = rng.integers(5, config.vocab_size, (batch, seq_len)).astype(np.int32) * mask
    segments = ((pos >= (lengths // 2)[:, None]) * mask).astype(np.int32)
    return jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(segments)


def _init(config, module=None, seed=0):
    """Random params in the model's tree (shapes from jax.eval_shape: eager flax init is
    slow on CPU); LayerNorm scales near 1, everything else small noise."""
    module = module or modeling.BertForPreTraining(config)
    shapes = nn.unbox(jax.eval_shape(module.init, jax.random.key(0), *_batch(config)))["params"]
    rng = np.random.default_rng(seed)

    def fill(path, x):
        base = 1.0 if jax.tree_util.keystr(path).endswith("['scale']") else 0.0
        return jnp.asarray(base + rng.normal(0, 0.05, x.shape), jnp.float32)

    return jax.tree_util.tree_map_with_path(fill, shapes)


def _count(config: BertConfig) -> int:
    """Encoder + pooler parameters (as published), without the vocabulary padding rows."""
    shapes = jax.eval_shape(modeling.BertModel(config.replace(scan_layers=True)).init,
                            jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
    total = sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(nn.unbox(shapes)))
    return total - (config.padded_vocab_size - config.vocab_size) * config.embedding_dim


@pytest.mark.parametrize("preset,published", [("base", 110e6), ("large", 340e6),
                                              ("albert_base", 12e6)])
def test_preset_parameter_counts(preset, published):
    count = _count(get_preset(preset))
    assert abs(count - published) / published < 0.03, count


def _diff(a, b):
    return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(
        jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True))


def _pretraining_loss(cfg):
    """A loss of every output of TINY's BertForPreTraining on _batch(TINY): pooled output,
    NSP and (the real vocabulary's) MLM logits."""
    def loss(p):
        out = modeling.BertForPreTraining(cfg).apply({"params": p}, *_batch(TINY))
        return (jnp.sum(out["pooled_output"] ** 2) + jnp.sum(out["nsp_logits"])
                + jnp.mean(out["mlm_logits"][..., :cfg.vocab_size] ** 2))
    return loss


@functools.cache
def _value_and_grads(scan_layers: bool):
    """The loss and gradients of _init(TINY) (in the scan layout if ``scan_layers``) without
    remat, computed once for the scan and the remat tests."""
    cfg = TINY.replace(scan_layers=scan_layers)
    return jax.jit(jax.value_and_grad(_pretraining_loss(cfg)))(to_layout(_init(TINY), cfg))


def test_scan_and_unrolled_agree_forward_and_backward():
    params = _init(TINY)
    scan_cfg = TINY.replace(scan_layers=True)
    scan_params = to_layout(params, scan_cfg)
    assert scan_params["bert"]["encoder"]["layers"]["mlp_in"]["kernel"].shape == (2, 32, 48)
    inputs = _batch(TINY)

    def run(cfg, p):
        return jax.jit(lambda p: modeling.BertForPreTraining(cfg).apply(
            {"params": p}, *inputs, output_hidden_states=True, output_attentions=True))(p)

    a, b = run(TINY, params), run(scan_cfg, scan_params)
    for key in ("sequence_output", "pooled_output", "mlm_logits", "nsp_logits",
                "hidden_states", "attentions"):
        assert _diff(a[key], b[key]) <= 1e-5, key

    (v_unrolled, g_unrolled), (v_scan, g_scan) = _value_and_grads(False), _value_and_grads(True)
    assert abs(float(v_unrolled) - float(v_scan)) <= 1e-5
    assert _diff(to_layout(g_scan, TINY), g_unrolled) <= 1e-5


@pytest.mark.parametrize("policy,scan_layers", [("full", False), ("dots", True)])
def test_remat_matches_no_remat(policy, scan_layers):
    base = TINY.replace(scan_layers=scan_layers)
    params = to_layout(_init(TINY), base)
    value, grads = _value_and_grads(scan_layers)
    value_r, grads_r = jax.jit(jax.value_and_grad(_pretraining_loss(
        base.replace(remat_policy=policy))))(params)
    assert abs(float(value) - float(value_r)) <= 1e-6
    assert _diff(grads, grads_r) <= 1e-6


@functools.cache
def _tiny_sequence_output(**fields):
    """TINY's BertModel (with ``fields`` replaced) on _batch(TINY), the parameters of
    _init(TINY): its sequence output, computed once per variant."""
    params = {"params": _init(TINY)["bert"]}
    model = modeling.BertModel(TINY.replace(**fields))
    return jax.jit(lambda p: model.apply(p, *_batch(TINY))["sequence_output"])(params)


def test_float32_residual_stream():
    """residual_dtype=float32 with bf16 compute: LayerNorm outputs and the residual sums stay
    float32 (as under torch autocast), so the output is closer to the float32 model than the
    all-bf16 one; with float32 compute the option changes nothing."""
    params = {"params": _init(TINY)["bert"]}
    inputs = _batch(TINY)
    valid = np.asarray(inputs[1], bool)
    seq = _tiny_sequence_output

    f32 = np.asarray(seq())
    mixed = seq(dtype="bfloat16", residual_dtype="float32")
    assert mixed.dtype == jnp.float32
    err_mixed = np.abs(np.asarray(mixed) - f32)[valid].max()
    err_bf16 = np.abs(np.asarray(seq(dtype="bfloat16"), np.float32) - f32)[valid].max()
    assert err_mixed < 0.5 * err_bf16
    np.testing.assert_array_equal(np.asarray(seq(residual_dtype="float32")), f32)
    grads = jax.jit(jax.grad(lambda p: jnp.mean(modeling.BertModel(
        TINY.replace(dtype="bfloat16", residual_dtype="float32")).apply(
            p, *inputs)["sequence_output"] ** 2)))(params)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))


def test_bfloat16_compute_close_to_float32():
    inputs = _batch(TINY)
    f32 = {"sequence_output": _tiny_sequence_output()}
    bf16 = {"sequence_output": _tiny_sequence_output(dtype="bfloat16")}
    assert bf16["sequence_output"].dtype == jnp.bfloat16
    valid = np.asarray(inputs[1], bool)
    diff = np.abs(np.asarray(bf16["sequence_output"], np.float32)
                  - np.asarray(f32["sequence_output"]))[valid]  # [real tokens, hidden]
    assert diff.mean() < 0.02 and diff.max() < 0.15
    # Parameters stay float32 whatever the compute dtype.
    bf16_params = _init(TINY.replace(dtype="bfloat16"))
    assert {x.dtype for x in jax.tree_util.tree_leaves(bf16_params)} == {jnp.dtype("float32")}


def test_jitted_training_steps_with_dropout_reduce_the_loss():
    config = TINY.replace(scan_layers=True)
    params = _init(config)
    ids, mask, segments = _batch(config)
    positions = jnp.array([[1, 4], [0, 3], [1, 1]])
    labels = jnp.take_along_axis(ids, positions, axis=1)
    model = modeling.BertForPreTraining(config)

    @jax.jit
    def step(p, rng):
        def loss(p):
            out = model.apply({"params": p}, ids, mask, segments, positions,
                              deterministic=False, rngs={"dropout": rng})
            logp = jax.nn.log_softmax(out["mlm_logits"])
            mlm = -jnp.mean(jnp.take_along_axis(logp, labels[..., None], -1))
            nsp = -jnp.mean(jax.nn.log_softmax(out["nsp_logits"])[:, 0])
            return mlm + nsp
        value, grads = jax.value_and_grad(loss)(p)
        return jax.tree_util.tree_map(lambda w, g: w - 0.5 * g, p, grads), value, grads

    losses = []
    for i in range(8):
        params, value, grads = step(params, jax.random.key(i))
        losses.append(float(value))
        assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree_util.tree_leaves(grads))
    flat = flatten_params(grads)
    assert float(jnp.abs(flat["bert/encoder/layers/attention/qkv/kernel"]).sum()) > 0
    assert losses[-1] < losses[0], losses


@pytest.mark.parametrize("scan_layers", [False, True])
def test_hidden_states_and_attention_probabilities(scan_layers):
    config = TINY.replace(scan_layers=scan_layers)
    params = to_layout(_init(TINY), config)
    ids, mask, segments = _batch(config)
    apply = jax.jit(modeling.BertModel(config).apply,
                    static_argnames=("output_hidden_states", "output_attentions"))
    out = apply({"params": params["bert"]}, ids, mask, segments, output_hidden_states=True,
                output_attentions=True)
    b, s = ids.shape
    assert len(out["hidden_states"]) == config.num_hidden_layers + 1
    assert all(h.shape == (b, s, config.hidden_size) for h in out["hidden_states"])
    assert _diff(out["hidden_states"][-1], out["sequence_output"]) == 0.0
    assert len(out["attentions"]) == config.num_hidden_layers
    key_valid = np.asarray(mask, bool)[:, None, None, :]
    for probs in out["attentions"]:
        probs = np.asarray(probs)
        assert probs.shape == (b, config.num_attention_heads, s, s)
        np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
        assert np.all(np.where(key_valid, 0.0, probs) == 0.0)  # no weight on padding
    default = apply({"params": params["bert"]}, ids, mask, segments)
    assert default["hidden_states"] is None and default["attentions"] is None
    assert _diff(default["sequence_output"], out["sequence_output"]) <= 1e-5


def test_padded_vocabulary_never_wins():
    params = _init(TINY)
    v, padded = TINY.vocab_size, TINY.padded_vocab_size
    assert padded == 128
    # Adversarial padding rows: huge embeddings and biases must still never be predicted.
    table = params["bert"]["embeddings"]["word_embeddings"]["embedding"]
    params["bert"]["embeddings"]["word_embeddings"]["embedding"] = table.at[v:].set(50.0)
    params["mlm"]["bias"] = params["mlm"]["bias"].at[v:].set(1e6)
    out = jax.jit(modeling.BertForPreTraining(TINY).apply)({"params": params}, *_batch(TINY))
    logits = np.asarray(out["mlm_logits"])
    assert logits.shape[-1] == padded
    assert np.all(logits[..., v:] <= -1e8)
    assert np.all(logits.argmax(-1) < v)
    probs = jax.nn.softmax(out["mlm_logits"])
    assert float(probs[..., v:].max()) == 0.0


def test_config_validation_messages():
    with pytest.raises(BertJaxError, match="hidden_size.*768 is not divisible by "
                                           "num_attention_heads=5"):
        BertConfig(num_attention_heads=5)
    with pytest.raises(BertJaxError, match="remat_policy"):
        TINY.replace(remat_policy="some")
    with pytest.raises(BertJaxError, match=r"unknown BertConfig field\(s\) \['hidden'\]"):
        TINY.replace(hidden=3)


@pytest.mark.parametrize("flavor", ["hf", "google", "bert_jax"])
def test_config_json_round_trip(tmp_path, flavor):
    config = TINY.replace(hidden_act="gelu_new", layer_norm_eps=1e-6, type_vocab_size=3)
    path = tmp_path / "config.json"
    config.save_json(path, flavor=flavor)
    back = BertConfig.from_json_file(path)
    arch_keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                 "intermediate_size", "hidden_act", "max_position_embeddings",
                 "type_vocab_size", "hidden_dropout_prob", "attention_probs_dropout_prob")
    for key in arch_keys:
        assert getattr(back, key) == getattr(config, key), key
    if flavor == "bert_jax":
        assert back == config
    if flavor == "hf":
        transformers = pytest.importorskip("transformers")
        hf = transformers.BertConfig.from_json_file(path)
        assert hf.hidden_size == 32 and hf.layer_norm_eps == 1e-6
        assert back.layer_norm_eps == 1e-6
    if flavor == "google":
        assert json.loads(path.read_text()).keys() >= {"vocab_size", "hidden_act"}


@pytest.mark.parametrize("shape", [(2, 128, 3, 8), (3, 5, 8), (512, 16)])
def test_bias_gradient_two_stage_column_sum(shape):
    """add_bias's custom VJP (two-stage float32 column sum when there are two or more
    leading axes, one stage otherwise) gives autodiff's bias gradient, in the bias's dtype."""
    from bert_jax.modeling.ops import add_bias

    bias_shape = shape[2:] if len(shape) == 4 else shape[-1:]
    y = jax.random.normal(jax.random.key(0), shape)
    b = jax.random.normal(jax.random.key(1), bias_shape)
    probe = jax.random.normal(jax.random.key(2), shape)
    want = jax.grad(lambda y, b: jnp.sum((y + b) * probe), (0, 1))(y, b)
    got = jax.jit(jax.grad(lambda y, b: jnp.sum(add_bias(y, b) * probe), (0, 1)))(y, b)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)
    low = jax.grad(lambda b: jnp.sum(add_bias(y.astype(jnp.bfloat16), b)))(
        b.astype(jnp.bfloat16))
    assert low.dtype == jnp.bfloat16


@pytest.mark.parametrize("name", ["gelu", "gelu_new", "relu", "tanh"])
def test_bias_activation_vjp_matches_autodiff(name):
    """add_bias_activate keeps only the matmul output and recomputes the derivative: same
    values and gradients as autodiff of activation(y + bias)."""
    from bert_jax.modeling.ops import activation, add_bias_activate

    y = jax.random.normal(jax.random.key(0), (4, 64, 48))
    b = jax.random.normal(jax.random.key(1), (48,))
    probe = jax.random.normal(jax.random.key(2), y.shape)

    def plain(y, b):
        return jnp.sum(activation(name)(y + b) * probe)

    def fused(y, b):
        return jnp.sum(add_bias_activate(y, b, name) * probe)

    np.testing.assert_allclose(fused(y, b), plain(y, b), rtol=1e-6)
    for got, want in zip(jax.jit(jax.grad(fused, (0, 1)))(y, b), jax.grad(plain, (0, 1))(y, b),
                         strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_gelu_erf_matches_the_definition():
    """gelu_erf is x * Phi(x) (float64 math.erf as reference) with the derivative
    Phi(x) + x * phi(x), and lowers to erf, not to XLA's far costlier erfc expansion."""
    import math

    from bert_jax.kernels.reference import gelu_erf
    from bert_jax.modeling.ops import activation

    assert activation("gelu") is gelu_erf
    x = np.linspace(-9.0, 9.0, 20001)
    phi_cdf = np.array([0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x])
    want = x * phi_cdf
    want_grad = phi_cdf + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    xf = jnp.asarray(x, jnp.float32)
    np.testing.assert_allclose(gelu_erf(xf), want, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(jax.vmap(jax.grad(gelu_erf))(xf), want_grad, rtol=2e-6,
                               atol=2e-6)
    low = gelu_erf(xf.astype(jnp.bfloat16))
    assert low.dtype == jnp.bfloat16
    np.testing.assert_allclose(low.astype(jnp.float32), want, rtol=8e-3, atol=1e-2)
    text = jax.jit(jax.grad(lambda v: jnp.sum(gelu_erf(v)))).lower(xf).as_text()
    assert "erf" in text and "erfc" not in text


def test_decoder_vjp():
    """The tied decoder's logit gradient: exact in float32; in bfloat16 the logit gradient is
    rounded to bfloat16 before the matmuls (relative error ~2**-8)."""
    from bert_jax.kernels.reference import decode

    h = jax.random.normal(jax.random.key(0), (2, 5, 32))
    table = jax.random.normal(jax.random.key(1), (300, 32))
    probe = jax.random.normal(jax.random.key(2), (2, 5, 300))

    def loss(fn, h, t):
        return jnp.sum(fn(h, t) * probe)

    def plain(h, t):
        return jnp.einsum("...e,ve->...v", h, t, preferred_element_type=jnp.float32)

    want = jax.grad(functools.partial(loss, plain), (0, 1))(h, table)
    got = jax.grad(functools.partial(loss, decode), (0, 1))(h, table)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    low = jax.grad(functools.partial(loss, decode), (0, 1))(h.astype(jnp.bfloat16),
                                                           table.astype(jnp.bfloat16))
    for a, b in zip(low, want, strict=True):
        assert a.dtype == jnp.bfloat16
        assert float(jnp.abs(a.astype(jnp.float32) - b).max()) < 0.05 * float(jnp.abs(b).max())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_two_stage_layer_norm_matches_flax(dtype):
    """layer_norm_impl=two_stage: nn.LayerNorm's parameters, forward values and gradients
    (its backward is written out, with two-stage float32 parameter-gradient sums)."""
    from bert_jax.modeling.encoder import layer_norm

    cfg = get_preset("tiny", dtype=dtype)
    x = (3.0 * jax.random.normal(jax.random.key(0), (4, 128, cfg.hidden_size)) + 1.0
         ).astype(dtype)
    probe = jax.random.normal(jax.random.key(1), x.shape)
    flax_ln = layer_norm(cfg.with_kernels(layer_norm_impl="flax"), "norm")
    ours = layer_norm(cfg.with_kernels(layer_norm_impl="two_stage"), "norm")
    params = flax_ln.init(jax.random.key(2), x)
    params = jax.tree.map(lambda p: p + 0.1 * jax.random.normal(jax.random.key(3), p.shape),
                          params)
    assert jax.tree.structure(ours.init(jax.random.key(2), x)) == jax.tree.structure(params)

    def loss(module, p, x):
        return jnp.sum(module.apply(p, x).astype(jnp.float32) * probe)

    want_y, got_y = flax_ln.apply(params, x), ours.apply(params, x)
    assert got_y.dtype == want_y.dtype
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == "float32" else dict(rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(np.asarray(got_y, np.float32), np.asarray(want_y, np.float32),
                               **tol)
    want = jax.jit(jax.grad(functools.partial(loss, flax_ln), (0, 1)))(params, x)
    got = jax.jit(jax.grad(functools.partial(loss, ours), (0, 1)))(params, x)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        scale = float(jnp.abs(b.astype(jnp.float32)).max())
        err = float(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)).max())
        assert err <= (1e-4 if dtype == "float32" else 2e-2) * scale


@pytest.mark.parametrize("field,value,reference", [("qkv_projection", "split", "fused"),
                                                    ("layer_norm_impl", "two_stage", "flax"),
                                                    ("layer_norm_impl", "fused", "flax")])
def test_runtime_variants_agree(field, value, reference):
    """Runtime variants with the same parameters: split query/key/value matmuls vs one fused
    matmul then slices; the two-stage LayerNorm backward and the fused bias + residual +
    LayerNorm kernel (Pallas, interpret mode here) vs nn.LayerNorm's autodiff. Same outputs
    and gradients."""
    # One layer: the variants differ alike in every layer.
    cfg = get_preset("tiny", vocab_size=300, num_hidden_layers=1)
    ids = jax.random.randint(jax.random.key(0), (2, 16), 5, 300)
    mask = jnp.ones((2, 16), jnp.int32)
    params = jax.jit(modeling.BertModel(cfg).init)(jax.random.key(1), ids, mask)

    def loss(p, choice):
        out = modeling.BertModel(cfg.with_kernels(**{field: choice})).apply(p, ids, mask)
        return jnp.mean(out["sequence_output"] ** 2)

    loss_and_grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)
    (value_loss, got), (reference_loss, want) = (loss_and_grad(params, value),
                                                 loss_and_grad(params, reference))
    assert abs(float(value_loss - reference_loss)) < 1e-6
    # Two float32 summation orders (tests/float_sums.py): per layer, sums over the 32 tokens
    # (parameter gradients) and over hidden (LayerNorm).
    summands = cfg.num_hidden_layers * (ids.size + cfg.hidden_size)
    got, want = jax.tree.leaves(got), jax.tree.leaves(want)
    # The key bias's gradient is zero up to rounding (softmax ignores a per-key constant): its
    # rounding scales with the terms of the sum, bounded here by the largest gradient anywhere.
    scale = max(float(jnp.max(jnp.abs(w))) for w in want)
    for a, b in zip(got, want, strict=True):
        assert_same_sums(a, b, summands, scale=scale)


def test_column_sum_dtype_and_stages():
    from bert_jax.modeling.ops import column_sum

    x = jax.random.normal(jax.random.key(0), (4, 8, 2, 3)).astype(jnp.bfloat16)
    for out_ndim in (1, 2, 3):
        got = column_sum(x, out_ndim)
        assert got.dtype == jnp.bfloat16 and got.shape == x.shape[4 - out_ndim:]
        want = x.astype(jnp.float32).sum(axis=tuple(range(4 - out_ndim)))
        np.testing.assert_allclose(got.astype(jnp.float32), want, rtol=1e-2, atol=1e-2)


def test_bias_activation_backward_is_recomputed_not_stored():
    """The optimization barrier in add_bias_activate's backward keeps XLA from merging the
    recomputation with the forward pass (CSE), which would store the GELU's derivative terms
    after all: the compiled train step needs less temporary memory than autodiff's (on the
    CPU here: 49 vs 65 MiB; without the barrier both are 65)."""
    from bert_jax.modeling.ops import activation, add_bias_activate

    x = jnp.ones((4096, 256), jnp.bfloat16)
    w1, w2 = jnp.full((256, 1024), 0.01, jnp.bfloat16), jnp.full((1024, 256), 0.01, jnp.bfloat16)
    b1 = jnp.zeros((1024,), jnp.bfloat16)

    def temp_bytes(fn):
        def loss(w1, b1, w2):
            return jnp.sum((fn(x @ w1, b1) @ w2).astype(jnp.float32) ** 2)
        compiled = jax.jit(jax.grad(loss, (0, 1, 2))).lower(w1, b1, w2).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    plain = temp_bytes(lambda h, b: activation("gelu")(h + b))
    fused = temp_bytes(lambda h, b: add_bias_activate(h, b, "gelu"))
    assert fused <= plain - 4096 * 1024 * 2  # at least one [tokens, 1024] bf16 array less


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_direct_weight_gradients(dtype):
    """``BertConfig.direct_weight_grads``: every projection's weight gradient is one
    dot_general in the kernel's [in..., out...] layout (JAX's rule computes [out..., in...]
    and transposes it); loss and all gradients are unchanged."""
    # One layer: every projection kind is in it.
    cfg = get_preset("tiny", vocab_size=128, dtype=dtype, num_hidden_layers=1)
    ids = jax.random.randint(jax.random.key(0), (2, 16), 5, 128)
    mask = jnp.ones_like(ids).at[0, 10:].set(0)
    params = jax.jit(modeling.BertForPreTraining(cfg).init)(jax.random.key(1), ids, mask)

    def loss_of(direct):
        model = modeling.BertForPreTraining(cfg.with_kernels(direct_weight_grads=direct))

        def loss(p):
            out = model.apply(p, ids, mask, deterministic=False,
                              rngs={"dropout": jax.random.key(3)})
            return jnp.sum(jnp.sin(out["mlm_logits"].astype(jnp.float32)))
        return loss

    kernels = {tuple(x.shape) for path, x in jax.tree_util.tree_leaves_with_path(params)
               if "kernel" in jax.tree_util.keystr(path) and x.ndim >= 2}

    def kernel_transposes(closed):
        eqns, count = list(closed.jaxpr.eqns), 0
        while eqns:
            eqn = eqns.pop()
            count += (eqn.primitive.name == "transpose"
                      and tuple(eqn.outvars[0].aval.shape) in kernels)
            for value in eqn.params.values():  # custom_vjp / pjit bodies
                inner = getattr(value, "jaxpr", None)
                if inner is not None:
                    eqns.extend(getattr(inner, "eqns", ()))
        return count

    results, transposes = [], []
    for direct in (False, True):
        results.append(jax.jit(jax.value_and_grad(loss_of(direct)))(params))
        transposes.append(kernel_transposes(jax.make_jaxpr(jax.grad(loss_of(direct)))(params)))
    (v0, g0), (v1, g1) = results
    if dtype == "float32":
        # Two float32 summation orders (tests/float_sums.py): per layer, the weight
        # gradients' sums over 32 tokens and the sums over hidden.
        np.testing.assert_allclose(v1, v0, rtol=1e-6)
        summands = cfg.num_hidden_layers * (ids.size + cfg.hidden_size)
        for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0), strict=True):
            assert_same_sums(a, b, summands)
    else:
        np.testing.assert_allclose(v1, v0, rtol=1e-2)
        for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0), strict=True):
            np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                       rtol=1e-2, atol=1e-4)
    assert transposes[1] < transposes[0], transposes
