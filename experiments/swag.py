"""SWAG fine-tuning: ``bert-jax finetune --config experiments/swag.py:swag --workdir DIR
--config.init_checkpoint=CKPT``.

Multiple choice over four endings as in the BERT paper: batch 16, lr 2e-5, 3 epochs, max
length 128 (each choice is ``[CLS] sent1 [SEP] sent2 ending [SEP]``). ``data_dir``
(default ``$BERT_JAX_DATA/swag``) holds train.csv / val.csv / test.csv. ``swag_quick``: a CPU
smoke run.
"""

from __future__ import annotations

from bert_jax.finetuning.recipes import make_quick, split_variant, task_config


def get_config(variant: str = "swag"):
    task, quick = split_variant(variant, ("swag",), "SWAG")
    c = task_config(task, "swag", learning_rate=2e-5, batch_size=16)
    if quick:
        make_quick(c)
    return c
