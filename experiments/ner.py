"""CoNLL-2003 NER fine-tuning: ``bert-jax finetune --config experiments/ner.py:conll2003
--workdir DIR --config.init_checkpoint=CKPT``.

Token classification with each word's label on its first sub-token; batch 32, lr 5e-5,
3 epochs, max length 128 (longer sentences are split at word boundaries). Scored with
conlleval's entity-level F1. ``data_dir`` (default ``$BERT_JAX_DATA/conll2003``) holds
train.txt / valid.txt / test.txt. ``conll2003_quick``: a CPU smoke run.
"""

from __future__ import annotations

from bert_jax.finetuning.recipes import make_quick, split_variant, task_config


def get_config(variant: str = "conll2003"):
    task, quick = split_variant(variant, ("conll2003",), "NER")
    c = task_config(task, "conll2003", learning_rate=5e-5)
    if quick:
        make_quick(c)
    return c
