"""Fine-tuning on your own files: ``bert-jax finetune --config experiments/custom.py:<variant>
--workdir DIR --config.init_checkpoint=CKPT --config.train_file=FILE --config.text_column=COL
--config.label_column=COL``.

Variants: ``classification`` (one text per row), ``pair_classification`` (also
``--config.text_pair_column``), ``regression`` (a number per row) and ``tagging`` (words and
one tag per word). Files are CSV, TSV or JSON lines with a header / keys naming the columns;
``--config.dev_file`` (else 10% of train is held out) and ``--config.test_file`` for
``bert-jax predict``. Labels are inferred from train and stored with the model. Append
``_quick`` for a CPU smoke run. See docs/tasks.md, "Your own data".
"""

from __future__ import annotations

from bert_jax.finetuning.recipes import make_quick, split_variant, task_config

VARIANTS = {"classification": "custom_classification",
            "pair_classification": "custom_classification",
            "regression": "custom_regression",
            "tagging": "custom_tagging"}


def get_config(variant: str = "classification"):
    name, quick = split_variant(variant, tuple(VARIANTS), "custom")
    c = task_config(VARIANTS[name], None, learning_rate=5e-5 if name == "tagging" else 2e-5)
    c.text_column = "tokens" if name == "tagging" else "text"
    c.label_column = "tags" if name == "tagging" else "label"
    if name == "pair_classification":
        c.text_pair_column = "text_b"
    if quick:
        make_quick(c)
    return c
