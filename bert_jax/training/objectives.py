"""Loss sums of the BERT-family objectives beyond MLM + NSP/SOP, for ``steps.py``.

Each objective is a ``sums_fn(params, batch, rng, deterministic) -> sums``: float32 sums over
the (micro)batch that ``steps.summarize`` turns into means. Besides BERT's keys
(``steps.SUM_KEYS``) an objective adds, per extra loss term ``t`` of ``steps.EXTRA_TERMS``,
``t_loss_sum`` (the metric), ``t_weighted_sum`` (the term's weight times it, what the total
loss adds) and the term's denominator (``mlm_weight`` or ``token_count``).

* ``sbo`` (SpanBERT, Joshi et al. 2020): MLM + span boundary objective, equal weights.
* ``electra`` (Clark et al. 2020): generator MLM + ``rtd_weight`` (lambda, 50 in the paper)
  times the discriminator's binary cross-entropy over every real token.
* ``distill`` (DistilBERT, Sanh et al. 2019): MLM + ``alpha_kd`` times the
  temperature-softened KL divergence to the teacher's masked-LM distribution (times T^2, as
  Hinton et al. 2015) + ``alpha_cos`` times (1 - cosine) of the last hidden states.
  DistilBERT weighs them 5 : 2 : 1 (kd : mlm : cos); with MLM at 1 that is 2.5 and 0.5.

Packed rows (``create-pretraining-data --pack``): the models take the batch's packing inputs
(``heads.packing_inputs``) and every loss is per masked position or per real token, so a
packed row's sums are those of its examples. None of these objectives has a sentence-pair
head: the pair sums are zero.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from bert_jax.modeling import family, heads

SumsFn = Callable[..., dict[str, jax.Array]]


def _zero_pair_sums() -> dict[str, jax.Array]:
    zero = jnp.zeros((), jnp.float32)
    return {"nsp_loss_sum": zero, "nsp_correct": zero, "nsp_count": zero}


def _mlm_sums(outputs, batch, config, decoder_key="mlm_decoder", logits_key="mlm_logits"):
    weights = batch["masked_lm_weights"].astype(jnp.float32)
    nll, correct = heads.mlm_cross_entropy(
        {"mlm_decoder": outputs[decoder_key], "mlm_logits": outputs[logits_key]},
        batch["masked_lm_ids"], config)
    return jnp.sum(nll * weights), jnp.sum(correct * weights), jnp.sum(weights)


def _term(sums: dict, name: str, loss_sum, weight: float) -> None:
    sums[f"{name}_loss_sum"] = loss_sum
    sums[f"{name}_weighted_sum"] = weight * loss_sum


def kd_loss(student_logits, teacher_logits, temperature: float):
    """Per-prediction KL(teacher || student) of the temperature-softened distributions times
    T^2: [..., vocab] float32 logits -> [...]."""
    t = temperature
    log_q = jax.nn.log_softmax(student_logits.astype(jnp.float32) / t, axis=-1)
    log_p = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / t, axis=-1)
    p = jnp.exp(log_p)
    return jnp.sum(jnp.where(p > 0, p * (log_p - log_q), 0.0), axis=-1) * t * t


def cosine_loss(student_hidden, teacher_hidden):
    """1 - cosine similarity per token: [..., hidden] -> [...] float32."""
    s = student_hidden.astype(jnp.float32)
    t = teacher_hidden.astype(jnp.float32)
    norms = jnp.linalg.norm(s, axis=-1) * jnp.linalg.norm(t, axis=-1)
    return 1.0 - jnp.sum(s * t, axis=-1) / jnp.maximum(norms, 1e-8)


def rtd_loss(logits, labels):
    """Per-token sigmoid binary cross-entropy and whether the prediction is right."""
    logits = logits.astype(jnp.float32)
    labels = labels.astype(jnp.float32)
    loss = optax.sigmoid_binary_cross_entropy(logits, labels)
    return loss, ((logits > 0).astype(jnp.float32) == labels).astype(jnp.float32)


def _rngs(rng, deterministic):
    return None if deterministic else {"dropout": rng}


def span_boundary_sums(model) -> SumsFn:
    def sums_fn(params, batch, rng, deterministic):
        out = model.apply({"params": params}, batch["input_ids"], batch["input_mask"],
                          batch["segment_ids"], batch["masked_lm_positions"],
                          batch["masked_lm_weights"], deterministic=deterministic,
                          rngs=_rngs(rng, deterministic), **heads.packing_inputs(batch))
        loss, correct, weight = _mlm_sums(out, batch, model.config)
        sbo, sbo_correct, _ = _mlm_sums(out, batch, model.config, "sbo_decoder", "sbo_logits")
        sums = {"mlm_loss_sum": loss, "mlm_correct": correct, "mlm_weight": weight,
                "sbo_correct": sbo_correct, **_zero_pair_sums()}
        _term(sums, "sbo", sbo, 1.0)
        return sums

    return sums_fn


def electra_sums(model, rtd_weight: float) -> SumsFn:
    def sums_fn(params, batch, rng, deterministic):
        dropout_rng, sample_rng = jax.random.split(rng)
        out = model.apply({"params": family.tie_generator_embeddings(params)},
                          batch["input_ids"], batch["input_mask"], batch["segment_ids"],
                          batch["masked_lm_positions"], batch["masked_lm_ids"],
                          batch["masked_lm_weights"], sample_rng, deterministic=deterministic,
                          rngs=_rngs(dropout_rng, deterministic), **heads.packing_inputs(batch))
        loss, correct, weight = _mlm_sums(out, batch, model.generator)
        real = batch["input_mask"].astype(jnp.float32)
        rtd, rtd_correct = rtd_loss(out["rtd_logits"], out["rtd_labels"])
        sums = {"mlm_loss_sum": loss, "mlm_correct": correct, "mlm_weight": weight,
                "rtd_correct": jnp.sum(rtd_correct * real), "token_count": jnp.sum(real),
                "rtd_replaced": jnp.sum(out["rtd_labels"] * real), **_zero_pair_sums()}
        _term(sums, "rtd", jnp.sum(rtd * real), rtd_weight)
        return sums

    return sums_fn


def distill_sums(model, temperature: float, alpha_kd: float, alpha_cos: float) -> SumsFn:
    def sums_fn(params, batch, rng, deterministic):
        # The teacher's parameters are constants here: no gradient (family.freeze_teacher
        # also zeroes their updates).
        params = {**params, "teacher": jax.lax.stop_gradient(params["teacher"])}
        out = model.apply({"params": params}, batch["input_ids"], batch["input_mask"],
                          batch["segment_ids"], batch["masked_lm_positions"],
                          deterministic=deterministic, rngs=_rngs(rng, deterministic),
                          **heads.packing_inputs(batch))
        loss, correct, weight = _mlm_sums(out, batch, model.config)
        weights = batch["masked_lm_weights"].astype(jnp.float32)
        real = batch["input_mask"].astype(jnp.float32)
        kd = kd_loss(out["mlm_logits"], out["teacher_mlm_logits"], temperature)
        cos = cosine_loss(out["sequence_output"], out["teacher_sequence_output"])
        sums = {"mlm_loss_sum": loss, "mlm_correct": correct, "mlm_weight": weight,
                "token_count": jnp.sum(real), **_zero_pair_sums()}
        _term(sums, "kd", jnp.sum(kd * weights), alpha_kd)
        _term(sums, "cos", jnp.sum(cos * real), alpha_cos)
        return sums

    return sums_fn
