"""The fused MLM decoder + softmax cross-entropy (``bert_jax/kernels/fused_xent.py``, Pallas
interpret mode on the CPU): values and gradients against the optax path, the accuracy count
bit for bit, per-shard runs under a mesh, the Triton lowering for the GPU, and the
``BertConfig.fused_mlm_loss`` choice through the pretraining loss."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from triton_lowering import cuda_lowering_text

from bert_jax.config import BertConfig, KernelOptions
from bert_jax.kernels import fused_xent
from bert_jax.kernels.sharding import WHOLE, RowShards
from bert_jax.modeling import heads


def _inputs(lead=(2, 6), embed=32, vocab=256, real=250, dtype=jnp.float32, seed=0):
    """Decoder operands with the last ``vocab - real`` entries as padding (bias NEG_INF),
    labels among the real entries and per-prediction loss weights."""
    k = jax.random.split(jax.random.key(seed), 5)
    h = jax.random.normal(k[0], (*lead, embed)).astype(dtype)
    table = (0.5 * jax.random.normal(k[1], (vocab, embed))).astype(dtype)
    bias = heads.masked_bias(jax.random.normal(k[2], (vocab,)), real)
    ids = jax.random.randint(k[3], lead, 0, real)
    weights = jax.random.uniform(k[4], lead)
    return h, table, bias, ids, weights


def _loss_and_grads(fn, h, table, bias, ids, weights):
    def loss(h, table, bias):
        nll, correct = fn(h, table, bias, ids)
        return jnp.sum(nll * weights), (nll, correct)

    return jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))(h, table, bias)


def _close(got, want, tol, name):
    scale = max(float(jnp.abs(want.astype(jnp.float32)).max()), 1.0)
    err = float(jnp.abs(got.astype(jnp.float32) - want.astype(jnp.float32)).max())
    assert err <= tol * scale, f"{name}: max error {err:.3g} > {tol} x {scale:.3g}"


@pytest.mark.parametrize("lead,vocab,block_rows,block_cols,sum_blocks", [
    ((2, 6), 256, None, None, None),  # defaults: 12 rows -> row blocks of 4, 2 tiles of 128
    ((2, 6), 256, 4, 64, 3),          # 4 column tiles, 3 row blocks per backward program
    ((4, 8), 384, 8, 128, 2),         # 3 column tiles (a vocabulary not a power of two)
    ((16,), 96, 2, 32, 8),            # 1-D predictions [rows, embed]
])
def test_values_and_gradients_match_the_optax_path(lead, vocab, block_rows, block_cols,
                                                   sum_blocks):
    """nll, correct and the gradients of h, table and bias (the bias gradient from the
    kernel's partial column sums) equal optax's cross-entropy over the masked logits."""
    h, table, bias, ids, weights = _inputs(lead, vocab=vocab, real=vocab - 6)

    def fused(*a):
        return fused_xent.decode_cross_entropy(*a, block_rows=block_rows,
                                               block_cols=block_cols, sum_blocks=sum_blocks)

    (got, (nll, correct)), grads = _loss_and_grads(fused, h, table, bias, ids, weights)
    (want, (nll_w, correct_w)), grads_w = _loss_and_grads(fused_xent.reference, h, table, bias,
                                                          ids, weights)
    _close(got, want, 1e-6, "loss")
    _close(nll, nll_w, 1e-6, "nll")
    np.testing.assert_array_equal(correct, correct_w)
    for name, a, w in zip(("dh", "dtable", "dbias"), grads, grads_w, strict=True):
        assert a.shape == w.shape and a.dtype == w.dtype, name
        _close(a, w, 2e-6, name)
    assert float(jnp.abs(grads[2][vocab - 6:]).max()) == 0.0  # padding: no gradient


def test_accuracy_counts_ties_and_finds_the_maximum():
    """correct = 1 exactly where the label's logit is the row maximum, ties included: a
    table with duplicated rows makes two logits equal."""
    h, table, bias, ids, _ = _inputs((3, 4), vocab=128, real=128)
    table = table.at[7].set(table[3])
    bias = bias.at[7].set(bias[3]).at[3].add(0.0)
    z = jnp.einsum("...e,ve->...v", h, table) + bias
    top = jnp.argmax(z, axis=-1)
    ids = ids.at[0, 0].set(top[0, 0]).at[1, :].set(top[1, :])
    ids = ids.at[2, 0].set(3)  # rows where 3 and 7 tie at the max count as correct for either
    _, correct = fused_xent.decode_cross_entropy(h, table, bias, ids)
    _, want = fused_xent.reference(h, table, bias, ids)
    np.testing.assert_array_equal(correct, want)
    assert float(correct[0, 0]) == 1.0 and float(correct[1].sum()) == 4.0


def test_bfloat16_operands_give_a_bfloat16_logit_gradient():
    """bf16 h and table (training's compute dtype): the logits and the loss stay float32, the
    gradients come back in bf16 (the kernel writes dz in bf16 for the two decoder matmuls)
    and match the optax path's within bf16 rounding."""
    h, table, bias, ids, weights = _inputs((4, 8), vocab=256, real=250, dtype=jnp.bfloat16)
    (got, (nll, _)), grads = _loss_and_grads(fused_xent.decode_cross_entropy, h, table, bias,
                                             ids, weights)
    (want, (nll_w, _)), grads_w = _loss_and_grads(fused_xent.reference, h, table, bias, ids,
                                                  weights)
    assert nll.dtype == jnp.float32
    _close(nll, nll_w, 1e-6, "nll")
    assert grads[0].dtype == grads[1].dtype == jnp.bfloat16 and grads[2].dtype == jnp.float32
    for name, a, w in zip(("dh", "dtable", "dbias"), grads, grads_w, strict=True):
        _close(a, w, 2e-2, name)


def test_large_logits_stay_finite():
    """Logits far from zero (a saturated row and a tile of padding): the per-tile maxima keep
    every exp in range; nll and gradients are finite and match the optax path."""
    h, table, bias, ids, weights = _inputs((2, 4), vocab=128, real=100)
    h = h * 30.0
    (_, (nll, _)), grads = _loss_and_grads(
        lambda *a: fused_xent.decode_cross_entropy(*a, block_cols=32), h, table, bias, ids,
        weights)
    (_, (nll_w, _)), grads_w = _loss_and_grads(fused_xent.reference, h, table, bias, ids,
                                               weights)
    assert bool(jnp.isfinite(nll).all()) and float(jnp.abs(nll).max()) > 50.0
    _close(nll, nll_w, 1e-6, "nll")
    for name, a, w in zip(("dh", "dtable", "dbias"), grads, grads_w, strict=True):
        _close(a, w, 1e-5, name)


def test_default_blocks_group_row_blocks_for_long_inputs():
    """BERT's Base/128 shape (256 x 20 predictions, 30,592 entries): 128-column tiles (239 of
    them) and enough row blocks per backward program for 32 row groups."""
    assert fused_xent.blocks_for(5120) == (16, 128, 4, 10)
    assert fused_xent.blocks_for(64) == (16, 128, 4, 1)


def test_per_shard_under_a_mesh_matches_one_device():
    """Under a 2-device data mesh the kernels run per batch shard (shard_map); values and
    gradients (the bias-gradient partials of both shards summed) equal the one-device run."""
    if jax.device_count() < 2:
        pytest.skip("needs 2 devices (XLA_FLAGS=--xla_force_host_platform_device_count)")
    from bert_jax import parallel

    h, table, bias, ids, weights = _inputs((4, 6), vocab=128, real=120)

    def loss(h, table, bias, shards=WHOLE):
        nll, correct = fused_xent.decode_cross_entropy(h, table, bias, ids, block_rows=4,
                                                       sum_blocks=2, shards=shards)
        return jnp.sum(nll * weights) + jnp.sum(correct)

    want = jax.value_and_grad(loss, (0, 1, 2))(h, table, bias)
    mesh = parallel.create_mesh({"data": 2, "fsdp": 1, "tensor": 1}, None, jax.devices()[:2])
    shards = RowShards(mesh, ("data", "fsdp"))
    fn = jax.value_and_grad(functools.partial(loss, shards=shards), (0, 1, 2))
    got = jax.jit(fn)(h, table, bias)
    text = jax.jit(fn).lower(h, table, bias).as_text()
    assert text.count("manual_computation") + text.count("shard_map") >= 2  # fwd + bwd
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-6, atol=2e-6)


def test_split_vocab_axis_is_refused_and_auto_falls_back(monkeypatch):
    """Tensor parallelism splits the vocabulary (rule vocab -> tensor): the kernel call names
    the logical axis; fused_mlm_loss="auto" uses XLA's path there instead."""
    if jax.device_count() < 2:
        pytest.skip("needs 2 devices")
    from bert_jax import parallel
    from bert_jax.modeling import placement

    h, table, bias, ids, _ = _inputs((2, 4), vocab=128, real=128)
    mesh = parallel.create_mesh({"data": 1, "fsdp": 1, "tensor": 2}, None, jax.devices()[:2])
    fn = parallel.traced_in_mesh(
        lambda *args: fused_xent.decode_cross_entropy(*args, shards=placement.xent_shards()),
        mesh, parallel.DEFAULT_RULES)
    with pytest.raises(ValueError, match="logical axis 'vocab'.*tensor"):
        jax.jit(fn)(h, table, bias, ids)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")  # auto's GPU check

    def routed(h, table, bias, ids):
        decoder = heads.MLMDecoder(h, table, bias)
        return heads.mlm_cross_entropy({"mlm_decoder": decoder,
                                        "mlm_logits": jnp.einsum("...e,ve->...v", h, table)
                                        + bias}, ids,
                                       BertConfig(kernels=KernelOptions(fused_mlm_loss="auto")))

    text = str(jax.make_jaxpr(parallel.traced_in_mesh(routed, mesh, parallel.DEFAULT_RULES))(
        h, table, bias, ids))
    assert "pallas_call" not in text


@pytest.mark.parametrize("lead,vocab,sum_blocks", [
    ((256, 20), 30592, 10),  # Base/128 at batch 256: 239 column tiles of 128
    ((32, 76), 30592, 4),    # Large/512 at batch 32: 2,432 rows
    ((2, 3), 128, 1),        # 6 rows: row blocks of 2
])
def test_triton_lowering_for_the_gpu(lead, vocab, sum_blocks):
    """The kernels lower to Triton for CUDA from this CPU machine, forward and backward."""
    sd = jax.ShapeDtypeStruct

    def loss(h, table, bias, ids):
        nll, _ = fused_xent.decode_cross_entropy(h, table, bias, ids, sum_blocks=sum_blocks,
                                                 interpret=False)
        return jnp.sum(nll)

    text = cuda_lowering_text(jax.grad(loss, (0, 1, 2)), sd((*lead, 64), jnp.bfloat16),
                              sd((vocab, 64), jnp.bfloat16), sd((vocab,), jnp.float32),
                              sd(lead, jnp.int32))
    assert text.count("xla.gpu.triton") == 2
    assert "bert_mlm_xent_forward" in text and "bert_mlm_xent_backward" in text


def test_bad_input_is_named():
    h, table, bias, ids, _ = _inputs((2, 4), vocab=128, real=128)
    with pytest.raises(ValueError, match=r"divisible by 16; got 120"):
        fused_xent.decode_cross_entropy(h, table[:120], bias[:120], ids)
    with pytest.raises(ValueError, match=r"bias \[vocab\] = \(128,\).*got bias \(64,\)"):
        fused_xent.decode_cross_entropy(h, table, bias[:64], ids)
    with pytest.raises(ValueError, match=r"ids of h's leading shape \(2, 4\).*ids \(2, 3\)"):
        fused_xent.decode_cross_entropy(h, table, bias, ids[:, :3])
    with pytest.raises(ValueError, match=r"same embed; got h \(2, 4, 32\), table \(128, 16\)"):
        fused_xent.decode_cross_entropy(h, table[:, :16], bias, ids)
    assert fused_xent.supported(30592) and not fused_xent.supported(30522)


def test_pretraining_loss_through_the_kernels_matches_xla():
    """A tiny BertForPreTraining (vocabulary 120 padded to 128): loss_sums and the parameter
    gradients with fused_mlm_loss="force" (the kernels) equal the XLA path's ("off"),
    padded predictions (weight 0) included; the forced trace holds both kernels."""
    from bert_jax import modeling
    from bert_jax.config import get_preset
    from bert_jax.training import steps

    cfg = get_preset("tiny", vocab_size=120)
    assert cfg.padded_vocab_size % 16 == 0 and cfg.padded_vocab_size > cfg.vocab_size
    model = modeling.BertForPreTraining(cfg)
    k = jax.random.split(jax.random.key(0), 3)
    ids = jax.random.randint(k[0], (2, 16), 5, 120)
    batch = {"input_ids": ids, "input_mask": jnp.ones_like(ids), "segment_ids": jnp.zeros_like(ids),
             "masked_lm_positions": jnp.tile(jnp.arange(1, 5)[None], (2, 1)),
             "masked_lm_ids": jax.random.randint(k[1], (2, 4), 0, 120),
             "masked_lm_weights": jnp.array([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]]),
             "next_sentence_labels": jnp.array([0, 1])}
    params = jax.jit(model.init)(k[2], ids, batch["input_mask"])["params"]

    def loss_of(fused):
        config = cfg.with_kernels(fused_mlm_loss=fused)

        def loss(p):
            sums = steps.loss_sums(steps._apply(model, p, batch), batch, True, config)
            return sums["mlm_loss_sum"] + sums["nsp_loss_sum"], sums
        return loss

    assert "bert_mlm_xent" not in str(jax.make_jaxpr(loss_of("off"))(params))
    want = jax.jit(jax.value_and_grad(loss_of("off"), has_aux=True))(params)
    text = str(jax.make_jaxpr(jax.grad(lambda p: loss_of("force")(p)[0]))(params))
    assert "bert_mlm_xent_forward" in text and "bert_mlm_xent_backward" in text
    got = jax.jit(jax.value_and_grad(loss_of("force"), has_aux=True))(params)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        _close(g, w, 1e-5, "pretraining")
