"""Held-out masked-LM scores of a pretraining run, on exactly the batches it evaluates.

A predictor is any ``logits_fn(batch) -> [batch, predictions, >= vocab]`` array of logits at
the masked positions: the run's checkpoint (:func:`checkpoint_logits`) or another framework's
model trained on the same batches. Scored at every masked position and at the ``[MASK]``
positions alone (the others show the original token or a random one, and an unchanged token
can simply be copied).
"""

from __future__ import annotations

from collections.abc import Callable

import ml_collections
import numpy as np

from bert_jax.training.inputs import make_batches


def eval_batches(config: ml_collections.ConfigDict, vocab_size: int, tokenizer=None
                 ) -> list[dict]:
    """The run's ``config.eval_steps`` held-out batches of ``config.global_batch_size``."""
    source = make_batches(config, "eval", batch_size=config.global_batch_size,
                          vocab_size=vocab_size, process_index=0, process_count=1,
                          tokenizer=tokenizer)
    return [batch for _, batch in zip(range(config.eval_steps), source, strict=False)]


def checkpoint_logits(workdir: str) -> tuple[Callable, object]:
    """(``logits_fn``, model config) of the newest checkpoint in ``workdir``."""
    import jax

    from bert_jax.checkpoint import store
    from bert_jax.modeling import BertForPreTraining

    params, config, _, _ = store.load_model(workdir)
    model = BertForPreTraining(config, pair_head="nsp" in params,
                               add_pooler="pooler" in params["bert"])
    apply = jax.jit(lambda p, b: model.apply(
        {"params": p}, b["input_ids"], b["input_mask"], b["segment_ids"],
        b["masked_lm_positions"])["mlm_logits"])
    return (lambda batch: apply(params, batch)), config


def masked_lm_scores(logits_fn: Callable, batches: list[dict], mask_id: int, vocab_size: int,
                     baseline_id: int | None = None) -> dict[str, float]:
    """``accuracy`` and ``loss`` at every masked position, ``mask_accuracy`` and
    ``mask_tokens`` at the ``[MASK]`` positions alone, and with ``baseline_id`` the accuracy
    of always predicting that token there (``mask_baseline_accuracy``)."""
    right = total = mask_right = mask_total = baseline_right = 0
    nll = 0.0
    for batch in batches:
        logits = np.asarray(logits_fn(batch), np.float64)[..., :vocab_size]
        targets, weights = batch["masked_lm_ids"], batch["masked_lm_weights"] > 0
        shown = np.take_along_axis(np.asarray(batch["input_ids"]),
                                   batch["masked_lm_positions"], axis=1)
        at_mask = weights & (shown == mask_id)
        top = logits.max(-1)
        log_z = np.log(np.exp(logits - top[..., None]).sum(-1)) + top
        target_logit = np.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
        correct = logits.argmax(-1) == targets
        right += int((correct & weights).sum())
        total += int(weights.sum())
        mask_right += int((correct & at_mask).sum())
        mask_total += int(at_mask.sum())
        if baseline_id is not None:
            baseline_right += int(((targets == baseline_id) & at_mask).sum())
        nll += float(((log_z - target_logit) * weights).sum())
    scores = {"accuracy": right / max(total, 1), "loss": nll / max(total, 1),
              "mask_accuracy": mask_right / max(mask_total, 1), "mask_tokens": mask_total}
    if baseline_id is not None:
        scores["mask_baseline_accuracy"] = baseline_right / max(mask_total, 1)
    return scores
