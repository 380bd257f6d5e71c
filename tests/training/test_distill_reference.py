"""DistilBERT's pretraining loss terms against the reference distiller's (Sanh et al. 2019,
transformers' research project ``distillation/distiller.py``) in torch: KL(teacher || student)
at temperature T, times T², as ``KLDivLoss(reduction="batchmean")`` over the predicted
positions (the reference's ``restrict_ce_to_mask``, which bert-jax always does: its MLM head
decodes the masked positions only), and ``CosineEmbeddingLoss`` (target 1) of the last hidden
states over real tokens; values and gradients with respect to the student's outputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.training import objectives

torch = pytest.importorskip("torch")

T = 2.0


def _inputs():
    rng = np.random.default_rng(0)
    s_logits = rng.normal(0, 3, (4, 5, 40)).astype(np.float32)  # [batch, predictions, vocab]
    t_logits = rng.normal(0, 3, (4, 5, 40)).astype(np.float32)
    weights = (rng.random((4, 5)) < 0.7).astype(np.float32)  # filled prediction slots
    s_hidden = rng.normal(0, 1, (4, 9, 16)).astype(np.float32)  # [batch, tokens, hidden]
    t_hidden = rng.normal(0, 1, (4, 9, 16)).astype(np.float32)
    real = (np.arange(9)[None] < np.array([9, 6, 3, 7])[:, None]).astype(np.float32)
    return s_logits, t_logits, weights, s_hidden, t_hidden, real


def test_kd_and_cosine_terms_match_the_reference_distiller():
    s_logits, t_logits, weights, s_hidden, t_hidden, real = _inputs()

    # bert-jax: per-position terms, summed with the step's weights and divided by the
    # step's denominators (steps.EXTRA_TERMS: kd over mlm_weight, cos over token_count)
    def ours(sl, sh):
        kd = jnp.sum(objectives.kd_loss(sl, jnp.asarray(t_logits), T) * weights) / weights.sum()
        cos = jnp.sum(objectives.cosine_loss(sh, jnp.asarray(t_hidden)) * real) / real.sum()
        return kd, cos

    (kd, cos) = ours(jnp.asarray(s_logits), jnp.asarray(s_hidden))
    g_kd = jax.grad(lambda sl: ours(sl, jnp.asarray(s_hidden))[0])(jnp.asarray(s_logits))
    g_cos = jax.grad(lambda sh: ours(jnp.asarray(s_logits), sh)[1])(jnp.asarray(s_hidden))

    # the reference: masked_select of the positions, then torch's losses
    sl = torch.tensor(s_logits, requires_grad=True)
    sh = torch.tensor(s_hidden, requires_grad=True)
    mask = torch.tensor(weights, dtype=torch.bool).unsqueeze(-1).expand_as(sl)
    s_sel = torch.masked_select(sl, mask).view(-1, sl.size(-1))
    t_sel = torch.masked_select(torch.tensor(t_logits), mask).view(-1, sl.size(-1))
    ref_kd = torch.nn.KLDivLoss(reduction="batchmean")(
        torch.log_softmax(s_sel / T, dim=-1), torch.softmax(t_sel / T, dim=-1)) * T ** 2
    hmask = torch.tensor(real, dtype=torch.bool).unsqueeze(-1).expand_as(sh)
    sh_sel = torch.masked_select(sh, hmask).view(-1, sh.size(-1))
    th_sel = torch.masked_select(torch.tensor(t_hidden), hmask).view(-1, sh.size(-1))
    ref_cos = torch.nn.CosineEmbeddingLoss(reduction="mean")(
        sh_sel, th_sel, sh_sel.new_ones(sh_sel.size(0)))
    ref_kd.backward()
    ref_cos.backward()

    np.testing.assert_allclose(float(kd), ref_kd.item(), rtol=1e-5)
    np.testing.assert_allclose(float(cos), ref_cos.item(), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(g_kd), sl.grad.numpy(), atol=1e-6)
    np.testing.assert_allclose(np.asarray(g_cos), sh.grad.numpy(), atol=1e-6)
    # the empty prediction slots get no gradient; a different temperature changes the term
    assert not np.asarray(g_kd)[weights == 0].any()
    other = jnp.sum(objectives.kd_loss(jnp.asarray(s_logits), jnp.asarray(t_logits), 1.0)
                    * weights) / weights.sum()
    assert abs(float(other) - float(kd)) > 1e-3
