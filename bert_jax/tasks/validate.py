"""Range checks of every number in a fine-tuning config, run when it is loaded (and again
after ``evaluate``/``predict`` overrides), before any data is read or anything compiled.
The error names the key and the allowed range, like the pretraining checks
(``bert_jax.training.validate``) whose helpers it shares."""

from __future__ import annotations

from bert_jax.errors import BertJaxError
from bert_jax.training.validate import Checker, check_mesh


def validate_finetuning(config) -> None:
    """BertJaxError naming the first out-of-range value of a fine-tuning ConfigDict."""
    c = Checker(config)
    c.choice("on_error", ("raise", "skip"))
    c.number("holdout_fraction", 0.0, 1.0, high_open=True)
    c.integer("holdout_seed", 0)
    c.integer("max_train_examples", 0)
    c.integer("max_seq_length", 8)
    c.integer("global_batch_size", 1)
    c.integer("eval_batch_size", 1)
    c.integer("epochs", 1)
    c.integer("length_bucket_min", 0)
    c.integer("length_bucket_min_sequences", 0)
    c.integer("seed", 0)
    c.integer("log_every", 0)  # 0: no loss lines during an epoch
    c.choice("optimizer.name", ("adamw", "lamb"))
    c.number("optimizer.learning_rate", 0.0, low_open=True)
    c.integer("optimizer.warmup_steps", 0, allow=(-1,))
    c.probability("optimizer.warmup_proportion")
    c.choice("optimizer.decay", ("linear", "polynomial", "cosine", "constant"))
    c.integer("optimizer.decay_steps", 1, allow=(-1,))
    c.number("optimizer.end_learning_rate", 0.0)
    c.number("optimizer.power", 0.0, low_open=True)
    c.number("optimizer.b1", 0.0, 1.0, high_open=True)
    c.number("optimizer.b2", 0.0, 1.0, high_open=True)
    c.number("optimizer.eps", 0.0, low_open=True)
    c.number("optimizer.weight_decay", 0.0)
    c.number("optimizer.clip_norm", 0.0)
    check_mesh(c, "parallel.mesh", config)
    for key, value in config.model.items():
        if key == "preset" or value is None or isinstance(value, bool):
            continue
        if isinstance(value, float) and key.endswith("_prob"):
            c.probability(f"model.{key}")
        elif key in ("initializer_range", "layer_norm_eps"):
            c.number(f"model.{key}", 0.0, low_open=True)
        elif isinstance(value, int) and key != "pad_token_id":
            c.integer(f"model.{key}", 1)
    if not config.task:
        raise BertJaxError("task='': set --config.task (e.g. mrpc, squad_v1, conll2003)")
