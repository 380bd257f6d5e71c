"""What a run checks in its workdir before it writes anything there.

A workdir holds one kind of run. ``config.json`` says which: a pretraining run records its
``experiment``, a fine-tuning run its ``task``, a converted model neither. A run refuses a
workdir of another kind, and a pretraining run refuses to resume checkpoints made with a model
or optimizer of another shape: the restore would fail after the workdir's config had been
replaced.

``--overwrite`` means one thing for every run: the workdir's previous contents, whatever they
hold, are moved aside whole to ``WORKDIR.replaced-N`` (named on one line) and the run starts
clean; nothing is deleted and no workdir ever mixes two runs (:func:`locked_workdir`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from bert_jax import fileio, storage
from bert_jax.checkpoint import store
from bert_jax.config import BertConfig
from bert_jax.errors import BertJaxError

# BertConfig fields that fix the parameter tree (names, shapes, dtypes, layout). The others
# (dropout rates, kernels, dtypes of the computation) may change between restarts.
SHAPE_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "max_position_embeddings", "type_vocab_size",
                "embedding_size", "share_layers", "vocab_pad_multiple", "param_dtype",
                "kernels.qkv_projection", "scan_layers")
# Experiment keys that fix the optimizer state or the heads.
STATE_KEYS = (("objective",), ("optimizer", "name"))


def run_kind(extra: dict[str, Any]) -> str:
    """'pretraining', 'fine-tuning' or 'model' from the extra fields of a config.json."""
    if "experiment" in extra:
        return "pretraining"
    if "task" in extra or "finetune" in extra:
        return "fine-tuning"
    return "model"


def _get(tree: dict[str, Any], keys: tuple[str, ...]):
    for key in keys:
        if not isinstance(tree, dict):
            return None
        tree = tree.get(key)
    return tree


def check_run_kind(workdir: str, kind: str, *, overwrite: bool = False) -> None:
    """BertJaxError if ``workdir`` holds a run of another kind than ``kind`` (a fine-tuning
    run in a pretraining workdir, a converted model...), unless ``overwrite``. Reads only."""
    if storage.exists(workdir) and not storage.isdir(workdir):
        raise BertJaxError(f"{workdir}: exists and is not a directory")
    if overwrite:
        return
    config_path = storage.join(workdir, store.CONFIG_FILE)
    if storage.exists(config_path):
        _, extra = store.read_config(workdir)
        found = run_kind(extra)
    elif store.step_dirs(workdir):
        found = "pretraining"
    elif storage.isdir(storage.join(workdir, store.PARAMS_ITEM)):
        found = "model"
    else:
        return
    if found != kind:
        what = "a model" if found == "model" else f"a {found} run"
        raise BertJaxError(f"{workdir}: holds {what}, not a {kind} run; choose another "
                           "--workdir (or pass --overwrite to move its contents aside and "
                           "start afresh)")


def check_pretraining_workdir(workdir: str, model_cfg: BertConfig, experiment: dict[str, Any],
                              *, overwrite: bool = False) -> None:
    """BertJaxError if ``workdir`` holds another kind of run, or checkpoints that this
    model/optimizer cannot resume. Reads only; call before writing into the workdir."""
    check_run_kind(workdir, "pretraining", overwrite=overwrite)
    if overwrite or not storage.exists(storage.join(workdir, store.CONFIG_FILE)):
        return  # (overwrite: the old checkpoints are moved aside, not resumed)
    saved_cfg, extra = store.read_config(workdir)
    if run_kind(extra) != "pretraining" or not store.step_dirs(workdir):
        return  # nothing to resume: a new config may replace the old one
    saved, now = saved_cfg.to_dict(), model_cfg.to_dict()
    for field in SHAPE_FIELDS:
        before, after = _get(saved, tuple(field.split("."))), _get(now, tuple(field.split(".")))
        if before != after:
            raise BertJaxError(
                f"{workdir}: its checkpoints were made with model.{field}={before!r}, this "
                f"config has {after!r}; resume with the config the run was started with, or "
                "use a new --workdir")
    for keys in STATE_KEYS:
        before, after = _get(extra["experiment"], keys), _get(experiment, keys)
        if before is not None and before != after:
            raise BertJaxError(
                f"{workdir}: its checkpoints were made with {'.'.join(keys)}={before!r}, this "
                f"config has {after!r}; resume with the config the run was started with, or "
                "use a new --workdir")


@contextlib.contextmanager
def locked_workdir(workdir: str, *, overwrite: bool,
                   log: Callable[[str], None]) -> Iterator[fileio.WorkdirLock]:
    """Holds the workdir lock for a run (process 0 takes it). With ``overwrite`` the previous
    contents are moved aside first; a run rejected (BertJaxError) before it wrote anything
    gets them moved back, so the filesystem is as it was."""
    import jax

    lock = fileio.WorkdirLock(workdir)
    aside = None
    leader = jax.process_index() == 0
    if leader:
        lock.acquire()
    try:
        if overwrite and leader:
            aside = fileio.move_contents_aside(workdir)
            if aside is not None:
                log(f"--overwrite: moved the previous contents of {workdir} to {aside}; "
                    "starting afresh")
        if overwrite and jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("bert_jax_overwrite")
        yield lock
    except BertJaxError:
        if aside is not None and storage.listdir(workdir) == [fileio.LOCK_FILE]:
            fileio.move_contents_back(aside, workdir)
            log(f"moved the previous contents back from {aside}")
        raise
    finally:
        lock.release()
