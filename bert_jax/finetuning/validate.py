"""Range checks of every number in a fine-tuning config, run when it is loaded (and again
after ``evaluate``/``predict`` overrides), before any data is read or anything compiled.
The error names the key and the allowed range, like the pretraining checks
(``bert_jax.training.validate``), with the same helpers (``bert_jax.validation``)."""

from __future__ import annotations

from bert_jax.errors import BertJaxError
from bert_jax.validation import Checker, check_mesh, check_model, check_optimizer


def validate_finetuning(config) -> None:
    """BertJaxError naming the first out-of-range value of a fine-tuning ConfigDict."""
    c = Checker(config)
    c.choice("on_error", ("raise", "skip"))
    c.number("holdout_fraction", 0.0, 1.0, high_open=True)
    c.integer("holdout_seed", 0)
    c.integer("max_train_examples", 0)
    c.integer("max_seq_length", 8)
    c.integer("max_examples_per_row", 1)
    c.integer("global_batch_size", 1)
    c.integer("eval_batch_size", 1)
    c.integer("epochs", 1)
    c.integer("length_bucket_min", 0)
    c.integer("length_bucket_min_sequences", 0)
    c.integer("kernel_min_sequences", 0)
    c.integer("unroll_min_sequences", 0)
    c.integer("seed", 0)
    c.integer("log_every", 0)  # 0: no loss lines during an epoch
    check_optimizer(c, warmup_steps_allow=(-1,), warmup_proportion=True)
    check_mesh(c, "parallel.mesh", config)
    check_model(c, config)
    if not config.task:
        raise BertJaxError("task='': set --config.task (e.g. mrpc, squad_v1, conll2003)")
