"""The family at equal pretraining compute (``python -m bench variants``, docs/variants.md).

Every member pretrains the end-to-end model of ``experiments/e2e.py`` (6 x 512, 8 heads, MLP
2048, vocab 8192, seq 128, batch 256, AdamW 5e-4, 10% warmup, linear decay, bf16 compute) on
materialized batches of the same corpus and tokenizer; only the objective, the masking and
the number of steps differ. The steps give every member the pretraining FLOPs of
``BERT_STEPS`` BERT steps (``train_flops``: the model FLOPs of one training sequence,
docs/ENGINEERING's count; ELECTRA's generator and DistilBERT's teacher forward pass included).

Variants (``experiments/variants.py:<name>``; ``<name>_check``: the e2e CPU-check model)
  bert            MLM + NSP, token masking
  roberta         MLM only, full sentences, dynamic masking (every batch masked afresh)
  albert          SOP, all layers shared, factorised embeddings (128)
  spanbert        span masking + span boundary objective, full sentences
  ernie           knowledge masking (units from the built-in fallback) + NSP
  ernie_lexicon   knowledge masking (CoNLL-2003 train entities + the fallback) + NSP
  electra         generator (1/4 width) + replaced-token detection, full sentences
  distilbert      3-layer student of ``bert`` (``distill.teacher`` = bert's workdir)

``data.directory``, ``data.tokenizer`` (and for distilbert ``distill.teacher``) come from the
command line.
"""

from __future__ import annotations

import importlib.util
import os

import ml_collections

from bert_jax.errors import BertJaxError

_spec = importlib.util.spec_from_file_location(
    "experiments_e2e", os.path.join(os.path.dirname(os.path.abspath(__file__)), "e2e.py"))
e2e = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(e2e)

BERT_STEPS = 6_000  # x 256 x 128 = 197 M tokens of BERT per member
LAYERS, HIDDEN, VOCAB = 6, 512, e2e.VOCAB_SIZE
SEQ, PREDICTIONS = e2e.SEQ_LEN, e2e.MAX_PREDICTIONS
GENERATOR_FRACTION = 0.25
ALBERT_EMBEDDING = 128

# variant -> (objective, data kind, masking); the batches are materialized per (kind, masking)
VARIANTS = {
    "bert": ("nsp", "nsp", "token"),
    "roberta": ("mlm", "full", "token"),
    "albert": ("sop", "sop", "token"),
    "spanbert": ("sbo", "full", "span"),
    "ernie": ("nsp", "nsp", "knowledge"),
    "ernie_lexicon": ("nsp", "nsplex", "knowledge"),
    "electra": ("electra", "full", "token"),
    "distilbert": ("distill", "full", "token"),
}


def encoder_flops(layers: int, hidden: int, seq: int = SEQ) -> float:
    """Forward + backward FLOPs of the encoder layers for one sequence (6 per weight, 12 L s^2 H
    for attention)."""
    return 6 * seq * 12 * layers * hidden ** 2 + 12 * layers * seq ** 2 * hidden


def train_flops(variant: str) -> float:
    """Model FLOPs of one pretraining sequence of ``variant`` (forward + backward, or forward
    alone for DistilBERT's frozen teacher)."""
    h, p = HIDDEN, PREDICTIONS
    mlm_head = 6 * p * (h * h + h * VOCAB)
    if variant in ("bert", "roberta", "ernie", "ernie_lexicon"):
        return encoder_flops(LAYERS, h) + mlm_head
    if variant == "albert":  # the head decodes through the 128-wide embedding
        e = ALBERT_EMBEDDING
        return encoder_flops(LAYERS, h) + 6 * p * (h * h + h * e + e * VOCAB)
    if variant == "spanbert":  # SBO: two h-wide layers from [left; right; position] per target
        return encoder_flops(LAYERS, h) + mlm_head + 6 * p * (3 * h * h + h * h + h * VOCAB)
    if variant == "electra":
        g = int(h * GENERATOR_FRACTION)
        generator = encoder_flops(LAYERS, g) + 6 * p * (g * g + g * VOCAB)
        return generator + encoder_flops(LAYERS, h) + 6 * SEQ * (h * h + h)
    if variant == "distilbert":  # teacher forward (1/3 of its training FLOPs) + student
        teacher = (encoder_flops(LAYERS, h) + mlm_head) / 3
        return teacher + encoder_flops(LAYERS // 2, h) + mlm_head
    raise BertJaxError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")


def steps(variant: str) -> int:
    """Pretraining steps that spend BERT_STEPS BERT steps' FLOPs."""
    return round(BERT_STEPS * train_flops("bert") / train_flops(variant))


def get_config(variant: str = "bert") -> ml_collections.ConfigDict:
    check = variant.endswith("_check")
    variant = variant.removesuffix("_check")
    if variant not in VARIANTS:
        raise BertJaxError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)} "
                           "(optionally with _check)")
    objective = VARIANTS[variant][0]  # the masking is in the materialized batches
    c = e2e.pretrain_config("check" if check else "gpu")
    n = 20 if check else steps(variant)
    c.global_batch_size = 256  # the batches are materialized at 256 for both scales
    c.objective = objective
    c.num_train_steps = n
    c.optimizer.warmup_steps = n // 10
    c.checkpoint.every_steps = 10 if check else 500  # a run stopped between calls resumes
    c.checkpoint.keep = 1
    c.eval_every = n
    c.eval_steps = 0
    c.log_every = 100
    if VARIANTS[variant][1] == "full" and variant != "distilbert":
        # Single segments: segment B's embedding would stay untrained and then meet every
        # second sentence of a pair task. One token type, as RoBERTa has (the student keeps
        # its teacher's two).
        c.model.type_vocab_size = 1
    if variant == "albert":
        c.model.share_layers = True
        c.model.embedding_size = ALBERT_EMBEDDING
    if variant == "electra":
        c.electra.generator_fraction = GENERATOR_FRACTION
    if variant == "distilbert":  # half the teacher's layers (the e2e model names all six)
        c.model.num_hidden_layers = max(1, c.model.num_hidden_layers // 2)
    return c
