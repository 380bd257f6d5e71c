"""``bert-jax finetune | evaluate | predict``: fine-tuning runs end to end.

``finetune(config, workdir)`` reads the task data (local files in their original format, or
tensorflow-datasets), holds out a dev split from train when there is no dev file, restores
the encoder from ``init_checkpoint`` (a bert-jax model dir or workdir, or a Hugging Face
directory) into a freshly initialised head, or starts from random weights, trains with AdamW
and a linear warmup/decay, evaluates after every epoch with the task's official metrics and
keeps the best epoch in WORKDIR as a bert-jax model directory::

    WORKDIR/config.json   model config + {"task", "num_labels", "finetune": the run config,
                          "best": {epoch, metrics}}
    WORKDIR/params/       the best epoch's parameters
    WORKDIR/tokenizer/
    WORKDIR/metrics.json  per-epoch train loss, dev metrics, timings; best and final

``evaluate`` and ``predict`` rebuild the same splits from the stored run config.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from ml_collections import config_dict

from bert_jax import parallel
from bert_jax.checkpoint import store
from bert_jax.config import BertConfig
from bert_jax.errors import BertJaxError
from bert_jax.modeling.params import flatten_params, merge_pretrained, to_layout
from bert_jax.tasks import read_tfds
from bert_jax.tasks.base import ExampleList, Task, resolve_file, write_json
from bert_jax.tasks.registry import get_task
from bert_jax.tasks.splits import split_examples, squad_articles
from bert_jax.tasks.trainer import (
    HEAD_NAMES,
    Finetuner,
    build_model,
    make_tx,
    model_outputs,
    num_rows,
)
from bert_jax.training import config as config_lib

METRICS_FILE = "metrics.json"
# Model fields a fine-tuning run may change on a checkpoint's config; every other field must
# match the checkpoint (it decides the encoder's shapes and function).
RUNTIME_FIELDS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "dtype",
                  "param_dtype", "attention_impl", "dropout_attention_impl",
                  "hidden_dropout_impl", "dropout_hash", "qkv_projection", "layer_norm_impl",
                  "residual_dtype", "scan_layers", "remat_policy", "initializer_range")


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
    c.on_error = "raise"  # malformed rows: raise (default) or skip (counted and logged)
    # Without a dev file, this fraction of train becomes the dev split (by row; SQuAD by
    # article), drawn with holdout_seed (kept apart from `seed` so repeated runs share it).
    c.holdout_fraction = 0.1
    c.holdout_seed = 1234
    c.max_train_examples = 0  # > 0: a seeded subsample of train (after the holdout)
    c.max_seq_length = 128
    c.featurize = ml_collections.ConfigDict()  # task.featurize options (SQuAD: doc_stride...)
    c.postprocess = ml_collections.ConfigDict()  # task.postprocess options (SQuAD: n-best...)

    # Model: init_checkpoint restores the encoder (bert-jax model dir or workdir, or a
    # Hugging Face directory); "" = random init from model.preset with `tokenizer`.
    c.init_checkpoint = ""
    c.tokenizer = config_dict.placeholder(str)  # default: the checkpoint's tokenizer
    c.model = config_lib.base_config().model  # preset + BertConfig fields (None = keep)
    c.model.hidden_dropout_prob = 0.1
    c.model.attention_probs_dropout_prob = 0.1
    c.freeze_encoder = False  # feature-based: train only the head

    # Optimization: AdamW, linear warmup then linear decay to 0.
    c.batch_size = 32
    c.eval_batch_size = 64
    c.epochs = 3
    c.learning_rate = 2e-5
    c.warmup_proportion = 0.1
    c.weight_decay = 0.01  # never on LayerNorm parameters or biases
    c.adam_b1 = 0.9
    c.adam_b2 = 0.999
    c.adam_eps = 1e-6
    c.clip_norm = 1.0
    c.seed = 0  # head init, dropout, data order

    # Data-parallel over all devices by default (the pretraining mesh machinery).
    c.mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1})
    c.logical_axis_rules = parallel.DEFAULT_RULES
    c.log_every = 100  # steps; the loss is fetched from the device only then
    return c


def _log(message: str) -> None:
    if jax.process_index() == 0:
        print(message, flush=True)


# ---- data -----------------------------------------------------------------------------------
def _split_filenames(task: Task) -> dict[str, Sequence[str]]:
    """File names a task looks for per split (GLUE: its spec; others: their table)."""
    spec = getattr(task, "spec", None)
    return spec.split_files if spec is not None else getattr(task, "_files", {})


def read_split(task: Task, config, split: str) -> ExampleList:
    """One split from tensorflow-datasets or from local files."""
    if config.tfds:
        return read_tfds(task.tfds_name or task.name, split, data_dir=config.tfds_data_dir)
    files = {"train": config.train_file, "dev": config.dev_file}.get(split)
    if split.startswith("test") and config.test_file:
        files = config.test_file
    return task.read(split, data_dir=config.data_dir, files=files or None,
                     on_error=config.on_error)


def _has_dev_files(task: Task, config) -> bool:
    if config.tfds or config.dev_file:
        return True
    names = _split_filenames(task)
    if not config.data_dir or not task.eval_splits:
        return False
    subdirs = (task.spec.folder,) if hasattr(task, "spec") else ()
    try:
        for split in task.eval_splits:
            resolve_file(split, names, config.data_dir, None, subdirs)
    except BertJaxError:
        return False
    return True


def _holdout_groups(task: Task, config, train: ExampleList) -> list | None:
    """SQuAD: the article of each question (no article in both splits); others: by row."""
    if task.kind != "span":
        return None
    if config.tfds:
        return [ex.context for ex in train]  # tfds has no article index: keep paragraphs whole
    path = config.train_file or resolve_file("train", _split_filenames(task), config.data_dir,
                                             None)
    articles = squad_articles(path)
    return [articles[ex.qas_id] for ex in train]


def train_and_dev(task: Task, config) -> tuple[ExampleList, dict[str, ExampleList], str]:
    """(train, {eval split: examples}, where dev came from)."""
    train = read_split(task, config, "train")
    if _has_dev_files(task, config):
        devs = {split: read_split(task, config, split) for split in task.eval_splits}
        source = "dev files"
    else:
        if config.holdout_fraction <= 0:
            raise BertJaxError(f"{task.name}: no dev file found (data_dir={config.data_dir}, "
                               "dev_file unset) and holdout_fraction=0; set "
                               "--config.holdout_fraction=0.1 to hold out dev from train")
        train, dev = split_examples(train, config.holdout_fraction, config.holdout_seed,
                                    _holdout_groups(task, config, train))
        devs = {"dev": dev}
        source = (f"held out {config.holdout_fraction:g} of train "
                  f"(seed {config.holdout_seed})")
    if config.max_train_examples and config.max_train_examples < len(train):
        keep = np.sort(np.random.default_rng(config.holdout_seed).permutation(len(train))[
            :config.max_train_examples])
        train = ExampleList([train[i] for i in keep], train.skipped)
    return train, devs, source


def featurize(task: Task, examples, tokenizer, config) -> dict[str, np.ndarray]:
    return task.featurize(examples, tokenizer, config.max_seq_length, **config.featurize)


# ---- checkpoints and the model --------------------------------------------------------------
def is_hf_directory(path: str) -> bool:
    """A Hugging Face model directory (config.json without bert-jax's format + weights)."""
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        return False
    with open(config_path, encoding="utf-8") as f:
        try:
            if json.load(f).get("format") == "bert_jax":
                return False
        except (json.JSONDecodeError, AttributeError):
            return False
    weights = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
               "pytorch_model.bin.index.json")
    return any(os.path.exists(os.path.join(path, w)) for w in weights)


def load_checkpoint(path: str) -> tuple[dict, BertConfig, Any, list[str]]:
    """(params, config, tokenizer-or-None, report lines) of a bert-jax or HF checkpoint."""
    if os.path.isdir(path) and is_hf_directory(path):
        from bert_jax.checkpoint.hf import load_hf

        params, config, tokenizer, report = load_hf(path)
        return params, config, tokenizer, [f"Hugging Face checkpoint: {line}"
                                           for line in report.lines()]
    params, config, tokenizer, _ = store.load_model(path)
    return params, config, tokenizer, [f"bert-jax checkpoint: {store.resolve(path)[1]}"]


def model_config_for_checkpoint(config, ckpt: BertConfig, source: str) -> BertConfig:
    """The checkpoint's config with the run's runtime fields (dropout, dtype, ...); any other
    model field set in the run must equal the checkpoint's."""
    fields = {k: v for k, v in config.model.items() if k != "preset" and v is not None}
    for key, value in fields.items():
        if key not in RUNTIME_FIELDS and value != getattr(ckpt, key):
            raise BertJaxError(f"--config.model.{key}={value!r} does not match the checkpoint "
                               f"{source}, which has {key}={getattr(ckpt, key)!r} (the "
                               "encoder's shape comes from the checkpoint; unset the field)")
    return ckpt.replace(**{k: v for k, v in fields.items() if k in RUNTIME_FIELDS})


def check_tokenizer(tokenizer, ckpt_tokenizer, model_cfg: BertConfig, source: str,
                    tokenizer_source: str) -> list[str]:
    """Vocabulary of the task tokenizer vs the checkpoint: an error when ids would fall
    outside the embedding table or name other tokens; notes otherwise."""
    n, m = tokenizer.vocab_size, model_cfg.vocab_size
    if n > m:
        raise BertJaxError(f"vocabulary mismatch: the tokenizer {tokenizer_source} has {n} "
                           f"tokens but the checkpoint {source} has vocab_size={m}; ids >= {m} "
                           "have no embedding. Use the checkpoint's own tokenizer (leave "
                           "--config.tokenizer unset) or a checkpoint trained with this one")
    notes = []
    if ckpt_tokenizer is not None and ckpt_tokenizer is not tokenizer:
        common = min(n, ckpt_tokenizer.vocab_size)
        differ = [i for i in range(common)
                  if tokenizer.id_to_token(i) != ckpt_tokenizer.id_to_token(i)]
        if differ:
            i = differ[0]
            raise BertJaxError(
                f"vocabulary mismatch: {len(differ)} of {common} token ids name different "
                f"tokens in the tokenizer {tokenizer_source} and in the checkpoint {source} "
                f"(id {i}: {tokenizer.id_to_token(i)!r} vs {ckpt_tokenizer.id_to_token(i)!r})")
    if n < m:
        notes.append(f"tokenizer has {n} tokens, the checkpoint's embedding {m} rows: "
                     f"rows {n}..{m - 1} are never used")
    return notes


def merge_encoder(fresh: dict, pretrained: dict, model_cfg: BertConfig
                  ) -> tuple[dict, list[str]]:
    """Pretrained ``bert`` subtree into fresh task params; (params, report lines)."""
    if "bert" not in pretrained:
        raise BertJaxError(f"checkpoint has no encoder ('bert' subtree); top-level keys: "
                           f"{sorted(pretrained)}")
    pretrained = to_layout(pretrained, model_cfg)
    params, unused = merge_pretrained(fresh, {"bert": pretrained["bert"]})
    unused += sorted(p for p in flatten_params(pretrained) if not p.startswith("bert/"))
    loaded = set(flatten_params({"bert": pretrained["bert"]})) - set(unused)
    fresh_paths = sorted(set(flatten_params(fresh)) - loaded)
    heads = sorted({p.split("/")[0] for p in fresh_paths if p.split("/")[0] in HEAD_NAMES})
    lines = [f"restored {len(loaded)} encoder tensors; head {', '.join(heads)} freshly "
             "initialised"]
    encoder_fresh = [p for p in fresh_paths if p.startswith("bert/")]
    if encoder_fresh:
        lines.append(f"encoder tensors not in the checkpoint (freshly initialised, "
                     f"{len(encoder_fresh)}): {', '.join(encoder_fresh)}")
    if unused:
        lines.append(f"checkpoint tensors not used ({len(unused)}): {', '.join(unused)}")
    return params, lines


def initial_model(task: Task, config) -> tuple[BertConfig, Any, Any, list[str]]:
    """(model config, tokenizer, host params or None for random init, report lines)."""
    from bert_jax.tokenization import load_tokenizer

    tokenizer = load_tokenizer(config.tokenizer) if config.tokenizer else None
    if not config.init_checkpoint:
        if tokenizer is None:
            raise BertJaxError("random initialisation (init_checkpoint='') needs "
                               "--config.tokenizer=DIR (a vocabulary to embed)")
        model_cfg = config_lib.model_config(config, vocab_size=tokenizer.vocab_size)
        if tokenizer.vocab_size > model_cfg.vocab_size:
            raise BertJaxError(f"tokenizer has {tokenizer.vocab_size} tokens but "
                               f"model.vocab_size={model_cfg.vocab_size}")
        return model_cfg, tokenizer, None, [
            f"random initialisation: preset {config.model.preset}, seed {config.seed}"]
    source = config.init_checkpoint
    pretrained, ckpt_cfg, ckpt_tokenizer, lines = load_checkpoint(source)
    model_cfg = model_config_for_checkpoint(config, ckpt_cfg, source)
    if tokenizer is None:
        if ckpt_tokenizer is None:
            raise BertJaxError(f"{source}: checkpoint has no tokenizer; pass "
                               "--config.tokenizer=DIR (the vocabulary it was trained with)")
        tokenizer = ckpt_tokenizer
    lines += check_tokenizer(tokenizer, ckpt_tokenizer, model_cfg, source,
                             config.tokenizer or f"of {source}")
    return model_cfg, tokenizer, pretrained, lines


def build_finetuner(task: Task, config, model_cfg: BertConfig, total_steps: int | None
                    ) -> Finetuner:
    if config.max_seq_length > model_cfg.max_position_embeddings:
        raise BertJaxError(f"max_seq_length={config.max_seq_length} exceeds the model's "
                           f"max_position_embeddings={model_cfg.max_position_embeddings}")
    mesh = parallel.create_mesh(config.mesh)
    rules = parallel.rules_from_config(config.logical_axis_rules)
    tx, schedule = make_tx(config, total_steps) if total_steps else (None, None)
    return Finetuner(task, build_model(task, model_cfg, config.freeze_encoder), mesh, rules,
                     config.batch_size, config.eval_batch_size, config.max_seq_length, tx,
                     schedule)


def score(finetuner: Finetuner, params, task: Task, examples, features, config
          ) -> tuple[dict[str, float], Any]:
    """(metrics, predictions) of ``params`` on labelled examples."""
    outputs = finetuner.predict(params, features)
    predictions = task.postprocess(features, model_outputs(task.kind, outputs), examples,
                                   **config.postprocess)
    return task.metrics(predictions, examples), predictions


# ---- fine-tuning ----------------------------------------------------------------------------
def run_rngs(seed: int) -> tuple[jax.Array, jax.Array]:
    """(head initialisation key, dropout key) of a fine-tuning run with ``seed``."""
    init_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(seed))
    return init_rng, dropout_rng


def finetune(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """Trains, evaluates after each epoch, keeps the best epoch in ``workdir``; returns the
    contents of metrics.json."""
    parallel.maybe_initialize_distributed()
    task = get_task(config.task)
    if not task.label_keys:
        raise BertJaxError(f"task {task.name} has no training data (predict it with a model "
                           "of its parent task, e.g. AX with MNLI)")
    os.makedirs(workdir, exist_ok=True)
    model_cfg, tokenizer, pretrained, report = initial_model(task, config)
    train, devs, dev_source = train_and_dev(task, config)
    _log(f"{task.name}: {len(train)} train examples, "
         + ", ".join(f"{s} {len(d)}" for s, d in devs.items()) + f" ({dev_source})")
    for name, exs in (("train", train), *devs.items()):
        if exs.skipped:
            _log(f"{name}: skipped {len(exs.skipped)} malformed rows (first: {exs.skipped[0]})")
    train_feats = featurize(task, train, tokenizer, config)
    dev_feats = {s: featurize(task, d, tokenizer, config) for s, d in devs.items()}
    steps_per_epoch = -(-num_rows(train_feats) // config.batch_size)
    total_steps = steps_per_epoch * config.epochs
    finetuner = build_finetuner(task, config, model_cfg, total_steps)
    init_rng, dropout_rng = run_rngs(config.seed)
    params = finetuner.init_params(init_rng)
    if pretrained is not None:
        merged, lines = merge_encoder(jax.device_get(params), pretrained, model_cfg)
        report += lines
        params = finetuner.place_params(merged)
    for line in report:
        _log(line)
    state = finetuner.create_state(params)
    del params
    _log(f"training {total_steps} steps ({config.epochs} epochs x {steps_per_epoch}, batch "
         f"{config.batch_size}, {num_rows(train_feats)} sequences/epoch) on mesh "
         f"{dict(finetuner.mesh.shape)}")

    main = task.main_metric
    first_split = next(iter(devs))
    history: list[dict[str, Any]] = []
    best: dict[str, Any] | None = None
    train_seconds = steady_seconds = steady_sequences = 0.0
    extra_base = {"task": task.name, "num_labels": task.num_labels,
                  "finetune": config.to_dict(), "init_checkpoint": config.init_checkpoint}
    for epoch in range(config.epochs):
        state, stats = finetuner.train_epoch(state, train_feats, epoch, config.seed,
                                             dropout_rng, _log, config.log_every)
        train_seconds += stats["seconds"]
        steady_seconds += stats["seconds"] - stats["first_step_seconds"]
        steady_sequences += stats["sequences"] * (1 - 1 / max(steps_per_epoch, 1))
        t0 = time.perf_counter()
        scores = {s: score(finetuner, state.params, task, devs[s], dev_feats[s], config)[0]
                  for s in devs}
        record = {"epoch": epoch + 1, "train_loss": stats["loss"],
                  "train_seconds": stats["seconds"], "eval_seconds": time.perf_counter() - t0,
                  **{s: m for s, m in scores.items()}}
        history.append(record)
        value = scores[first_split][main]
        _log(f"epoch {epoch + 1}: train loss {stats['loss']:.4f}; "
             + "; ".join(f"{s} " + ", ".join(f"{k} {v:.4f}" for k, v in m.items()
                                             if isinstance(v, float))
                         for s, m in scores.items()))
        if best is None or (np.isfinite(value) and not value <= best["value"]):
            best = {"epoch": epoch + 1, "value": value, "metric": f"{first_split}/{main}",
                    "metrics": scores}
            store.save_model(workdir, state.params, model_cfg, tokenizer,
                             extra={**extra_base, "best": best})
            _log(f"saved epoch {epoch + 1} as best ({first_split} {main} {value:.4f})")
    result = {"task": task.name, "dev_source": dev_source, "train_examples": len(train),
              "dev_examples": {s: len(d) for s, d in devs.items()},
              "train_sequences": num_rows(train_feats), "epochs": history, "best": best,
              "final": history[-1], "train_seconds": train_seconds,
              "train_sequences_per_second": (steady_sequences / steady_seconds
                                             if steady_seconds > 0 else None),
              "seed": config.seed, "holdout_seed": config.holdout_seed, "report": report}
    if jax.process_index() == 0:
        write_json(os.path.join(workdir, METRICS_FILE), result)
    return result


# ---- evaluate / predict on a fine-tuned workdir ----------------------------------------------
def load_finetuned(workdir: str, overrides: Sequence[str] = ()):
    """(task, run config, model config, tokenizer, finetuner, sharded params) of a workdir."""
    params, model_cfg, tokenizer, extra = store.load_model(workdir)
    if "task" not in extra or "finetune" not in extra:
        raise BertJaxError(f"{workdir}: not a fine-tuned workdir (config.json has no task; "
                           "run `bert-jax finetune` first)")
    config = config_from_dict(extra["finetune"])
    config_lib.apply_overrides(config, overrides)
    if tokenizer is None:
        raise BertJaxError(f"{workdir}: no tokenizer/ directory")
    task = get_task(extra["task"])
    finetuner = build_finetuner(task, config, model_cfg, None)
    params = finetuner.place_params(to_layout(params, model_cfg))
    return task, config, tokenizer, finetuner, params


def config_from_dict(values: dict[str, Any]) -> ml_collections.ConfigDict:
    """A stored run config (``config.to_dict()`` through JSON) -> locked, typed ConfigDict."""
    config = base_config()
    config.update_from_flattened_dict(_flatten_dict(values))
    config.lock()
    return config


def _flatten_dict(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and k not in ("featurize", "postprocess"):
            out.update(_flatten_dict(v, f"{prefix}{k}."))
        elif isinstance(v, dict):
            out[f"{prefix}{k}"] = ml_collections.ConfigDict(v)
        else:
            out[f"{prefix}{k}"] = tuple(map(tuple, v)) if k == "logical_axis_rules" else v
    return out


def eval_split_examples(task: Task, config, split: str) -> ExampleList:
    """``dev``: the run's dev split (held out again exactly when it was); else a file split."""
    if split == "dev" and not _has_dev_files(task, config):
        return train_and_dev(task, config)[1]["dev"]
    return read_split(task, config, split)


def evaluate(workdir: str, split: str = "dev", overrides: Sequence[str] = ()
             ) -> dict[str, Any]:
    task, config, tokenizer, finetuner, params = load_finetuned(workdir, overrides)
    splits = task.eval_splits if split == "dev" and task.eval_splits and \
        _has_dev_files(task, config) else (split,)
    out = {}
    for s in splits:
        examples = eval_split_examples(task, config, s)
        out[s] = score(finetuner, params, task, examples, featurize(task, examples, tokenizer,
                                                                    config), config)[0]
    return {"task": task.name, "workdir": workdir, **out}


def _predict_splits(task: Task, split: str) -> tuple[str, ...]:
    if split == "test" and "test" not in task.splits:
        return tuple(s for s in task.splits if s.startswith("test"))  # MNLI: matched, mism.
    return (split,)


def predict(workdir: str, split: str, output_dir: str, overrides: Sequence[str] = (),
            ax_file: str | None = None) -> list[str]:
    """Writes the task's prediction files for ``split`` (MNLI test: both test sets, and AX
    when its file is found or given); returns the paths."""
    task, config, tokenizer, finetuner, params = load_finetuned(workdir, overrides)
    jobs = [(task, s, eval_split_examples(task, config, s))
            for s in _predict_splits(task, split)]
    if task.name == "mnli" and split == "test":
        ax = get_task("ax")
        roots = [d for d in (config.data_dir, config.data_dir and os.path.dirname(
            os.path.normpath(config.data_dir))) if d]
        for root in ([None] if ax_file else roots):
            try:
                jobs.append((ax, "test", ax.read("test", data_dir=root, files=ax_file)))
                break
            except BertJaxError as e:
                if ax_file:
                    raise
                _log(f"AX diagnostic not predicted: {e}")
    paths = []
    for job_task, s, examples in jobs:
        feats = featurize(job_task, examples, tokenizer, config)
        outputs = finetuner.predict(params, feats)
        preds = job_task.postprocess(feats, model_outputs(job_task.kind, outputs), examples,
                                     **config.postprocess)
        if jax.process_index() == 0:
            paths += job_task.write_predictions(preds, examples, output_dir, s)
    return paths


# ---- commands ---------------------------------------------------------------------------------
class finetune_command:  # noqa: N801 - the CLI registry names this attribute
    accepts_overrides = True

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--config", required=True,
                            help="experiment file and variant, e.g. experiments/glue.py:mrpc")
        parser.add_argument("--workdir", required=True,
                            help="output: best model (config.json, params/, tokenizer/), "
                                 "metrics.json")
        parser.epilog = ("Override any config field with --config.<key>=<value>, e.g. "
                         "--config.init_checkpoint=PATH --config.data_dir=glue_data/MRPC")

    @staticmethod
    def run(args) -> int:
        config = config_lib.load_config(args.config, args.overrides)
        result = finetune(config, args.workdir)
        if jax.process_index() == 0:
            print(json.dumps({"workdir": args.workdir, "best": result["best"]}))
        return 0


def _workdir_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", required=True, help="a `bert-jax finetune` workdir")
    parser.epilog = ("The run's stored config is used; override data locations with e.g. "
                     "--config.data_dir=DIR or --config.test_file=FILE")


class evaluate_command:  # noqa: N801
    accepts_overrides = True

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        _workdir_arguments(parser)
        parser.add_argument("--split", default="dev",
                            help="dev (the run's dev split(s)), or any labelled split name")
        parser.add_argument("--output", help="also write the metrics JSON to this file")

    @staticmethod
    def run(args) -> int:
        result = evaluate(args.workdir, args.split, args.overrides)
        if jax.process_index() == 0:
            if args.output:
                write_json(args.output, result)
            print(json.dumps(result, indent=2, sort_keys=True))
        return 0


class predict_command:  # noqa: N801
    accepts_overrides = True

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        _workdir_arguments(parser)
        parser.add_argument("--split", default="test", help="split to predict (default test)")
        parser.add_argument("--output", required=True, help="directory for the prediction files")
        parser.add_argument("--ax-file", help="MNLI: the AX diagnostic TSV (default: looked "
                                              "for beside the MNLI data)")

    @staticmethod
    def run(args) -> int:
        paths = predict(args.workdir, args.split, args.output, args.overrides, args.ax_file)
        if jax.process_index() == 0:
            print(json.dumps({"written": paths}, indent=2))
        return 0
