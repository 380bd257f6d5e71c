"""Pretraining experiments: ``bert-jax pretrain --config experiments/pretrain.py:<variant>``.

Variants
  tiny                 2-layer 128-wide model at seq 128 on the CPU (a few hundred steps); give
                       it data with --config.data.directory (or --config.data.source=synthetic).
  demo                 `make demo`: the tiny model at seq 32, masked-LM only, tuned to learn
                       visibly within minutes on a 2-core CPU from the packaged demo corpus
                       (no dropout, 2,400 steps of 64 sequences of 32 tokens).
  bert_base_phase1     BERT paper recipe, seq 128, batch 256, 900k steps (90% of 1M), Adam 1e-4,
                       10k warmup, linear decay, weight decay 0.01.
  bert_base_phase2     seq 512, 100k steps (the last 10%); init_checkpoint = phase 1 workdir.
  bert_large_phase1/2  the same recipe for BERT-Large.
  lamb_large_batch     NVIDIA's LAMB recipe for BERT-Large phase 1: 64k global batch, lr 6e-3,
                       7,038 steps, 28.43% warmup, polynomial (power 0.5) decay.
  lamb_large_batch_phase2  its phase 2: 32k batch at seq 512, lr 4e-3, 1,563 steps, 12.8%
                       warmup.
  bert_large_lamb_phase1  You et al. (2019)'s large-batch LAMB recipe for BERT-Large, phase 1:
                       global batch 65,536 at seq 128 for 7,037 steps, lr 6e-3 with 2,000
                       warm-up steps, polynomial (power 0.5) decay; the batch is accumulated
                       in the largest micro-batch per chip that fits (microbatches=0, auto).
  bert_large_lamb_phase2  its phase 2: 32,768 at seq 512 for 1,563 steps, lr 4e-3, 200 warm-up
                       steps (re-warmed), init_checkpoint = phase 1 workdir.
  bert_base_lamb_phase1/2  the same two phases for BERT-Base.
  roberta_style        FULL-SENTENCES data, MLM only (no pair head), dynamic masking, RoBERTa
                       base hyperparameters (8k batch, lr 6e-4, b2 0.98, 500k steps).
  albert_base          ALBERT-Base: SOP, one shared layer, 128-wide factorized embeddings,
                       LAMB lr 0.00176, batch 4096, 125k steps at seq 512.
  spanbert_base        SpanBERT (Joshi et al. 2020): span masking (geometric lengths in words,
                       p=0.2, at most 10), MLM + span boundary objective, single segments of
                       512 tokens (FULL-SENTENCES data), no NSP; batch 256, lr 1e-4, 2.4M steps.
  ernie_base           ERNIE 1.0-style (Sun et al. 2019) knowledge masking: phrases and entities
                       masked as units (data from `create-pretraining-data --knowledge-units`),
                       a quarter of the sequences token-masked; BERT-Base recipe with NSP.
  electra_small        ELECTRA-Small (Clark et al. 2020): 12 layers, hidden 256, 4 heads,
                       128-wide embeddings shared with a 1/4-width generator; RTD weight 50;
                       batch 128, lr 5e-4, 1M steps, seq 128.
  electra_base         ELECTRA-Base: BERT-Base discriminator, 1/3-width generator; batch 256,
                       lr 2e-4, 766k steps, seq 512.
  distilbert           DistilBERT (Sanh et al. 2019): a student with every other layer of the
                       teacher (--config.distill.teacher=WORKDIR), soft targets at T=2, MLM and
                       a hidden-state cosine loss (5:2:1); batch 4096, lr 5e-4, seq 512.
All but tiny and ernie_base read document shards (`create-pretraining-data --format
documents`) and pair them in the pipeline every epoch: nsp for the BERT variants, sop for
albert_base, full_sentences for roberta_style, spanbert_base, electra_* and distilbert
(data.pairing; static reads pair shards). ernie_base reads pair shards made with
--knowledge-units (the units are annotated on finished examples).
Override anything with --config.<key>=<value>, e.g. --config.data.directory=DATA.
"""

from __future__ import annotations

import ml_collections

from bert_jax.training.config import base_config

VARIANTS = ("tiny", "demo", "bert_base_phase1", "bert_base_phase2", "bert_large_phase1",
            "bert_large_phase2", "bert_base_lamb_phase1", "bert_base_lamb_phase2",
            "bert_large_lamb_phase1", "bert_large_lamb_phase2", "lamb_large_batch",
            "lamb_large_batch_phase2",
            "roberta_style", "albert_base", "spanbert_base", "ernie_base", "electra_small",
            "electra_base", "distilbert")


def _sequences(c: ml_collections.ConfigDict, length: int, predictions: int) -> None:
    """Sequences of ``length`` tokens with at most ``predictions`` masked positions each."""
    c.data.max_seq_length = length
    c.data.max_predictions_per_seq = predictions


def _schedule(c: ml_collections.ConfigDict, *, steps: int, lr: float, warmup: int | None = None,
              batch: int | None = None, microbatches: int | None = None) -> None:
    """Steps and peak learning rate; the warmup, global batch and its microbatches where given
    (else base_config's)."""
    c.num_train_steps = steps
    c.optimizer.learning_rate = lr
    if warmup is not None:
        c.optimizer.warmup_steps = warmup
    if batch is not None:
        c.global_batch_size = batch
    if microbatches is not None:
        c.microbatches = microbatches


def _cadence(c: ml_collections.ConfigDict, *, checkpoint: int, log: int, eval_steps: int
             ) -> None:
    """CPU runs: a checkpoint every ``checkpoint`` steps, a loss line every ``log``, and
    ``eval_steps`` batches of evaluation every 100 steps."""
    c.checkpoint.every_steps = checkpoint
    c.log_every = log
    c.eval_every = 100
    c.eval_steps = eval_steps


def _phase2(c: ml_collections.ConfigDict) -> None:
    """The paper's last 10%: seq 512, 100k steps. The 1M-step linear schedule is at
    1e-4 * 100k / 990k when phase 1 ends; phase 2 continues it from there without warmup
    (its Adam moments start fresh, parameters come from init_checkpoint)."""
    _sequences(c, 512, 80)
    c.model.max_position_embeddings = 512
    _schedule(c, steps=100_000, lr=1e-4 * 100_000 / 990_000, warmup=0)


def _lamb(c: ml_collections.ConfigDict, batch: int, lr: float, steps: int, warmup: float,
          microbatch: int = 512) -> None:
    """NVIDIA's LAMB recipe: ``warmup`` a fraction of ``steps``, polynomial decay (power 0.5);
    the batch accumulated in microbatches of ``microbatch`` sequences (64k sequences do not
    fit at once)."""
    _schedule(c, steps=steps, lr=lr, warmup=int(round(warmup * steps)), batch=batch,
              microbatches=batch // microbatch)
    c.optimizer.name = "lamb"
    c.optimizer.decay = "polynomial"
    c.optimizer.power = 0.5
    c.optimizer.b2 = 0.999
    c.optimizer.weight_decay = 0.01
    c.optimizer.clip_norm = 1.0


def _you_lamb(c: ml_collections.ConfigDict, phase: int) -> None:
    """You et al. 2019 ("Large Batch Optimization for Deep Learning: Training BERT in 76
    minutes"), mixed-batch LAMB: phase 1 batch 65,536 at seq 128 for 7,037 steps, phase 2
    batch 32,768 at seq 512 for 1,563 steps (8,600 steps in all), warm-up again at the start
    of phase 2. Peak rates and warm-up lengths as NVIDIA publishes them for this recipe
    (6e-3 / 2,000 and 4e-3 / 200 steps), polynomial decay (power 0.5) to 0, weight decay
    0.01, clipping at global norm 1. The accumulation is found by compiling
    (microbatches=0): the largest micro-batch per chip that fits the chip; on a
    data-parallel mesh the gradients are reduced once per step (``grad_reduce="auto"``)."""
    if phase == 1:
        _schedule(c, steps=7_037, lr=6e-3, warmup=2_000, batch=65_536, microbatches=0)
    else:
        _schedule(c, steps=1_563, lr=4e-3, warmup=200, batch=32_768, microbatches=0)
        _sequences(c, 512, 80)
        c.model.max_position_embeddings = 512
    c.optimizer.name = "lamb"
    c.optimizer.decay = "polynomial"
    c.optimizer.power = 0.5
    c.optimizer.b2 = 0.999
    c.optimizer.weight_decay = 0.01
    c.optimizer.clip_norm = 1.0
    c.model.scan_layers = True  # one layer compiled instead of 12 or 24; the same math
    # Data parallel: the gradients summed once per step, after the accumulation loop, not
    # once per microbatch inside it (the partitioner's way: 16-32 all-reduces a step on
    # v4-64); FSDP and tensor parallel meshes keep the partitioner's reduction.
    c.parallel.grad_reduce = "auto"


def get_config(variant: str = "tiny") -> ml_collections.ConfigDict:
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose one of {VARIANTS}")
    c = base_config()
    if variant == "tiny":
        c.model.preset = "tiny"
        c.model.max_position_embeddings = 128
        _schedule(c, steps=300, lr=1e-3, warmup=30, batch=32)
        _cadence(c, checkpoint=100, log=20, eval_steps=4)
    elif variant == "demo":
        # A 0.2 MB corpus and a few CPU minutes: short sequences (more of them per second, and
        # fewer positions to attend over), no dropout (nothing to regularize yet), masked-LM
        # only. The held-out loss sits on the unigram plateau for the first ~800 steps (the
        # model learns token frequencies and to copy the unchanged 10%); the context (names
        # after "Sir", "Lady", "Captain") comes after it, so the run is 2,400 steps
        # (docs/pretraining.md, "The demo"). Data: `bert-jax create-pretraining-data
        # --max-seq-length 32`; 64 positions, so that fine-tuning can use longer sentences.
        c.model.preset = "tiny"
        c.model.max_position_embeddings = 64
        c.model.hidden_dropout_prob = 0.0
        c.model.attention_probs_dropout_prob = 0.0
        c.objective = "mlm"
        _sequences(c, 32, 5)
        _schedule(c, steps=2400, lr=1e-3, warmup=100, batch=64)
        _cadence(c, checkpoint=800, log=100, eval_steps=8)
        c.eval_every = 400
    elif variant.startswith(("bert_base_lamb", "bert_large_lamb")):
        c.model.preset = variant.split("_")[1]
        _you_lamb(c, 1 if variant.endswith("phase1") else 2)
    elif variant.startswith(("bert_base", "bert_large")):
        c.model.preset = variant.split("_")[1]
        if c.model.preset == "large":
            # 24 layers scanned: the same math, one layer compiled instead of 24 (a v5p-128
            # step compiles in ~35 s instead of ~130 s on 2 cores); checkpoints load either way.
            c.model.scan_layers = True
        if variant.endswith("phase2"):
            _phase2(c)
    elif variant == "lamb_large_batch":
        c.model.preset = "large"
        _lamb(c, batch=65_536, lr=6e-3, steps=7_038, warmup=0.2843)
    elif variant == "lamb_large_batch_phase2":
        c.model.preset = "large"
        _lamb(c, batch=32_768, lr=4e-3, steps=1_563, warmup=0.128, microbatch=128)
        _sequences(c, 512, 80)
    elif variant == "roberta_style":
        c.model.preset = "base"
        c.objective = "mlm"
        _sequences(c, 512, 77)
        _schedule(c, steps=500_000, lr=6e-4, warmup=24_000, batch=8_192, microbatches=16)
        c.optimizer.b2 = 0.98
        c.optimizer.eps = 1e-6
    elif variant == "albert_base":
        c.model.preset = "albert_base"
        c.objective = "sop"
        _sequences(c, 512, 20)
        _schedule(c, steps=125_000, lr=0.00176, warmup=3_125, batch=4_096, microbatches=8)
        c.optimizer.name = "lamb"
    elif variant == "spanbert_base":
        c.model.preset = "base"
        c.objective = "sbo"
        c.data.masking = "span"
        _sequences(c, 512, 77)
        c.num_train_steps = 2_400_000
    elif variant == "ernie_base":
        c.model.preset = "base"
        c.data.masking = "knowledge"
    elif variant == "electra_small":
        c.objective = "electra"
        c.model.preset = "small"
        c.model.num_hidden_layers = 12
        c.model.hidden_size = 256
        c.model.num_attention_heads = 4
        c.model.intermediate_size = 1024
        c.model.embedding_size = 128
        c.electra.generator_fraction = 0.25
        _schedule(c, steps=1_000_000, lr=5e-4, batch=128)
    elif variant == "electra_base":
        c.objective = "electra"
        c.model.preset = "base"
        c.electra.generator_fraction = 1 / 3
        _sequences(c, 512, 77)
        _schedule(c, steps=766_000, lr=2e-4)
    elif variant == "distilbert":
        c.model.preset = "base"  # the student's architecture comes from the teacher
        c.objective = "distill"
        _sequences(c, 512, 77)
        _schedule(c, steps=100_000, lr=5e-4, warmup=5_000, batch=4_096, microbatches=8)
    if variant not in ("tiny", "demo"):
        c.model.dtype = "bfloat16"  # bf16 compute; parameters and optimizer state stay fp32
        # Document shards (create-pretraining-data --format documents), paired afresh every
        # epoch; --config.data.pairing=static reads pair shards instead.
        c.data.pairing = {"nsp": "nsp", "sop": "sop", "mlm": "full_sentences", "sbo":
                          "full_sentences", "electra": "full_sentences",
                          "distill": "full_sentences"}[c.objective]
        if c.data.masking == "knowledge":  # the units are annotated in pair shards only
            c.data.pairing = "static"
    return c
