"""GLUE fine-tuning: ``bert-jax finetune --config experiments/glue.py:<task> --workdir DIR
--config.init_checkpoint=CKPT``.

Variants: cola sst2 mrpc stsb qqp mnli qnli rte wnli (append ``_quick`` for a CPU smoke run).
Hyperparameters follow the BERT paper: batch 32, 3 epochs, lr 2e-5 (RTE, MRPC, STS-B, CoLA:
small sets, lr 2e-5 as well; sweep 2e-5..5e-5 with --config.optimizer.learning_rate), max
length 128. ``data_dir`` defaults to ``$BERT_JAX_DATA/glue`` (the task's folder, e.g. MRPC/,
is found under it); without a dev file there, dev is held out from train
(``holdout_fraction`` 0.1).
"""

from __future__ import annotations

from bert_jax.finetuning.recipes import make_quick, split_variant, task_config

TASKS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")


def get_config(variant: str = "mrpc"):
    task, quick = split_variant(variant, TASKS, "GLUE")
    c = task_config(task, "glue")
    if quick:
        make_quick(c)
    return c
