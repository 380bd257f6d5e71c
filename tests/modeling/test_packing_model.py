"""Packed rows give each example the outputs, losses and gradients it gets unpacked:
sequence outputs at its tokens, pooled output, NSP and classification logits, MLM logits, on
the XLA and einsum attention paths, unrolled and scanned layers; and no packing inputs leave
the unpacked graph as it is."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

from bert_jax import modeling
from bert_jax.config import BertConfig
from bert_jax.data import packing
from bert_jax.modeling.heads import BertForSequenceClassification

pytestmark = pytest.mark.slow

SEQ = 16
TINY = BertConfig(vocab_size=101, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=48, max_position_embeddings=SEQ, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0)
LENGTHS = np.array([7, 3, 5, 9, 4, 2, 6])
K = 3


def _examples(seed=0):
    """Unpacked right-padded examples [N, SEQ] (a [CLS]-like first token, two segments)."""
    rng = np.random.default_rng(seed)
    pos = np.arange(SEQ)[None]
    mask = (pos < LENGTHS[:, None]).astype(np.int32)
    ids = rng.integers(5, TINY.vocab_size, (len(LENGTHS), SEQ)).astype(np.int32) * mask
    ids[:, 0] = 2
    segments = ((pos >= (LENGTHS // 2)[:, None]) * mask).astype(np.int32)
    # One masked position per example, inside the example.
    masked = (rng.integers(0, 1 << 30, len(LENGTHS)) % LENGTHS).astype(np.int32)
    labels = rng.integers(0, 2, len(LENGTHS)).astype(np.int32)
    return {"input_ids": ids, "input_mask": mask, "segment_ids": segments,
            "masked_lm_positions": masked, "labels": labels}


def _packed(feats):
    rows = packing.pack_lengths(LENGTHS, SEQ, K, seed=0)
    assert len(rows) < len(LENGTHS)  # some rows hold several examples
    packed = packing.pack_features(feats, rows, K, per_example_keys=("labels",))
    # An example's masked position moves with it: first column of its slot + its position.
    filled = packed["example_index"] >= 0
    pos = np.zeros(packed["example_index"].shape, np.int32)
    pos[filled] = (packed["cls_positions"][filled]
                   + feats["masked_lm_positions"][packed["example_index"][filled]])
    packed["masked_lm_positions"] = pos
    return packed


def _init(module, *args):
    shapes = nn.unbox(jax.eval_shape(module.init, jax.random.key(0), *args))["params"]
    rng = np.random.default_rng(1)

    def fill(path, x):
        base = 1.0 if jax.tree_util.keystr(path).endswith("['scale']") else 0.0
        return jnp.asarray(base + rng.normal(0, 0.2, x.shape), jnp.float32)

    return jax.tree_util.tree_map_with_path(fill, shapes)


def _packing_kwargs(packed):
    return {k: jnp.asarray(packed[k]) for k in ("example_ids", "position_ids",
                                                 "cls_positions")}


@pytest.mark.parametrize("scan,explicit", [(False, False), (True, True)])
def test_pretraining_outputs_losses_and_grads_match_unpacked(scan, explicit):
    config = TINY.replace(scan_layers=scan)
    model = modeling.BertForPreTraining(config)
    feats = _examples()
    packed = _packed(feats)
    unpacked_args = [jnp.asarray(feats[k]) for k in ("input_ids", "input_mask",
                                                     "segment_ids")]
    params = _init(model, *unpacked_args, jnp.asarray(feats["masked_lm_positions"])[:, None])

    def run(params, args, positions, **kw):
        return model.apply({"params": params}, *args, positions,
                           output_attentions=explicit, **kw)

    def unpacked_loss(params):
        out = run(params, unpacked_args, jnp.asarray(feats["masked_lm_positions"])[:, None])
        labels = jnp.asarray(feats["labels"])
        nsp = optax.softmax_cross_entropy_with_integer_labels(out["nsp_logits"], labels)
        mlm = jax.nn.logsumexp(out["mlm_logits"][:, 0], -1) - out["mlm_logits"][:, 0, 7]
        return jnp.sum(nsp) + jnp.sum(mlm), out

    packed_args = [jnp.asarray(packed[k]) for k in ("input_ids", "input_mask", "segment_ids")]

    def packed_loss(params):
        out = run(params, packed_args, jnp.asarray(packed["masked_lm_positions"]),
                  **_packing_kwargs(packed))
        slots = jnp.asarray(packed["example_slots"])
        nsp = optax.softmax_cross_entropy_with_integer_labels(
            out["nsp_logits"], jnp.asarray(packed["labels"]))
        mlm = jax.nn.logsumexp(out["mlm_logits"], -1) - out["mlm_logits"][..., 7]
        return jnp.sum(nsp * slots) + jnp.sum(mlm * slots), out

    (loss_u, out_u), grads_u = jax.jit(jax.value_and_grad(unpacked_loss, has_aux=True))(params)
    (loss_p, out_p), grads_p = jax.jit(jax.value_and_grad(packed_loss, has_aux=True))(params)
    filled = packed["example_index"] >= 0
    index = packed["example_index"][filled]
    assert sorted(index.tolist()) == list(range(len(LENGTHS)))
    assert out_p["nsp_logits"].shape == (len(packed["input_ids"]), K, 2)
    np.testing.assert_allclose(np.asarray(out_p["nsp_logits"])[filled],
                               np.asarray(out_u["nsp_logits"])[index], atol=2e-5)
    np.testing.assert_allclose(np.asarray(out_p["pooled_output"])[filled],
                               np.asarray(out_u["pooled_output"])[index], atol=2e-5)
    np.testing.assert_allclose(np.asarray(out_p["mlm_logits"])[filled],
                               np.asarray(out_u["mlm_logits"])[index, 0], atol=5e-5)
    # Every token of every example: the same sequence output.
    seq_p, seq_u = np.asarray(out_p["sequence_output"]), np.asarray(out_u["sequence_output"])
    rows, slots = np.nonzero(filled)
    for r, s in zip(rows, slots, strict=True):
        i, start = packed["example_index"][r, s], packed["cls_positions"][r, s]
        np.testing.assert_allclose(seq_p[r, start:start + LENGTHS[i]], seq_u[i, :LENGTHS[i]],
                                   atol=3e-5)
    np.testing.assert_allclose(float(loss_p), float(loss_u), rtol=1e-5)
    for (path, gp), gu in zip(jax.tree_util.tree_leaves_with_path(grads_p),
                              jax.tree_util.tree_leaves(grads_u), strict=True):
        np.testing.assert_allclose(np.asarray(gp), np.asarray(gu), atol=5e-5, rtol=1e-4,
                                   err_msg=jax.tree_util.keystr(path))


def test_sequence_classification_per_example_logits():
    model = BertForSequenceClassification(TINY, num_labels=3)
    feats = _examples(seed=3)
    packed = _packed(feats)
    unpacked = [jnp.asarray(feats[k]) for k in ("input_ids", "input_mask", "segment_ids")]
    params = _init(model, *unpacked)
    apply = jax.jit(lambda *a, **kw: model.apply({"params": params}, *a, **kw)["logits"])
    logits_u = apply(*unpacked)
    logits_p = apply(*[jnp.asarray(packed[k]) for k in (
        "input_ids", "input_mask", "segment_ids")], **_packing_kwargs(packed))
    assert logits_p.shape == (len(packed["input_ids"]), K, 3)
    filled = packed["example_index"] >= 0
    np.testing.assert_allclose(np.asarray(logits_p)[filled],
                               np.asarray(logits_u)[packed["example_index"][filled]],
                               atol=2e-5)
    # Without packing inputs, the same packed tokens attend across examples: other numbers.
    mixed = apply(*[jnp.asarray(packed[k]) for k in ("input_ids", "input_mask",
                                                     "segment_ids")])
    assert not np.allclose(np.asarray(mixed), np.asarray(logits_p)[:, 0], atol=1e-3)


def test_unpacked_graph_has_no_packing_ops():
    """No packing inputs: no same-example mask, position one-hot or pooler gather in the
    graph (its one comparison is the token-type one-hot's)."""
    model = modeling.BertModel(TINY)
    feats = _examples()
    args = [jnp.asarray(feats[k]) for k in ("input_ids", "input_mask", "segment_ids")]
    params = _init(model, *args)
    text = str(jax.make_jaxpr(lambda p: model.apply({"params": p}, *args))(params))
    packed = _packed(feats)
    text_packed = str(jax.make_jaxpr(lambda p: model.apply(
        {"params": p}, *[jnp.asarray(packed[k]) for k in ("input_ids", "input_mask",
                                                           "segment_ids")],
        **_packing_kwargs(packed)))(params))
    assert text.count(" = eq ") == 1
    # + the example mask of each layer, the position one-hot and the pooler's gather.
    assert text_packed.count(" = eq ") == 1 + TINY.num_hidden_layers + 2
