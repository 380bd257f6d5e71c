"""The unigram baseline of masked-LM evaluation: what a model that ignores the context scores.

A model that has learned only how often each token occurs predicts the most frequent one at
every masked position and assigns each token its corpus frequency. Its held-out accuracy and
loss are the floor a pretrained model must clear to show it uses the context. Token
frequencies come from the training batches, the masked tokens from exactly the held-out
batches the run evaluates (same source, seed and masks).
"""

from __future__ import annotations

import math

import ml_collections
import numpy as np

from bert_jax.training.inputs import FIRST_REGULAR_ID, make_batches


def unigram_baseline(config: ml_collections.ConfigDict, vocab_size: int, *,
                     train_batches: int = 100, tokenizer=None) -> dict[str, float]:
    """``{"mlm_accuracy", "mlm_loss", "tokens"}`` of the unigram predictor on the run's
    held-out masked tokens (``config.eval_steps`` batches of ``config.global_batch_size``).

    Frequencies: add-one smoothed counts of the regular (non-special) tokens of the first
    ``train_batches`` training batches, with the masked positions restored."""
    batch = config.global_batch_size
    common = dict(batch_size=batch, vocab_size=vocab_size, process_index=0, process_count=1,
                  tokenizer=tokenizer)
    counts = np.ones(vocab_size, np.float64)
    for _, b in zip(range(train_batches), make_batches(config, "train", **common),
                    strict=False):
        ids = np.array(b["input_ids"])
        rows = np.repeat(np.arange(ids.shape[0]), b["masked_lm_positions"].shape[1])
        weights = b["masked_lm_weights"].reshape(-1) > 0
        ids[rows[weights], b["masked_lm_positions"].reshape(-1)[weights]] = \
            b["masked_lm_ids"].reshape(-1)[weights]
        real = ids[(b["input_mask"] > 0) & (ids >= FIRST_REGULAR_ID)]
        counts += np.bincount(real, minlength=vocab_size)[:vocab_size]
    counts[:FIRST_REGULAR_ID] = 0  # never predicted
    log_probs = np.log(counts / counts.sum(), where=counts > 0,
                       out=np.full(vocab_size, -math.inf))
    best = int(np.argmax(counts))
    held_out = []
    for _, b in zip(range(config.eval_steps), make_batches(config, "eval", **common),
                    strict=False):
        held_out.append(b["masked_lm_ids"][b["masked_lm_weights"] > 0])
    targets = np.concatenate(held_out) if held_out else np.zeros(0, np.int64)
    if not targets.size:
        return {"mlm_accuracy": math.nan, "mlm_loss": math.nan, "tokens": 0}
    return {"mlm_accuracy": float(np.mean(targets == best)),
            "mlm_loss": float(-np.mean(log_probs[targets])), "tokens": int(targets.size),
            "most_frequent_id": best}
