"""What the fine-tuning experiment files (experiments/glue.py, squad.py, ner.py, swag.py)
share: the paper's recipe with a task's changes, the task's data folder under
``$BERT_JAX_DATA``, the ``quick`` CPU variant and variant-name parsing."""

from __future__ import annotations

import ml_collections

from bert_jax.errors import BertJaxError
from bert_jax.finetuning.config import base_config
from bert_jax.tasks.data_root import data_dir


def task_config(task: str, data_subdir: str | None, *, learning_rate: float = 2e-5,
                epochs: int = 3, max_seq_length: int = 128, batch_size: int = 32
                ) -> ml_collections.ConfigDict:
    """BERT paper fine-tuning: AdamW, 10% warmup then linear decay, dropout 0.1, batch 32.

    ``data_subdir``: the task's folder under ``$BERT_JAX_DATA`` (data_dir stays unset when the
    variable is not; the run then needs --config.data_dir). ``batch_size`` sets
    ``global_batch_size``, ``learning_rate`` sets ``optimizer.learning_rate``.
    """
    c = base_config()
    c.task = task
    c.data_dir = data_dir(data_subdir) if data_subdir else None
    c.optimizer.learning_rate = learning_rate
    c.epochs = epochs
    c.max_seq_length = max_seq_length
    c.global_batch_size = batch_size
    return c


def split_variant(variant: str, known: tuple[str, ...], what: str) -> tuple[str, bool]:
    """'mrpc' -> ('mrpc', False); 'mrpc_quick' -> ('mrpc', True); unknown -> BertJaxError."""
    quick = variant.endswith("_quick")
    name = variant[: -len("_quick")] if quick else variant
    if name not in known:
        raise BertJaxError(f"unknown {what} variant {variant!r}; choose one of "
                           f"{', '.join(known)} (optionally with _quick)")
    return name, quick


def make_quick(c: ml_collections.ConfigDict) -> None:
    """Seconds on a CPU: 1 epoch, short sequences, a few hundred training rows."""
    c.epochs = 1
    c.max_seq_length = min(c.max_seq_length, 64)
    c.max_train_examples = 256
    c.global_batch_size = 16
    c.eval_batch_size = 32
    c.log_every = 10
