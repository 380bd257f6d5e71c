"""The BERT paper's feature-based CoNLL-2003 rows (Table 7): ``bert-jax finetune --config
experiments/feature_ner.py:<row> --workdir DIR --config.init_checkpoint=CKPT``.

Rows: embeddings, second_to_last, last, mix4 (weighted sum of the last four hidden states),
last4 (their concatenation), mix (weighted sum of all layers) — each a frozen encoder under a
two-layer BiLSTM tagger (768 units per direction) — and finetune (the whole model, as
experiments/ner.py). Append ``_quick`` for a CPU smoke run. The whole table:
``python -m bert_jax.analysis.feature_table`` (docs/analysis.md).
"""

from __future__ import annotations

from bert_jax.analysis.feature_table import ROWS, row_config
from bert_jax.finetuning.recipes import split_variant


def get_config(variant: str = "last"):
    row, quick = split_variant(variant, tuple(ROWS), "feature-table")
    return row_config(row, quick)
