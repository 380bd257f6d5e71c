"""Sequence classifiers of the BERT family (RobertaForSequenceClassification's dense + tanh +
out_proj head, ElectraForSequenceClassification's with gelu, DistilBertForSequenceClassification's
pre_classifier + relu, AlbertForSequenceClassification's pooler + classifier) import with
their heads: logits, loss and every gradient of one training step agree with transformers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from test_families import _batch, _hf_model

from bert_jax.checkpoint import families
from bert_jax.modeling import BertForSequenceClassification

NUM_LABELS = 3


@pytest.mark.parametrize("family", ["roberta", "electra", "distilbert", "albert"])
def test_sequence_classifier_logits_loss_and_gradients_match(family, tmp_path):
    cls_name = {"roberta": "RobertaForSequenceClassification",
                "electra": "ElectraForSequenceClassification",
                "distilbert": "DistilBertForSequenceClassification",
                "albert": "AlbertForSequenceClassification"}[family]
    model = _hf_model(family, cls_name, num_labels=NUM_LABELS)
    model.save_pretrained(tmp_path / "hf")
    params, cfg, _, report = families.load_hf_any(tmp_path / "hf")
    assert report.unused == [] and f"classifier ({NUM_LABELS} labels)" in report.heads
    assert cfg.pooler_activation == families.POOLER_ACTIVATIONS[family]

    ids, mask, segments = _batch(cfg)
    labels = np.array([0, 2, 1, 2])
    ours = BertForSequenceClassification(cfg, NUM_LABELS)

    def loss_fn(p):
        logits = ours.apply({"params": p}, jnp.asarray(ids), jnp.asarray(mask),
                            jnp.asarray(segments))["logits"]
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.asarray(labels))
        return loss.mean(), logits

    # Compiled: op by op, the forward and backward passes cost several times one compile.
    (loss, logits), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params)
    kwargs = dict(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                  labels=torch.tensor(labels))
    if family != "distilbert":
        kwargs["token_type_ids"] = torch.tensor(segments)
    model.zero_grad()
    ref = model.eval()(**kwargs)
    ref.loss.backward()
    np.testing.assert_allclose(np.asarray(logits), ref.logits.detach().numpy(), atol=1e-5)
    np.testing.assert_allclose(float(loss), ref.loss.item(), atol=1e-6)

    # Our gradients in the family's names (the class's export mapping), against torch's .grad.
    ours_by_name, _ = families.params_to_family_state(jax.device_get(grads), cfg, family,
                                                      cls_name)
    torch_grads = {n: p.grad.numpy() for n, p in model.named_parameters()
                   if p.grad is not None}
    assert sorted(ours_by_name) == sorted(torch_grads)
    for name, g in torch_grads.items():
        scale = max(1.0, float(np.abs(g).max()))
        np.testing.assert_allclose(ours_by_name[name], g, atol=2e-5 * scale, err_msg=name)
