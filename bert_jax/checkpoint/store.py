"""The one bert-jax checkpoint format.

A *model directory* (written by ``convert``, fine-tuning exports, and read everywhere)::

    DIR/config.json      {"format": "bert_jax", "config": {...BertConfig...}, ...extra}
    DIR/tokenizer/       tokenizer files (optional; see bert_jax.tokenization)
    DIR/params/          Orbax (StandardCheckpointer) pytree of the parameters

A *training workdir* keeps ``config.json`` and ``tokenizer/`` at its root and per-step Orbax
items under ``checkpoints/<step>/`` (``params``, ``opt_state``, ``train_state``...).
``load_model`` accepts either, or a single step directory, and returns the parameters of the
newest complete step.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from typing import Any

import numpy as np

from bert_jax.config import BertConfig
from bert_jax.errors import BertJaxError

CONFIG_FILE = "config.json"
TOKENIZER_DIR = "tokenizer"
PARAMS_ITEM = "params"
CHECKPOINTS_DIR = "checkpoints"


def write_config(directory: str, config: BertConfig, extra: dict[str, Any] | None = None):
    os.makedirs(directory, exist_ok=True)
    data = {"format": "bert_jax", "config": config.to_dict()}
    data.update(extra or {})
    tmp = os.path.join(directory, CONFIG_FILE + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, os.path.join(directory, CONFIG_FILE))


def read_config(directory: str) -> tuple[BertConfig, dict[str, Any]]:
    path = os.path.join(directory, CONFIG_FILE)
    if not os.path.exists(path):
        raise BertJaxError(f"{directory}: not a bert-jax checkpoint ({CONFIG_FILE} not found)")
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise BertJaxError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None
    if data.get("format") != "bert_jax":
        raise BertJaxError(f"{path}: not a bert-jax config (use `bert-jax convert` for Hugging "
                           "Face or Google checkpoints)")
    extra = {k: v for k, v in data.items() if k not in ("format", "config")}
    return BertConfig.from_dict(data["config"], source=path), extra


def save_model(directory: str, params, config: BertConfig, tokenizer=None,
               extra: dict[str, Any] | None = None) -> None:
    """Writes a model directory. ``params`` may be jax or numpy arrays (unboxed)."""
    import orbax.checkpoint as ocp

    directory = os.path.abspath(directory)
    os.makedirs(directory, exist_ok=True)
    target = os.path.join(directory, PARAMS_ITEM)
    if os.path.exists(target):
        shutil.rmtree(target)
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(target, params)
        ckptr.wait_until_finished()
    if tokenizer is not None:
        tokenizer.save(os.path.join(directory, TOKENIZER_DIR))
    write_config(directory, config, extra)


def latest_step_dir(workdir: str) -> str | None:
    """The newest complete step directory under ``workdir/checkpoints`` (None if none)."""
    root = os.path.join(workdir, CHECKPOINTS_DIR)
    if not os.path.isdir(root):
        return None
    steps = sorted((int(d) for d in os.listdir(root) if d.isdigit()
                    and os.path.isdir(os.path.join(root, d, PARAMS_ITEM))), reverse=True)
    return os.path.join(root, str(steps[0])) if steps else None


def resolve(path: str) -> tuple[str, str]:
    """path -> (directory holding config.json, directory holding the params item)."""
    path = os.path.abspath(path)
    if not os.path.exists(path):
        raise BertJaxError(f"{path}: checkpoint path not found")
    if os.path.isdir(os.path.join(path, PARAMS_ITEM)) and os.path.exists(
            os.path.join(path, CONFIG_FILE)):
        return path, os.path.join(path, PARAMS_ITEM)
    step = latest_step_dir(path)
    if step is not None:
        return path, os.path.join(step, PARAMS_ITEM)
    parent = os.path.dirname(os.path.dirname(path))
    if (os.path.isdir(os.path.join(path, PARAMS_ITEM))
            and os.path.basename(os.path.dirname(path)) == CHECKPOINTS_DIR):
        return parent, os.path.join(path, PARAMS_ITEM)
    raise BertJaxError(f"{path}: no bert-jax checkpoint found (expected {CONFIG_FILE} with "
                       f"{PARAMS_ITEM}/, or a workdir with {CHECKPOINTS_DIR}/<step>/)")


class _NoStepMetadataWarning(logging.Filter):
    """Orbax warns that ``_CHECKPOINT_METADATA`` is missing whenever a step's ``params`` item is
    read on its own: that file lives one level up, in the step directory, and the item does
    not need it. Nothing for a user to act on, so it is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Metadata file does not exist" not in record.getMessage()


def load_params(params_dir: str, target=None):
    """Restores a params pytree (numpy arrays, or ``target``'s shardings if given)."""
    import jax
    import orbax.checkpoint as ocp

    quiet = _NoStepMetadataWarning()
    absl_logger = logging.getLogger("absl")
    absl_logger.addFilter(quiet)
    try:
        return _restore_params(ocp, jax, params_dir, target)
    finally:
        absl_logger.removeFilter(quiet)


def _restore_params(ocp, jax, params_dir: str, target):
    with ocp.StandardCheckpointer() as ckptr:
        if target is None:
            # A target on this process's first device: checkpoints written by several
            # processes (sharded over another topology) restore onto one machine too.
            device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
            tree = ckptr.metadata(params_dir).item_metadata.tree
            target = jax.tree.map(
                lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=device), tree)
            return _to_numpy(ckptr.restore(params_dir, target))
        return ckptr.restore(params_dir, target)


def _to_numpy(tree):
    if isinstance(tree, dict):
        return {k: _to_numpy(v) for k, v in tree.items()}
    return np.asarray(tree)


def load_model(path: str, *, with_tokenizer: bool = True):
    """Returns (params, config, tokenizer-or-None, extra) from any bert-jax checkpoint path.

    Params are numpy arrays in the layout they were saved; use
    ``bert_jax.modeling.params.to_layout`` to match another config's scan/unrolled layout.
    """
    config_dir, params_dir = resolve(path)
    config, extra = read_config(config_dir)
    params = load_params(params_dir)
    tokenizer = None
    tok_dir = os.path.join(config_dir, TOKENIZER_DIR)
    if with_tokenizer and os.path.isdir(tok_dir):
        from bert_jax.tokenization import load_tokenizer

        tokenizer = load_tokenizer(tok_dir)
    return params, config, tokenizer, extra
