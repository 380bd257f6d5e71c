"""Where task data lives when a run names no folder: ``$BERT_JAX_DATA/<task folder>``.

Imports nothing heavy, so ``bert-jax finetune --help`` can name the variable without JAX."""

from __future__ import annotations

import os

# The environment variable naming the data root: GLUE tasks at $BERT_JAX_DATA/glue/<TASK>/,
# CoNLL-2003 at $BERT_JAX_DATA/conll2003/, SQuAD at $BERT_JAX_DATA/squad/, SWAG at
# $BERT_JAX_DATA/swag/. Experiment files read it; --config.data_dir overrides it.
DATA_ENV = "BERT_JAX_DATA"


def data_dir(subdir: str) -> str | None:
    """``$BERT_JAX_DATA/<subdir>`` when the variable is set, else None (the run then needs
    --config.data_dir or train_file)."""
    root = os.environ.get(DATA_ENV)
    return os.path.join(root, subdir) if root else None


def missing_data_message(task: str) -> str:
    return (f"{task}: no data location; pass --config.data_dir=DIR (the task's folder) or set "
            f"the environment variable {DATA_ENV}=ROOT (GLUE tasks under ROOT/glue/<TASK>/, "
            "CoNLL-2003 under ROOT/conll2003/, SQuAD under ROOT/squad/, SWAG under ROOT/swag/)")
