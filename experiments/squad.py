"""SQuAD fine-tuning: ``bert-jax finetune --config experiments/squad.py:<v1|v2> --workdir DIR
--config.init_checkpoint=CKPT``.

Google's run_squad recipe: max length 384, doc stride 128, max query length 64, batch 32,
lr 3e-5, 2 epochs; decoding with n-best 20 and max answer length 30; v2.0 predicts "no
answer" when the null score beats the best span by more than ``null_score_diff_threshold``.
``data_dir`` (default ``$BERT_JAX_DATA/squad``) holds train-v1.1.json / dev-v1.1.json (or
v2.0); without a dev file the dev split is held out from train by article.
``v1_quick``/``v2_quick``: CPU smoke runs. A small model on a few thousand questions needs a
higher learning rate (docs/finetuning.md, "SQuAD: what the recipe reaches").
"""

from __future__ import annotations

from bert_jax.finetuning.recipes import make_quick, split_variant, task_config

VERSIONS = {"v1": "squad_v1", "v2": "squad_v2"}


def get_config(variant: str = "v1"):
    version, quick = split_variant(variant, tuple(VERSIONS), "SQuAD")
    c = task_config(VERSIONS[version], "squad", learning_rate=3e-5,
                    epochs=2, max_seq_length=384)
    c.featurize.doc_stride = 128
    c.featurize.max_query_length = 64
    c.postprocess.n_best_size = 20
    c.postprocess.max_answer_length = 30
    c.postprocess.null_score_diff_threshold = 0.0
    if quick:
        make_quick(c)
        c.max_seq_length = 128
        c.featurize.doc_stride = 64
        c.featurize.max_query_length = 32
    return c
