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


# How to get each kind of data, for the message of a run that has none.
GET_DATA = {
    "glue": ("GLUE: with internet, tensorflow-datasets fetches it: --config.tfds=true "
             "--config.tfds_download=true (pip install tensorflow-datasets importlib-resources; "
             "prepared once under "
             "~/tensorflow_datasets or --config.tfds_data_dir=DIR); or the GLUE distribution's "
             "TSV folders from https://gluebenchmark.com/tasks under ROOT/glue/"),
    "squad": ("SQuAD: --config.tfds=true --config.tfds_download=true, or train-v1.1.json and "
              "dev-v1.1.json from https://rajpurkar.github.io/SQuAD-explorer/"),
    "conll2003": "CoNLL-2003: --config.tfds=true --config.tfds_download=true",
}


def missing_data_message(task: str, family: str | None = None) -> str:
    """The error of a run with no data location; ``family`` (glue, squad, conll2003) adds
    how to get the data."""
    how = f". {GET_DATA[family]}" if family in GET_DATA else ""
    return (f"{task}: no data location; pass --config.data_dir=DIR (the task's folder) or set "
            f"the environment variable {DATA_ENV}=ROOT (GLUE tasks under ROOT/glue/<TASK>/, "
            "CoNLL-2003 under ROOT/conll2003/, SQuAD under ROOT/squad/, SWAG under ROOT/swag/)"
            + how)
