"""Experiment configs: the base pretraining ConfigDict, loading ``file.py:variant``, and
``--config.key=value`` overrides (typed, locked: a typo names the closest valid keys).

Experiment files (``experiments/pretrain.py``) start from :func:`base_config` and change
fields; :func:`load_config` imports the file, calls ``get_config(variant)``, locks it and
applies overrides.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import importlib.util
import os
from collections.abc import Callable, Sequence
from typing import Any

import ml_collections
from ml_collections import config_dict

from bert_jax.config import BertConfig, KernelOptions, get_preset, moved_field_message
from bert_jax.errors import BertJaxError
from bert_jax.parallel import DEFAULT_RULES
from bert_jax.training.validate import OBJECTIVES


def _model_section() -> ml_collections.ConfigDict:
    """``preset`` plus one typed placeholder per BertConfig field (None = the preset's), the
    kernel options as the sub-section ``kernels``."""
    model = _placeholders(BertConfig, skip=("kernels",))
    model.preset = "base"
    model.kernels = _placeholders(KernelOptions)
    return model


def _placeholders(cls, skip: tuple[str, ...] = ()) -> ml_collections.ConfigDict:
    section = ml_collections.ConfigDict()
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        if field.default is not None:
            kind = type(field.default)
        else:  # int | None, or a tile override (tuple | None)
            kind = tuple if str(field.type).startswith("tuple") else int
        section[field.name] = config_dict.placeholder(kind)
    return section


def base_config() -> ml_collections.ConfigDict:
    """BERT-Base phase 1 as in the paper; experiment variants change what differs."""
    c = ml_collections.ConfigDict()
    c.model = _model_section()
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
    c.data.masked_lm_prob = 0.15  # every batch is masked afresh (dynamic masking)
    # Of the masked tokens, the share shown as [MASK] and the share replaced by a random
    # token; the rest stay unchanged (BERT's 80/10/10).
    c.data.mask_token_fraction = 0.8
    c.data.random_token_fraction = 0.1
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
    c.data.span_p = 0.2
    c.data.max_span = 10
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

    c.optimizer = ml_collections.ConfigDict()
    c.optimizer.name = "adamw"  # adamw | lamb
    c.optimizer.learning_rate = 1e-4
    c.optimizer.warmup_steps = 10_000
    c.optimizer.decay = "linear"  # linear | polynomial | cosine | constant
    c.optimizer.decay_steps = -1  # -1: num_train_steps
    c.optimizer.end_learning_rate = 0.0
    c.optimizer.power = 1.0  # polynomial decay exponent
    c.optimizer.b1 = 0.9
    c.optimizer.b2 = 0.999
    c.optimizer.eps = 1e-6
    c.optimizer.weight_decay = 0.01  # never on LayerNorm parameters or biases
    c.optimizer.clip_norm = 1.0  # global-norm clipping; 0 disables

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
    # replicated parameters), auto (explicit where it applies). Explicit ran 1.4% faster on
    # 4 H200s (Large/128); FSDP with collective_overlap is faster still: the default stays.
    c.parallel.grad_reduce = "partitioner"
    # GPUs: `bert-jax pretrain` adds XLA's collective-overlap flags (bert_jax/xla_flags.py:
    # latency-hiding scheduler, pipelined all-gathers / reduce-scatters / all-reduces, 128 MiB
    # buckets) to XLA_FLAGS before the backend starts; flags XLA_FLAGS already names are kept.
    # FSDP Large/128 on 4 H200s with it: 95.6% of linear (docs/performance.md).
    c.parallel.collective_overlap = False

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
    fields = model_fields(config.model)
    if vocab_size is not None and "vocab_size" not in fields:
        fields["vocab_size"] = vocab_size
    kernels = fields.pop("kernels", {})
    model_cfg = get_preset(config.model.preset, **fields).with_kernels(**kernels)
    if config.get("objective") == "distill":
        from bert_jax.training.family import student_config

        model_cfg = student_config(config, model_cfg, fields)
    return model_cfg


def model_fields(model: ml_collections.ConfigDict) -> dict[str, Any]:
    """The fields a ``model`` section sets (not None), the kernel options as a dict under
    ``kernels`` (absent when none is set)."""
    fields = {k: v for k, v in model.items()
              if k not in ("preset", "kernels") and v is not None}
    kernels = {k: v for k, v in (model.get("kernels") or {}).items() if v is not None}
    if kernels:
        fields["kernels"] = kernels
    return fields


def pair_head(config: ml_collections.ConfigDict) -> bool:
    if config.objective not in OBJECTIVES:
        raise BertJaxError(f"objective={config.objective!r}: expected one of {OBJECTIVES}")
    return config.objective in ("nsp", "sop")


def decay_steps(config: ml_collections.ConfigDict) -> int:
    return config.num_train_steps if config.optimizer.decay_steps < 0 \
        else config.optimizer.decay_steps


# ---- loading and overrides ----------------------------------------------------------------
def load_config(spec: str, overrides: Sequence[str] = (),
                validate: Callable[[ml_collections.ConfigDict], None] | None = None
                ) -> ml_collections.ConfigDict:
    """``path/to/file.py[:variant]`` -> locked ConfigDict with ``--config.k=v`` overrides,
    checked by ``validate`` (default: a pretraining config's ranges, when the config is
    one; see ``bert_jax.training.validate``)."""
    path, _, variant = spec.partition(":")
    resolved = _find_file(path)
    module_spec = importlib.util.spec_from_file_location("_bert_jax_experiment", resolved)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except SyntaxError as e:
        raise BertJaxError(f"{resolved}:{e.lineno}: {e.msg}") from None
    if not hasattr(module, "get_config"):
        raise BertJaxError(f"{resolved}: defines no get_config(variant)")
    try:
        config = module.get_config(variant) if variant else module.get_config()
    except (ValueError, KeyError) as e:  # an unknown variant: the message lists the valid
        message = e.args[0] if e.args else type(e).__name__
        raise BertJaxError(f"{resolved}:{variant}: {message}") from None
    if not isinstance(config, ml_collections.ConfigDict):
        raise BertJaxError(f"{resolved}: get_config must return an ml_collections.ConfigDict")
    config.lock()
    apply_overrides(config, overrides)
    if validate is None and "objective" in config and "optimizer" in config:
        from bert_jax.training.validate import validate_pretraining as validate
    if validate is not None:
        validate(config)
    return config


def _find_file(path: str) -> str:
    """An experiment file: ``path`` as given (relative to the working folder), else under
    the checkout the package runs from, else among the configs installed with the package
    (``bert_jax/experiments/``, see setup.py). ``pretrain`` stands for
    ``experiments/pretrain.py``."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not path.endswith(".py") and os.sep not in path and "/" not in path:
        path = f"experiments/{path}.py"
    candidates = [path, os.path.join(os.path.dirname(package), path)]
    if path.startswith("experiments/"):
        candidates.append(os.path.join(package, path))
    for candidate in candidates:
        if os.path.isfile(candidate):  # local: an experiment config is Python source
            return candidate
    raise BertJaxError(f"{path}: experiment config file not found (give a path to a .py file, "
                       "or one of the shipped names: pretrain, glue, squad, ner, swag, custom, "
                       "e2e, feature_ner)")


def parse_override_args(args: Sequence[str]) -> list[tuple[str, str]]:
    """['--config.a.b=1', '--config.c', '2'] -> [('a.b', '1'), ('c', '2')]."""
    pairs, i = [], 0
    args = list(args)
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--config."):
            raise BertJaxError(f"unexpected argument {arg!r} (overrides look like "
                               "--config.optimizer.learning_rate=1e-4)")
        key, eq, value = arg[len("--config."):].partition("=")
        if not eq:
            if i + 1 >= len(args) or args[i + 1].startswith("--"):
                raise BertJaxError(f"{arg}: missing value")
            value = args[i + 1]
            i += 1
        pairs.append((key, value))
        i += 1
    return pairs


def apply_overrides(config: ml_collections.ConfigDict, overrides: Sequence[str]) -> None:
    """Sets each ``--config.key=value``, converting the string to the field's type."""
    seen: set[str] = set()
    for key, raw in parse_override_args(overrides):
        if key in seen:
            raise BertJaxError(f"--config.{key} is given twice")
        seen.add(key)
        parent, leaf = _lookup(config, key)
        if isinstance(parent[leaf], ml_collections.ConfigDict):
            raise BertJaxError(f"--config.{key} is a section; set one of its keys: "
                               f"{sorted(parent[leaf].keys())}")
        value = _convert(key, raw, parent.get_type(leaf), parent[leaf])
        try:
            parent[leaf] = value
        except (TypeError, ValueError) as e:
            raise BertJaxError(f"--config.{key}={raw}: {e}") from None


def all_keys(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
    out = []
    for k, v in config.items():
        name = f"{prefix}{k}"
        out += all_keys(v, name + ".") if isinstance(v, ml_collections.ConfigDict) else [name]
    return out


def _lookup(config: ml_collections.ConfigDict, key: str):
    node = config
    parts = key.split(".")
    for i, part in enumerate(parts):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            moved = (isinstance(node, ml_collections.ConfigDict) and "kernels" in node
                     and moved_field_message(part, f"--config.{'.'.join(parts[:i])}."))
            if moved:
                raise BertJaxError(moved)
            close = difflib.get_close_matches(key, all_keys(config), n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join('--config.' + c for c in close)}?" if close \
                else ""
            raise BertJaxError(f"--config.{key}: unknown config key"
                               f" {'.'.join(parts[:i + 1])!r}{hint}")
        if i == len(parts) - 1:
            return node, part
        node = node[part]
    raise AssertionError("unreachable")


_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _convert(key: str, raw: str, kind: type, current: Any) -> Any:
    def bad(expected: str):
        return BertJaxError(f"--config.{key}={raw!r}: expected {expected}")

    if raw in ("None", "none", "null") and (current is None or kind in (type(None),)):
        return None
    if kind is bool:
        if raw.lower() not in _BOOLS:
            raise bad("true or false")
        return _BOOLS[raw.lower()]
    if kind is int:
        try:
            return int(raw)
        except ValueError:
            raise bad("an integer") from None
    if kind is float:
        try:
            return float(raw)
        except ValueError:
            raise bad("a number") from None
    if kind is str:
        return raw
    if kind in (tuple, list):
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            raise bad("a Python tuple/list literal such as (10, 20)") from None
        if not isinstance(value, tuple | list):
            raise bad("a tuple or list")
        return kind(value)
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw
