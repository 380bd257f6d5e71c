"""The pretraining config: the base ConfigDict every ``experiments/pretrain.py`` variant
starts from, the objects derived from it, and loading a pretraining experiment (the shared
loader and overrides of ``bert_jax.runs.config``, then the pretraining range checks).
"""

from __future__ import annotations

from collections.abc import Sequence

import ml_collections
from ml_collections import config_dict

from bert_jax.config import BertConfig
from bert_jax.data.mask_settings import MaskSettings
from bert_jax.errors import BertJaxError
from bert_jax.parallel import DEFAULT_RULES
from bert_jax.runs import config as runs_config
from bert_jax.training.validate import OBJECTIVES, validate_pretraining


def base_config() -> ml_collections.ConfigDict:
    """BERT-Base phase 1 as in the paper; experiment variants change what differs."""
    c = ml_collections.ConfigDict()
    c.model = runs_config.model_section()
    # nsp: MLM + next-sentence prediction; sop: MLM + sentence order (ALBERT); mlm: MLM only;
    # sbo: MLM + SpanBERT's span boundary objective; electra: generator MLM + replaced-token
    # detection; distill: DistilBERT's student/teacher losses (see training/objectives.py).
    c.objective = "nsp"
    # objective=sbo: relative positions inside a masked run embedded for the span boundary
    # head (longer runs share the last; SpanBERT's spans are at most 10 words).
    c.sbo_max_relative_position = 32
    c.electra = ml_collections.ConfigDict()
    # Generator hidden size as a fraction of the discriminator's (ELECTRA: Small 1/4, Base
    # 1/3, Large 1/4); same depth, and it shares the token and position embeddings.
    c.electra.generator_fraction = 0.25
    c.electra.rtd_weight = 50.0  # lambda of loss = MLM_gen + lambda * RTD (paper: 50)
    c.distill = ml_collections.ConfigDict()
    # The teacher: a pretraining workdir, step dir or model dir; the student (model.*) starts
    # from its embeddings, MLM head and every other layer (DistilBERT).
    c.distill.teacher = config_dict.placeholder(str)
    c.distill.temperature = 2.0
    # Loss = MLM + alpha_kd * KL(teacher || student) * T^2 + alpha_cos * (1 - cosine of the
    # last hidden states); DistilBERT's 5 : 2 : 1 (kd : mlm : cos) with MLM at 1.
    c.distill.alpha_kd = 2.5
    c.distill.alpha_cos = 0.5

    c.data = ml_collections.ConfigDict()
    # auto: what data.directory holds (TFRecord shards or materialized batches); synthetic:
    # random token ids, only when named here (smoke tests, benchmarks).
    c.data.source = "auto"  # auto | tfrecord | materialized | synthetic
    # tfrecord: output of `bert-jax create-pretraining-data`; materialized: of
    # `bert-jax materialize-batches`.
    c.data.directory = config_dict.placeholder(str)
    # The tokenizer the data was made with (required for tfrecord): checked against the
    # data's metadata.json and copied into WORKDIR/tokenizer for fine-tuning and export.
    c.data.tokenizer = config_dict.placeholder(str)
    c.data.max_seq_length = 128
    c.data.max_predictions_per_seq = 20
    # The share of tokens masked, BERT's 15%: every batch is masked afresh (dynamic masking).
    c.data.masked_lm_prob = MaskSettings.mask_rate
    # Of the masked tokens, the share shown as [MASK] and the share replaced by a random
    # token; the rest stay unchanged (BERT's 80/10/10).
    c.data.mask_token_fraction = MaskSettings.mask_token_fraction
    c.data.random_token_fraction = MaskSettings.random_token_fraction
    c.data.whole_word_masking = False  # same as masking="whole_word"
    # static: the pairs stored in the shards (create-pretraining-data --format pairs);
    # nsp | sop | full_sentences | doc_sentences: document shards (--format documents) paired
    # afresh every epoch in the pipeline (docs/data.md).
    c.data.pairing = "static"
    c.data.short_seq_prob = 0.1  # nsp/sop pairing: chance of a shorter target length
    # Document shards: pack up to this many examples (at their natural lengths) into each row
    # of max_seq_length, attention confined to each example; 0: one example a row. Pair
    # shards are packed when created (create-pretraining-data --pack) and say so themselves.
    c.data.max_examples_per_row = 0
    # token | whole_word | span (SpanBERT: geometric span lengths in words, p=span_p, at most
    # max_span words, one 80/10/10 draw per span) | knowledge (ERNIE: phrases and entities
    # annotated by `create-pretraining-data --knowledge-units` masked as units, with
    # basic_masking_fraction of the sequences masked token by token). tfrecord data only.
    c.data.masking = "token"
    c.data.span_p = MaskSettings.span_p
    c.data.max_span = MaskSettings.max_span
    # ERNIE mixes basic-level (token) masking with phrase/entity masking; the paper trains
    # the levels in stages, here a fixed share of sequences per batch.
    c.data.basic_masking_fraction = 0.25
    c.data.shuffle_buffer = 10_000
    c.data.seed = 0
    # Seconds to wait for one batch before the run stops with an error (a stalled input
    # pipeline: unreadable files, a hung filesystem); 0 waits forever.
    c.data.wait_timeout_s = 600.0
    # materialized: cycle back to the first batch (the same masks again) when the batches run
    # out, instead of stopping; and the held-out batches for evaluation (`bert-jax
    # materialize-batches --split eval`; unset: evaluate on data.directory's first batches).
    c.data.repeat = False
    c.data.eval_directory = config_dict.placeholder(str)

    c.global_batch_size = 256  # sequences per optimizer step, over all processes
    c.microbatches = 1  # gradient accumulation: the step runs this many slices of the batch
    c.num_train_steps = 900_000
    c.seed = 0  # parameter init and dropout
    # Start from another run's parameters (phase 2 from phase 1): a workdir, step dir or
    # model dir. Optimizer state and step start fresh.
    c.init_checkpoint = config_dict.placeholder(str)

    c.optimizer = runs_config.optimizer_section()

    c.parallel = ml_collections.ConfigDict()
    # Per-slice (ICI) mesh; -1 takes the remaining devices. FSDP: fsdp=-1; TP: tensor=N.
    c.parallel.mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1})
    # Across slices / hosts (DCN), multiplied with the ICI sizes.
    c.parallel.dcn_mesh = ml_collections.ConfigDict({"data": 1, "fsdp": 1, "tensor": 1})
    c.parallel.logical_axis_rules = DEFAULT_RULES
    # Sharded (FSDP) matmul kernels reach their all-gathers as stored (param_dtype) or cast to
    # the compute dtype where they live (compute_dtype: half the bytes in bf16; gradients are
    # still reduce-scattered in float32). No effect on replicated parameters.
    c.parallel.param_gather = "param_dtype"
    # Who sums the gradients over the batch shards: partitioner (XLA, per contribution: the
    # tied word embeddings' two contributions are all-reduced apart), explicit (one psum of
    # the whole gradient tree after the backward pass, so they are reduced once; needs
    # replicated parameters), auto (explicit where it applies). FSDP with collective_overlap
    # is faster than either (docs/performance.md, "Data parallel and FSDP on one host"): the
    # default stays.
    c.parallel.grad_reduce = "partitioner"
    # GPUs: `bert-jax pretrain` adds XLA's collective-overlap flags (bert_jax/xla_flags.py:
    # latency-hiding scheduler, pipelined all-gathers / reduce-scatters / all-reduces, 128 MiB
    # buckets) to XLA_FLAGS before the backend starts; flags XLA_FLAGS already names are kept
    # (its scaling: docs/performance.md).
    c.parallel.collective_overlap = False
    # TPUs: XLA may compute a matmul with a sharded operand as a windowed collective matmul
    # (a loop of collective-permutes, one window an iteration). allowed: XLA decides; off:
    # the step compiles without them (bert_jax/xla_flags.py), its gathers and
    # reduce-scatters whole; auto: off on an FSDP mesh without tensor parallelism, where
    # XLA's windowed loops re-read and re-write whole activations every window (v4 FSDP:
    # 43% against 99% MFU at the LAMB recipe, docs/tpu.md). Other platforms ignore it.
    c.parallel.tpu_collective_matmul = "auto"

    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.every_steps = 5_000
    c.checkpoint.keep = 3
    c.checkpoint.async_save = True

    c.log_every = 100  # metrics are fetched from the device only at these steps
    c.eval_every = 10_000
    c.eval_steps = 100  # batches of held-out data per evaluation (0: no evaluation)
    c.profile_steps = ()  # (first, last): jax.profiler trace of steps [first, last)
    # bf16 matmul peak per device in TFLOP/s for MFU; None: known accelerators' data sheet.
    c.peak_tflops = config_dict.placeholder(float)
    c.max_skipped_in_row = 10  # stop after this many consecutive non-finite steps
    # A step with a non-finite loss or gradient norm is skipped. True: also skip one whose new
    # parameters or optimizer state would be non-finite (a damaged Adam moment), at the cost
    # of one more pass over parameters, gradients and moments per step (docs/pretraining.md).
    c.check_update = False
    c.progress_bar = True
    return c


# ---- derived objects ----------------------------------------------------------------------
def model_config(config: ml_collections.ConfigDict, vocab_size: int | None = None
                 ) -> BertConfig:
    """The BertConfig: preset, then the data's vocabulary size, then explicit fields."""
    model_cfg = runs_config.model_config(config, vocab_size)
    if config.get("objective") == "distill":
        from bert_jax.training.family import student_config

        model_cfg = student_config(config, model_cfg, runs_config.model_fields(config.model))
    return model_cfg


def pair_head(config: ml_collections.ConfigDict) -> bool:
    if config.objective not in OBJECTIVES:
        raise BertJaxError(f"objective={config.objective!r}: expected one of {OBJECTIVES}")
    return config.objective in ("nsp", "sop")


def decay_steps(config: ml_collections.ConfigDict) -> int:
    return config.num_train_steps if config.optimizer.decay_steps < 0 \
        else config.optimizer.decay_steps


def load_config(spec: str, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
    """A pretraining experiment ``path/to/file.py[:variant]`` -> locked ConfigDict with
    ``--config.k=v`` overrides, range-checked (``bert_jax.training.validate``)."""
    return runs_config.load_config(spec, overrides, validate=validate_pretraining)
