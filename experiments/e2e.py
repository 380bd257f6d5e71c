"""End-to-end proof (``scripts/e2e_small_bert.sh``): a small BERT pretrained from raw text on
one GPU, then fine-tuned on five GLUE tasks next to an identically configured random init.

Variants (``experiments/e2e.py:<variant>``)
  pretrain               6 x 512 BERT (8 heads, 2048 MLP, vocab 8192, seq 128), MLM + NSP on
                         pre-materialized batches (data.source=materialized, repeat=True),
                         batch 256, 7,000 steps (~20 passes over 352 stored batches), AdamW
                         5e-4, 10% warmup, linear decay, bf16 compute.
  finetune_<task>        cola sst2 mrpc stsb rte: the same model config (pretrained via
                         init_checkpoint, or random with init_checkpoint="" and the tokenizer),
                         batch 32, lr 5e-5, 3 epochs, max length 128, bf16 compute.
  pretrain_check, finetune_<task>_check
                         the CPU validation scale: 2 x 128 model, 30 steps over 20 stored batches
                         of 32; 100 training rows, 1 epoch.

``PREP[scale]`` is what ``cpu-prep`` materializes for each scale (the batch size must equal
``global_batch_size``); ``VOCAB_SIZE`` is the SentencePiece vocabulary it trains.
"""

from __future__ import annotations

import ml_collections

from bert_jax.errors import BertJaxError
from bert_jax.finetuning.recipes import split_variant, task_config
from bert_jax.training.config import base_config

VOCAB_SIZE = 8192
SEQ_LEN = 128
MAX_PREDICTIONS = 20
TASKS = ("sst2", "cola", "mrpc", "stsb", "rte")

# The model both inits share; `preset` plus BertConfig fields.
MODELS = {
    "gpu": {"preset": "small", "num_hidden_layers": 6, "hidden_size": 512,
            "num_attention_heads": 8, "intermediate_size": 2048},
    "check": {"preset": "tiny", "num_hidden_layers": 2, "hidden_size": 128,
              "num_attention_heads": 2, "intermediate_size": 512},
}
# Materialized batches per scale: train steps x batch (~593 bytes per stored sequence, so
# 352 x 256 = 90,112 sequences are 51 MiB), and held-out eval batches.
PREP = {
    "gpu": {"train_steps": 352, "eval_steps": 5, "batch_size": 256},
    "check": {"train_steps": 20, "eval_steps": 2, "batch_size": 32},
}
PRETRAIN = {
    "gpu": {"steps": 7_000, "learning_rate": 5e-4, "log_every": 100, "eval_every": 1_000,
            "dtype": "bfloat16"},
    "check": {"steps": 30, "learning_rate": 1e-3, "log_every": 5, "eval_every": 15,
              "dtype": "float32"},
}
FINETUNE = {
    "gpu": {"learning_rate": 5e-5, "epochs": 3, "max_train_examples": 0, "dtype": "bfloat16"},
    "check": {"learning_rate": 5e-5, "epochs": 1, "max_train_examples": 100,
              "dtype": "float32"},
}


def _set_model(model: ml_collections.ConfigDict, scale: str, dtype: str) -> None:
    for key, value in MODELS[scale].items():
        model[key] = value
    model.vocab_size = VOCAB_SIZE
    model.max_position_embeddings = SEQ_LEN
    model.dtype = dtype


def pretrain_config(scale: str) -> ml_collections.ConfigDict:
    """MLM + NSP on materialized batches, cycled (the trainer's data.repeat)."""
    p, prep = PRETRAIN[scale], PREP[scale]
    c = base_config()
    _set_model(c.model, scale, p["dtype"])
    c.objective = "nsp"
    c.data.source = "materialized"
    c.data.repeat = True
    c.data.max_seq_length = SEQ_LEN
    c.data.max_predictions_per_seq = MAX_PREDICTIONS
    c.global_batch_size = prep["batch_size"]
    c.num_train_steps = p["steps"]
    c.optimizer.learning_rate = p["learning_rate"]
    c.optimizer.warmup_steps = p["steps"] // 10
    c.optimizer.b2 = 0.98  # RoBERTa's: steadier at a high peak learning rate
    c.checkpoint.every_steps = p["steps"]  # only the final step: no mid-run save pauses
    c.checkpoint.keep = 1
    c.log_every = p["log_every"]
    c.eval_every = p["eval_every"]
    c.eval_steps = prep["eval_steps"]
    c.progress_bar = False
    return c


def finetune_config(task: str, scale: str) -> ml_collections.ConfigDict:
    """The paper's fine-tuning recipe on the e2e model; data_dir comes from the script."""
    f = FINETUNE[scale]
    c = task_config(task, None, learning_rate=f["learning_rate"], epochs=f["epochs"],
                    max_seq_length=SEQ_LEN, batch_size=32)
    _set_model(c.model, scale, f["dtype"])
    c.max_train_examples = f["max_train_examples"]
    c.eval_batch_size = 256
    c.log_every = 200
    return c


def get_config(variant: str = "pretrain") -> ml_collections.ConfigDict:
    scale = "check" if variant.endswith("_check") else "gpu"
    name = variant[: -len("_check")] if scale == "check" else variant
    if name == "pretrain":
        return pretrain_config(scale)
    if name.startswith("finetune_"):
        task, _ = split_variant(name[len("finetune_"):], TASKS, "e2e fine-tuning")
        return finetune_config(task, scale)
    raise BertJaxError(f"unknown e2e variant {variant!r}; choose pretrain or finetune_<task> "
                       f"(task: {', '.join(TASKS)}), optionally with _check")
