"""The fine-tuning loop: ``finetune(config, workdir)``.

It reads the task data (``inputs.py``), starts from a checkpoint's encoder and a fresh head or
from random weights (``model_init.py``), trains with the run's optimizer over a data-parallel
mesh (``trainer.py``), evaluates after every epoch with the task's official metrics and keeps
the best epoch in WORKDIR as a bert-jax model directory::

    WORKDIR/config.json   model config + {"task", "num_labels", "finetune": the run config,
                          "best": {epoch, metrics}}
    WORKDIR/params/       the best epoch's parameters
    WORKDIR/tokenizer/
    WORKDIR/metrics.json  per-epoch train loss, dev metrics, timings; best and final
    WORKDIR/metrics.jsonl the running train loss every ``log_every`` steps and each epoch's
                          dev metrics, mirrored to WORKDIR/tensorboard/ (TensorBoard)

A tqdm bar with ETA follows the steps (``progress_bar=false`` turns it off).
"""

from __future__ import annotations

import time
from typing import Any

import jax
import ml_collections
import numpy as np

from bert_jax import parallel, startup, storage
from bert_jax.checkpoint import store
from bert_jax.errors import BertJaxError
from bert_jax.finetuning.evaluate import score
from bert_jax.finetuning.inputs import featurize, train_and_dev
from bert_jax.finetuning.model_init import initial_model, merge_encoder
from bert_jax.finetuning.trainer import FinetunerCache, build_finetuner, num_rows, run_model_config
from bert_jax.modeling.params import to_layout
from bert_jax.runs.metrics import MetricsWriter
from bert_jax.runs.progress import exclude_pause
from bert_jax.runs.workdir import check_run_kind, locked_workdir
from bert_jax.tasks.base import write_json
from bert_jax.tasks.registry import get_task

METRICS_FILE = "metrics.json"


def _log(message: str) -> None:
    if jax.process_index() == 0:
        print(message, flush=True)


def run_rngs(seed: int) -> tuple[jax.Array, jax.Array]:
    """(head initialisation key, dropout key) of a fine-tuning run with ``seed``."""
    init_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(seed))
    return init_rng, dropout_rng


def finetune(config: ml_collections.ConfigDict, workdir: str, *, overwrite: bool = False,
             programs: FinetunerCache | None = None) -> dict[str, Any]:
    """Trains, evaluates after each epoch, keeps the best epoch in ``workdir``; returns the
    contents of metrics.json.

    ``programs``: a :class:`FinetunerCache` shared by several runs in this process; runs of
    the same shape then reuse one set of compiled steps.

    ``workdir`` must be new or hold a fine-tuning run (a pretraining workdir or a model
    directory is refused; ``overwrite`` moves its contents aside first); it is locked for
    the run, and each new best
    model replaces the previous one only once written completely."""
    parallel.maybe_initialize_distributed()
    startup.backends_ready()
    task = get_task(config.task, config)
    if not task.label_keys:
        raise BertJaxError(f"task {task.name} has no training data (predict it with a model "
                           "of its parent task, e.g. AX with MNLI)")
    if config.packing:  # before any data is read
        from bert_jax.finetuning.packing import check_supported

        check_supported(task, config)
    workdir = storage.abspath(workdir)
    if config.init_checkpoint and storage.abspath(config.init_checkpoint) == workdir:
        raise BertJaxError(f"{workdir}: is the init_checkpoint; fine-tuning would replace the "
                           "model it starts from. Choose another --workdir")
    check_run_kind(workdir, "fine-tuning", overwrite=overwrite)
    with locked_workdir(workdir, overwrite=overwrite, log=_log):
        return _finetune(config, workdir, task, programs)


def _finetune(config: ml_collections.ConfigDict, workdir: str, task,
              programs: FinetunerCache | None) -> dict[str, Any]:
    model_cfg, tokenizer, pretrained, report = initial_model(task, config)
    train, devs, dev_source = train_and_dev(task, config)
    _log(f"{task.name}: {len(train)} train examples, "
         + ", ".join(f"{s} {len(d)}" for s, d in devs.items()) + f" ({dev_source})")
    for name, exs in (("train", train), *devs.items()):
        if exs.skipped:
            _log(f"{name}: skipped {len(exs.skipped)} malformed rows (first: {exs.skipped[0]})")
    train_feats = featurize(task, train, tokenizer, config)
    if config.get("distill_from"):
        from bert_jax.finetuning import distill

        distill.check(config, task)
        train_feats = distill.add_teacher_logits(config, task, train_feats)
        _log(f"distilling from {config.distill_from} (T={config.distill_temperature}, "
             f"alpha={config.distill_alpha})")
    if config.packing:
        train_feats = _pack(task, config, train_feats)
    dev_feats = {s: featurize(task, d, tokenizer, config) for s, d in devs.items()}
    steps_per_epoch = -(-num_rows(train_feats) // config.global_batch_size)
    total_steps = steps_per_epoch * config.epochs
    finetuner = programs.get(task, config, model_cfg, total_steps, train_feats["input_mask"],
                             config.epochs) if programs is not None \
        else build_finetuner(task, config, model_cfg, total_steps, train_feats["input_mask"],
                             config.epochs)
    init_rng, dropout_rng = run_rngs(config.seed)
    # the layer layout of the run's programs (a short run scans the layers)
    run_cfg = run_model_config(config, model_cfg, train_feats["input_mask"], config.epochs)
    if pretrained is None:
        params = finetuner.init_params(init_rng)
    else:  # only what the checkpoint lacks is initialised
        merged, lines = merge_encoder(finetuner.abstract_params, pretrained, run_cfg,
                                      config.get("reinitialize", ""))
        report += lines
        params = finetuner.place_params(finetuner.fill_fresh(merged, init_rng))
    for line in report:
        _log(line)
    state = finetuner.create_state(params)
    del params
    if config.get("compile_ahead", True):
        finetuner.compile_ahead(state, dropout_rng, train_feats, list(dev_feats.values()))
    _log(f"training {total_steps} steps ({config.epochs} epochs x {steps_per_epoch}, batch "
         f"{config.global_batch_size}, {num_rows(train_feats)} sequences/epoch, length "
         f"buckets {list(finetuner.buckets)}) on mesh {dict(finetuner.mesh.shape)}")

    history: list[dict[str, Any]] = []
    best: dict[str, Any] | None = None
    train_seconds = steady_seconds = steady_sequences = 0.0
    extra_base = {"task": task.name, "num_labels": task.num_labels,
                  "finetune": config.to_dict(), "init_checkpoint": config.init_checkpoint}
    writer = MetricsWriter(workdir, enabled=jax.process_index() == 0)
    progress = _progress_bar(config, total_steps)
    try:
        for epoch in range(config.epochs):
            state, stats, best = _epoch(finetuner, state, train_feats, dev_feats, devs, task,
                                        config, epoch, dropout_rng, progress, writer,
                                        history, best, workdir, model_cfg, tokenizer,
                                        extra_base, steps_per_epoch,
                                        _saved_layout(run_cfg, model_cfg))
            train_seconds += stats["seconds"]
            steady_seconds += stats["seconds"] - stats["first_step_seconds"]
            steady_sequences += stats["sequences"] * (1 - 1 / max(steps_per_epoch, 1))
    finally:
        if progress is not None:
            progress.close()
        writer.close()
    result = {"task": task.name, "dev_source": dev_source, "train_examples": len(train),
              "dev_examples": {s: len(d) for s, d in devs.items()},
              "train_sequences": num_rows(train_feats), "epochs": history, "best": best,
              "final": history[-1], "train_seconds": train_seconds,
              "train_sequences_per_second": (steady_sequences / steady_seconds
                                             if steady_seconds > 0 else None),
              "seed": config.seed, "holdout_seed": config.holdout_seed, "report": report}
    if jax.process_index() == 0:
        write_json(storage.join(workdir, METRICS_FILE), result)
    return result


def _saved_layout(run_cfg, model_cfg):
    """params in the run's layer layout -> in the checkpoint's (``model_cfg``), as one compiled
    program: slicing a stacked layer stack op by op compiles a program per tensor and layer."""
    if run_cfg.scan_layers == model_cfg.scan_layers:
        return lambda params: params
    return jax.jit(lambda params: to_layout(params, model_cfg))


def _pack(task, config, train_feats):
    """Packed training rows (``finetuning/packing.py``), with the padding saved logged."""
    from bert_jax.data.packing import padding_fraction
    from bert_jax.finetuning import packing
    from bert_jax.finetuning.trainer import TEACHER_KEY

    lengths = train_feats["input_mask"].sum(axis=1)
    packed = packing.pack_train_features(train_feats, task.label_keys, config, (TEACHER_KEY,))
    _log(f"packing: {len(lengths)} train examples in {num_rows(packed)} rows of "
         f"{config.max_seq_length} (at most {config.max_examples_per_row} a row); padding "
         f"{padding_fraction(lengths, len(lengths), config.max_seq_length):.1%} -> "
         f"{padding_fraction(lengths, num_rows(packed), config.max_seq_length):.1%}")
    return packed


def _progress_bar(config, total_steps: int):
    if not config.progress_bar or jax.process_index() != 0:
        return None
    from tqdm import tqdm

    return tqdm(total=total_steps, desc="finetune", unit="step", dynamic_ncols=True)


def _epoch(finetuner, state, train_feats, dev_feats, devs, task, config, epoch, dropout_rng,
           progress, writer, history, best, workdir, model_cfg, tokenizer, extra_base,
           steps_per_epoch, saved_layout):
    """One epoch: train, score every dev split, log (stdout, TensorBoard, metrics.jsonl),
    keep the best. Returns (state, train stats, best)."""
    log = progress.write if progress is not None else _log
    state, stats = finetuner.train_epoch(
        state, train_feats, epoch, config.seed, dropout_rng, log, config.log_every,
        progress=progress, scalars=lambda step, values: writer.write(step, values))
    main = task.main_metric
    first_split = next(iter(devs))
    t0 = time.perf_counter()
    scores = {s: score(finetuner, state.params, task, devs[s], dev_feats[s], config)[0]
              for s in devs}
    record = {"epoch": epoch + 1, "train_loss": stats["loss"],
              "train_seconds": stats["seconds"], "eval_seconds": time.perf_counter() - t0,
              **{s: m for s, m in scores.items()}}
    history.append(record)
    value = scores[first_split][main]
    step = (epoch + 1) * steps_per_epoch
    for split, metrics in scores.items():
        writer.write(step, {k: v for k, v in metrics.items() if isinstance(v, float)},
                     prefix=split)
    log(f"epoch {epoch + 1}: train loss {stats['loss']:.4f}; "
         + "; ".join(f"{s} " + ", ".join(f"{k} {v:.4f}" for k, v in m.items()
                                         if isinstance(v, float))
                     for s, m in scores.items()))
    if best is None or (np.isfinite(value) and not value <= best["value"]):
        best = {"epoch": epoch + 1, "value": value, "metric": f"{first_split}/{main}",
                "metrics": scores}
        store.save_model(workdir, saved_layout(state.params), model_cfg, tokenizer,
                         extra={**extra_base, "best": best})
        log(f"saved epoch {epoch + 1} as best ({first_split} {main} {value:.4f})")
    if progress is not None:  # the evaluation and the save stay out of the bar's ETA
        exclude_pause(progress)
    return state, stats, best
