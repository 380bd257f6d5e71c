"""The fine-tuning run config: its fields and defaults, loading an experiment file with
``--config.key=value`` overrides, and reading the config a finished run stored.

Names shared with pretraining (``bert_jax.training.config``; the ``model`` and ``optimizer``
sections come from ``bert_jax.runs.config``) mean the same there and here:
``global_batch_size``, ``seed``, ``init_checkpoint``, ``log_every``, the ``model`` section, the
``optimizer`` section (``optimizer.learning_rate``, ``b1``, ``b2``, ``eps``, ``weight_decay``,
``clip_norm``, ``warmup_steps``, ``decay``...) and ``parallel.mesh`` /
``parallel.logical_axis_rules``. Fine-tuning adds ``optimizer.warmup_proportion``: with
``optimizer.warmup_steps=-1`` (the default) the warmup is that fraction of the run's steps,
which depend on the data. Keys of the earlier flat schema (``learning_rate``, ``adam_b1``,
``batch_size``, ``mesh``...) are refused with their new name; a stored run that used them
still loads (:func:`config_from_dict` maps them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ml_collections
from ml_collections import config_dict

from bert_jax import parallel
from bert_jax.config import with_kernel_options_nested
from bert_jax.errors import BertJaxError
from bert_jax.finetuning.validate import validate_finetuning
from bert_jax.runs import config as config_lib

# Keys of the earlier flat fine-tuning schema -> their names now (those of pretraining).
RENAMED_KEYS = {
    "learning_rate": "optimizer.learning_rate",
    "adam_b1": "optimizer.b1",
    "adam_b2": "optimizer.b2",
    "adam_eps": "optimizer.eps",
    "weight_decay": "optimizer.weight_decay",
    "clip_norm": "optimizer.clip_norm",
    "warmup_proportion": "optimizer.warmup_proportion",
    "mesh": "parallel.mesh",
    "logical_axis_rules": "parallel.logical_axis_rules",
    "batch_size": "global_batch_size",
}
# Stored sections kept whole (their keys are the task's options, not schema fields).
_OPEN_SECTIONS = ("featurize", "postprocess")


def base_config() -> ml_collections.ConfigDict:
    """Fine-tuning as in the BERT paper; experiments/*.py change what a task needs."""
    c = ml_collections.ConfigDict()
    c.task = ""  # a bert_jax.tasks name: cola sst2 mrpc stsb qqp mnli qnli rte wnli squad_v1 ...
    # Data: local files in their original format under data_dir (the task or GLUE root
    # folder), or one file per split; or tensorflow-datasets (tfds=True, needs tensorflow).
    c.data_dir = config_dict.placeholder(str)
    c.train_file = config_dict.placeholder(str)
    c.dev_file = config_dict.placeholder(str)
    c.test_file = config_dict.placeholder(str)
    c.tfds = False
    c.tfds_data_dir = config_dict.placeholder(str)
    # With tfds: fetch and prepare the dataset into tfds_data_dir first (needs internet and
    # the tensorflow-datasets package; later runs find it prepared and download nothing).
    c.tfds_download = False
    c.on_error = "raise"  # malformed rows: raise (default) or skip (counted and logged)
    # Without a dev file, this fraction of train becomes the dev split (by row; SQuAD by
    # article), drawn with holdout_seed (kept apart from `seed` so repeated runs share it).
    c.holdout_fraction = 0.1
    c.holdout_seed = 1234
    c.max_train_examples = 0  # > 0: a seeded subsample of train (after the holdout)
    c.max_seq_length = 128
    c.featurize = ml_collections.ConfigDict()  # task.featurize options (SQuAD: doc_stride...)
    # Sequence packing (docs/finetuning.md, "Sequence packing"): training rows of several
    # examples each (at most max_examples_per_row, attention confined to each example), so
    # short examples stop paying for padding. Classification and regression tasks (GLUE)
    # only; evaluation and prediction stay one row per example.
    c.packing = False
    c.max_examples_per_row = 8
    c.postprocess = ml_collections.ConfigDict()  # task.postprocess options (SQuAD: n-best...)

    # Model: init_checkpoint restores the encoder (bert-jax model dir or workdir, or a
    # Hugging Face directory); "" = random init from model.preset with `tokenizer`.
    c.init_checkpoint = ""
    c.tokenizer = config_dict.placeholder(str)  # default: the checkpoint's tokenizer
    c.model = config_lib.model_section()  # preset + BertConfig fields (None = keep)
    c.model.hidden_dropout_prob = 0.1
    c.model.attention_probs_dropout_prob = 0.1
    c.freeze_encoder = False  # feature-based: train only the head
    # Comma-separated parameter path prefixes of the encoder (e.g. "bert/pooler") that start
    # freshly initialised instead of from init_checkpoint.
    c.reinitialize = ""
    # The head's input (modeling/feature_heads.py): last second_to_last embeddings sum4 last4
    # mix4 sum_all mix; and for token tasks a linear head or a BiLSTM tagger on those features.
    c.feature_layers = "last"
    c.feature_head = "linear"  # linear | bilstm
    c.lstm_hidden_size = 768  # units per direction of the BiLSTM tagger
    c.lstm_layers = 2
    # Task-specific distillation (finetuning/distill.py): a fine-tuned teacher workdir of the same
    # task; its logits on the train set are soft labels mixed in with weight distill_alpha.
    c.distill_from = ""
    c.distill_temperature = 2.0
    c.distill_alpha = 0.5

    c.global_batch_size = 32  # sequences per optimizer step, over all processes
    c.eval_batch_size = 64
    c.epochs = 3
    c.seed = 0  # head init, dropout, data order

    # The pretraining optimizer section: AdamW (no weight decay on LayerNorm parameters or
    # biases), linear warmup then linear decay to 0 over the run, global-norm clipping.
    c.optimizer = config_lib.optimizer_section()
    c.optimizer.learning_rate = 2e-5
    c.optimizer.warmup_steps = -1  # -1: warmup_proportion of the run's steps
    c.optimizer.warmup_proportion = 0.1
    c.optimizer.decay_steps = -1  # -1: the run's steps (epochs x steps per epoch)

    # Data-parallel over all devices by default (the pretraining mesh machinery).
    c.parallel = ml_collections.ConfigDict()
    c.parallel.mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1})
    c.parallel.logical_axis_rules = parallel.DEFAULT_RULES
    c.log_every = 100  # steps; the loss is fetched from the device only then
    # Tasks from your own files (tasks/custom.py, experiments/custom.py): the columns to read
    # and the label set (empty: inferred from train, then stored here with the model).
    c.text_column = ""
    c.text_pair_column = ""
    c.label_column = "label"
    c.labels = ""  # label names in id order: a,b,c or a JSON list (for names with commas)
    c.file_format = ""  # csv | tsv | jsonl; empty: from the file's extension

    # Speed (docs/finetuning.md, "Speed"). Sequences are grouped by length into batches of a
    # few static lengths: powers of two from length_bucket_min up to max_seq_length (0: every
    # batch max_seq_length). Padding never changes a masked BERT's outputs.
    c.length_bucket_min = 32
    # A bucket shorter than max_seq_length is kept only when the run trains at least this many
    # sequences in it (rows that fit it x epochs); smaller ones join the next longer bucket.
    # Each bucket is one more train and predict program to compile, which costs more than the
    # padding it saves on a GLUE-sized task (docs/finetuning.md, "Speed"). 0: every bucket.
    c.length_bucket_min_sequences = 200_000
    # The kernel choices the model config leaves to `auto` (model.kernels.attention_impl,
    # dropout_attention_impl, layer_norm_impl, fused_gelu) take bert-jax's Pallas kernels and
    # cuDNN's attention only in a run that trains at least this many sequences (rows x
    # epochs), else XLA's own ops: the kernels' tracing, lowering and loading is a fixed cost
    # a run, paid back only over a long run (docs/performance.md). 0: always the kernels.
    c.kernel_min_sequences = 200_000
    # A run that trains fewer sequences than this (rows x epochs) scans the encoder layers
    # (one layer's code, compiled once: a short run's compile dominates) unless
    # model.scan_layers is set; over a long run unrolled layers' faster steps pay more
    # (docs/performance.md). The saved model keeps the checkpoint's layout. 0: never.
    c.unroll_min_sequences = 200_000
    # GPUs: cuBLAS for every matmul instead of XLA's Triton GEMM fusions, whose autotuning
    # lengthens a first compilation for no faster step (docs/performance.md).
    # `bert-jax finetune` sets it in XLA_FLAGS before the backend starts, unless XLA_FLAGS
    # already names --xla_gpu_enable_triton_gemm.
    c.triton_gemm = False
    # Compiled programs kept in $BERT_JAX_CACHE/xla (bert_jax/compilation_cache.py).
    c.compilation_cache = True
    # Every program of the run (the train step and the predict step at each length bucket)
    # compiles as soon as the train state exists, several at once in background threads,
    # instead of each at its first call, one after another. Same programs either way.
    c.compile_ahead = True
    # A tqdm bar with ETA over all steps (process 0); train loss and dev metrics also go to
    # WORKDIR/tensorboard/ and WORKDIR/metrics.jsonl.
    c.progress_bar = True
    return c


def renamed_key_message(key: str) -> str | None:
    """"config key 'X' was renamed to 'Y'" for a key of the earlier schema, else None."""
    head, dot, rest = key.partition(".")
    if head not in RENAMED_KEYS:
        return None
    return f"config key {key!r} was renamed to {RENAMED_KEYS[head] + dot + rest!r}"


def check_overrides(overrides: Sequence[str]) -> None:
    """Refuses ``--config.<old key>=...`` overrides with the key's new name."""
    for key, _ in config_lib.parse_override_args(overrides):
        message = renamed_key_message(key)
        if message:
            raise BertJaxError(f"--config.{key}: {message}")


def apply_overrides(config: ml_collections.ConfigDict, overrides: Sequence[str]) -> None:
    """Applies ``--config.k=v`` overrides and range-checks the result."""
    check_overrides(overrides)
    config_lib.apply_overrides(config, overrides)
    validate_finetuning(config)


def load_config(spec: str, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
    """``experiments/<file>.py[:variant]`` -> locked run config with overrides applied; an
    experiment file that sets a key of the earlier schema fails naming the file."""
    check_overrides(overrides)
    path = spec.partition(":")[0]
    try:
        config = config_lib.load_config(spec)
    except AttributeError as e:  # e.g. `c.mesh.data = 1` on a section that moved
        message = renamed_key_message(str(e).strip("\"'"))
        if message is None:
            raise
        raise BertJaxError(f"{path}: {message}") from None
    for key in config.keys():
        message = renamed_key_message(key)
        if message:
            raise BertJaxError(f"{path}: {message}")
    config_lib.apply_overrides(config, overrides)
    validate_finetuning(config)
    return config


# ---- stored runs ------------------------------------------------------------------------------
def config_from_dict(values: dict[str, Any], source: str = "stored run config"
                     ) -> ml_collections.ConfigDict:
    """A stored run config (``config.to_dict()`` through JSON) -> locked, typed ConfigDict.

    Runs stored with the earlier flat schema load too: their keys are mapped to the new names
    (the kernel options, once ``model.<field>``, to ``model.kernels.<field>``).
    """
    config = base_config()
    known = set(config_lib.all_keys(config))
    if isinstance(values.get("model"), dict):  # kernel options stored at the model's top
        values = {**values, "model": with_kernel_options_nested(values["model"])}
    flat = {}
    for key, value in _flatten_dict(values).items():
        head, dot, rest = key.partition(".")
        if head in RENAMED_KEYS:
            key = RENAMED_KEYS[head] + dot + rest
        if key not in known and key.partition(".")[0] not in _OPEN_SECTIONS:
            raise BertJaxError(f"{source}: unknown fine-tuning config key {key!r}")
        flat[key] = value
    try:
        config.update_from_flattened_dict(flat)
    except (KeyError, TypeError, ValueError) as e:
        raise BertJaxError(f"{source}: {e}") from None
    config.lock()
    return config


def _flatten_dict(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and k not in _OPEN_SECTIONS:
            out.update(_flatten_dict(v, f"{prefix}{k}."))
        elif isinstance(v, dict):
            out[f"{prefix}{k}"] = ml_collections.ConfigDict(v)
        else:
            out[f"{prefix}{k}"] = _tuples(v) if k == "logical_axis_rules" else v
    return out


def _tuples(value):
    """JSON lists back to the tuples they were stored from."""
    return tuple(map(_tuples, value)) if isinstance(value, list | tuple) else value
