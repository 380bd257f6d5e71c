"""The one bert-jax checkpoint format.

A *model directory* (written by ``convert``, fine-tuning exports, and read everywhere)::

    DIR/config.json      {"format": "bert_jax", "config": {...BertConfig...}, ...extra}
    DIR/tokenizer/       tokenizer files (optional; see bert_jax.tokenization)
    DIR/params/          Orbax (StandardCheckpointer) pytree of the parameters

A *training workdir* keeps ``config.json`` and ``tokenizer/`` at its root and per-step Orbax
items under ``checkpoints/<step>/`` (``params``, ``opt_state``, ``train_state``...).
``load_model`` accepts either, or a single step directory, and returns the parameters of the
newest complete step whose checksums (``sha256.json``, see ``integrity``) match.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import numpy as np

from bert_jax import fileio, storage
from bert_jax.checkpoint import integrity
from bert_jax.config import BertConfig
from bert_jax.errors import BertJaxError

CONFIG_FILE = "config.json"
TOKENIZER_DIR = "tokenizer"
PARAMS_ITEM = "params"
CHECKPOINTS_DIR = "checkpoints"
# The file a tokenizer directory is trusted by (tokenization.base.TOKENIZER_JSON).
TOKENIZER_MARKER = "tokenizer.json"
# The object Orbax writes into a step in a bucket once the step is complete.
COMMIT_MARKER = "commit_success.txt"


def write_config(directory: str, config: BertConfig, extra: dict[str, Any] | None = None):
    data = {"format": "bert_jax", "config": config.to_dict()}
    data.update(extra or {})
    fileio.atomic_write_json(storage.join(directory, CONFIG_FILE), data)


def read_config(directory: str) -> tuple[BertConfig, dict[str, Any]]:
    path = storage.join(directory, CONFIG_FILE)
    if not storage.exists(path):
        raise BertJaxError(f"{directory}: not a bert-jax checkpoint ({CONFIG_FILE} not found)")
    raw = storage.read_bytes(path)
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise BertJaxError(f"{path}: not UTF-8 text (byte offset {e.start})") from None
    except json.JSONDecodeError as e:
        raise BertJaxError(f"{path}: not valid JSON (line {e.lineno}: {e.msg}; truncated or "
                           "damaged?)") from None
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
        raise BertJaxError(f"{path}: not a bert-jax config (no \"config\" object)")
    if data.get("format") != "bert_jax":
        raise BertJaxError(f"{path}: not a bert-jax config (use `bert-jax convert` for Hugging "
                           "Face or Google checkpoints)")
    extra = {k: v for k, v in data.items() if k not in ("format", "config")}
    return BertConfig.from_dict(data["config"], source=path), extra


def save_model(directory: str, params, config: BertConfig, tokenizer=None,
               extra: dict[str, Any] | None = None) -> None:
    """Writes a model directory. ``params`` may be jax or numpy arrays (unboxed).

    Non-destructive: the parameters are written (with their checksum manifest) under a
    staging name and swapped in complete; an earlier model in ``directory`` stays readable
    until then. Every process takes part in the (Orbax) save; process 0 swaps and writes the
    tokenizer and config.json."""
    import jax
    import orbax.checkpoint as ocp

    directory = storage.abspath(directory)
    fileio.check_output_path(directory, directory=True)
    storage.makedirs(directory)
    remote = storage.is_remote(directory)
    if remote and jax.process_index() == 0 and storage.exists(
            storage.join(directory, CONFIG_FILE)):
        # No rename in a bucket: config.json is the directory's commit marker. Without it
        # readers refuse the directory ("not a bert-jax checkpoint") until the new
        # parameters, their manifest and the tokenizer are in place and it is written last.
        storage.remove(storage.join(directory, CONFIG_FILE))
    staging = storage.join(directory, PARAMS_ITEM if remote else "." + PARAMS_ITEM + ".new")
    if jax.process_count() == 1:
        # Host copies: Orbax writes numpy arrays as they are, while for device arrays it first
        # compiles a slice program per shape and device (never cached: ~110 compiles and 3.5 s
        # for a small model on 8 CPU devices, every process).
        params = jax.device_get(params)
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(staging, params, force=True)
        ckptr.wait_until_finished()
    if jax.process_index() != 0:
        return
    integrity.write_manifest(staging)
    if not remote:
        fileio.swap_in(staging, storage.join(directory, PARAMS_ITEM))
    if tokenizer is not None:
        with fileio.replace_directory(storage.join(directory, TOKENIZER_DIR),
                                      marker=TOKENIZER_MARKER) as tmp:
            tokenizer.save(tmp)
    write_config(directory, config, extra)


def step_dirs(workdir: str) -> list[str]:
    """Step directories under ``workdir/checkpoints``, newest first: every ``<step>`` folder on
    local disk (one without its params item is damaged, and reported as such when read); in a
    bucket those Orbax committed (``commit_success.txt``; others are still being written)."""
    root = storage.join(workdir, CHECKPOINTS_DIR)
    if not storage.isdir(root):
        return []
    remote = storage.is_remote(root)
    steps = sorted((int(d) for d in storage.listdir(root) if d.isdigit()
                    and storage.isdir(storage.join(root, d))
                    and (not remote or storage.exists(storage.join(root, d, COMMIT_MARKER))
                         or storage.isdir(storage.join(root, d, PARAMS_ITEM)))),
                   reverse=True)
    return [storage.join(root, str(s)) for s in steps]


def latest_step_dir(workdir: str) -> str | None:
    """The newest step directory under ``workdir/checkpoints`` whose checksums match (or that
    has no manifest); damaged newer steps are reported on stderr and skipped."""
    for step in step_dirs(workdir):
        try:
            if not storage.isdir(storage.join(step, PARAMS_ITEM)):
                raise integrity.DamagedCheckpoint(f"{step}: no {PARAMS_ITEM}/ (empty or "
                                                  "partly deleted step)")
            integrity.verify(step)
        except integrity.DamagedCheckpoint as e:
            _warn(f"skipping damaged checkpoint {step}: {e}")
            continue
        return step
    return None


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _candidates(path: str) -> tuple[str, list[str]]:
    """path -> (directory holding config.json, params directories to try, best first)."""
    path = storage.abspath(path)
    if not storage.exists(path):
        raise BertJaxError(f"{path}: checkpoint path not found")
    if storage.isdir(storage.join(path, PARAMS_ITEM)) and storage.exists(
            storage.join(path, CONFIG_FILE)):
        return path, [storage.join(path, PARAMS_ITEM)]
    steps = step_dirs(path)
    if steps:
        return path, [storage.join(s, PARAMS_ITEM) for s in steps]
    parent = storage.dirname(storage.dirname(path))
    if (storage.isdir(storage.join(path, PARAMS_ITEM))
            and storage.basename(storage.dirname(path)) == CHECKPOINTS_DIR):
        return parent, [storage.join(path, PARAMS_ITEM)]
    raise BertJaxError(f"{path}: no bert-jax checkpoint found (expected {CONFIG_FILE} with "
                       f"{PARAMS_ITEM}/, or a workdir with {CHECKPOINTS_DIR}/<step>/)")


def _check(params_dir: str) -> bool:
    """Verifies the manifest covering ``params_dir`` (its step's, or its own): True if one
    matched, False if there is none; DamagedCheckpoint otherwise."""
    if not storage.isdir(params_dir):
        raise integrity.DamagedCheckpoint(f"{storage.dirname(params_dir)}: no {PARAMS_ITEM}/ "
                                          "(empty or partly deleted step)")
    parent = storage.dirname(params_dir)
    if integrity.has_manifest(parent):
        return integrity.verify(parent)
    return integrity.verify(params_dir)


def resolve(path: str) -> tuple[str, str]:
    """path -> (directory holding config.json, directory holding the params item): the
    newest step whose checksums match (damaged newer steps are reported and skipped)."""
    config_dir, params_dirs = _candidates(path)
    first_error = None
    for params_dir in params_dirs:
        try:
            _check(params_dir)
        except integrity.DamagedCheckpoint as e:
            first_error = first_error or e
            if len(params_dirs) > 1:
                _warn(f"skipping damaged checkpoint {storage.dirname(params_dir)}: {e}")
            continue
        return config_dir, params_dir
    raise first_error


class _NoStepMetadataWarning(logging.Filter):
    """Orbax warns that ``_CHECKPOINT_METADATA`` is missing whenever a step's ``params`` item is
    read on its own: that file lives one level up, in the step directory, and the item does
    not need it. Nothing for a user to act on, so it is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Metadata file does not exist" not in record.getMessage()


def load_params(params_dir: str, target=None, *, verify: bool = True):
    """Restores a params pytree (numpy arrays, or ``target``'s shardings if given); a
    damaged or unreadable directory, a parameter holding NaN/Inf, or (for a step without its
    manifest) arrays that differ from the digests committed with the step raise
    DamagedCheckpoint naming it."""
    verified = _check(params_dir) if verify else True
    with _quiet_restore():
        try:
            params = _restore(params_dir, target)
        except BertJaxError:
            raise
        except Exception as e:  # Orbax/tensorstore: truncated, missing or garbled files
            raise integrity.DamagedCheckpoint(
                integrity.describe_failure(params_dir, e)) from None
    if verify:
        _check_values(params_dir, params, verified)
    return params


def _restore(params_dir: str, target):
    import jax
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as ckptr:
        if target is None:
            # A target on this process's first device: checkpoints written by several
            # processes (sharded over another topology) restore onto one machine too.
            device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
            tree = ckptr.metadata(params_dir).item_metadata.tree
            target = jax.tree.map(
                lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=device),
                tree)
            return _to_numpy(ckptr.restore(params_dir, target))
        return ckptr.restore(params_dir, target)


class _quiet_restore:
    """Silences what a failed restore leaves behind: Orbax's missing-metadata warning for an
    item read on its own (``_NoStepMetadataWarning``), and the hundreds of ``Exception
    ignored in: <coroutine ...>`` reports (with TensorStore specs) that abandoned reads print
    when they are collected. The failure itself is reported once, by the caller."""

    def __enter__(self):
        import gc

        self._gc = gc
        self._filter = _NoStepMetadataWarning()
        self._logger = logging.getLogger("absl")
        self._logger.addFilter(self._filter)
        self._hook = sys.unraisablehook
        sys.unraisablehook = lambda unraisable: None
        return self

    def __exit__(self, *exc):
        try:
            self._gc.collect()
        finally:
            sys.unraisablehook = self._hook
            self._logger.removeFilter(self._filter)
        return False


def _check_values(params_dir: str, params, verified: bool) -> None:
    """No parameter read from a checkpoint may hold NaN/Inf; a step without its manifest
    must match the digests committed with it."""
    from bert_jax.checkpoint import digest

    leaf = digest.first_non_finite(params)
    if leaf is not None:
        raise integrity.DamagedCheckpoint(f"{params_dir}: {leaf} holds NaN/Inf")
    if verified:
        return
    recorded = digest.read(storage.dirname(params_dir))
    if recorded is not None:
        leaf = digest.first_mismatch(recorded, {PARAMS_ITEM: params})
        if leaf is not None:
            raise integrity.DamagedCheckpoint(
                f"{params_dir}: {leaf} differs from when saved (content digest mismatch)")


def _to_numpy(tree):
    if isinstance(tree, dict):
        return {k: _to_numpy(v) for k, v in tree.items()}
    return np.asarray(tree)


def load_newest(path: str) -> tuple[str, str, Any]:
    """(directory holding config.json, params directory, params) of the newest step of
    ``path`` that loads and checks; each damaged newer step is reported once on stderr."""
    config_dir, params_dirs = _candidates(path)
    first_error = None
    for params_dir in params_dirs:
        try:
            return config_dir, params_dir, load_params(params_dir)
        except integrity.DamagedCheckpoint as e:
            first_error = first_error or e
            if len(params_dirs) > 1:
                _warn(f"skipping damaged checkpoint {storage.dirname(params_dir)}: {e}")
    raise first_error


def load_model(path: str, *, with_tokenizer: bool = True, with_source: bool = False):
    """Returns (params, config, tokenizer-or-None, extra) from any bert-jax checkpoint path
    (and the params directory read, with ``with_source``).

    Params are numpy arrays in the layout they were saved; use
    ``bert_jax.modeling.params.to_layout`` to match another config's scan/unrolled layout.
    """
    config_dir, _ = _candidates(path)
    config, extra = read_config(config_dir)
    config_dir, params_dir, params = load_newest(path)
    tokenizer = None
    tok_dir = storage.join(config_dir, TOKENIZER_DIR)
    if with_tokenizer and storage.isdir(tok_dir):
        from bert_jax.tokenization import load_tokenizer

        tokenizer = load_tokenizer(tok_dir)
    if with_source:
        return params, config, tokenizer, extra, params_dir
    return params, config, tokenizer, extra
