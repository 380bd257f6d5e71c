"""What every run's config shares: the ``model`` and ``optimizer`` sections, loading an
experiment file ``file.py:variant``, and ``--config.key=value`` overrides (typed, locked: a
typo names the closest valid keys).

Experiment files return an ``ml_collections.ConfigDict`` from ``get_config(variant)``;
:func:`load_config` imports the file, calls it, locks the result and applies overrides.
Pretraining's fields are in ``bert_jax.training.config``, fine-tuning's in
``bert_jax.finetuning.config``.
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


# ---- sections every run has ---------------------------------------------------------------
def model_section() -> ml_collections.ConfigDict:
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


def optimizer_section() -> ml_collections.ConfigDict:
    """The optimizer fields every run reads (``runs/optimizers.py``): AdamW or LAMB, warmup,
    decay, clipping."""
    c = ml_collections.ConfigDict()
    c.name = "adamw"  # adamw | lamb
    c.learning_rate = 1e-4
    c.warmup_steps = 10_000
    c.decay = "linear"  # linear | polynomial | cosine | constant
    c.decay_steps = -1  # -1: num_train_steps
    c.end_learning_rate = 0.0
    c.power = 1.0  # polynomial decay exponent
    c.b1 = 0.9
    c.b2 = 0.999
    c.eps = 1e-6
    c.weight_decay = 0.01  # never on LayerNorm parameters or biases
    c.clip_norm = 1.0  # global-norm clipping; 0 disables

    return c


def model_fields(model: ml_collections.ConfigDict) -> dict[str, Any]:
    """The fields a ``model`` section sets (not None; the preset's value elsewhere), the
    kernel options as a dict under ``kernels`` (absent when none is set)."""
    fields = {k: v for k, v in model.items()
              if k not in ("preset", "kernels") and v is not None}
    kernels = {k: v for k, v in (model.get("kernels") or {}).items() if v is not None}
    if kernels:
        fields["kernels"] = kernels
    return fields


def model_config(config: ml_collections.ConfigDict, vocab_size: int | None = None
                 ) -> BertConfig:
    """The BertConfig of a run's ``model`` section: preset, then the data's vocabulary size,
    then explicit fields."""
    fields = model_fields(config.model)
    if vocab_size is not None and "vocab_size" not in fields:
        fields["vocab_size"] = vocab_size
    kernels = fields.pop("kernels", {})
    return get_preset(config.model.preset, **fields).with_kernels(**kernels)


# ---- loading and overrides ----------------------------------------------------------------
def load_config(spec: str, overrides: Sequence[str] = (),
                validate: Callable[[ml_collections.ConfigDict], None] | None = None
                ) -> ml_collections.ConfigDict:
    """``path/to/file.py[:variant]`` -> locked ConfigDict with ``--config.k=v`` overrides,
    checked by ``validate`` (pretraining: ``bert_jax.training.config.load_config``)."""
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
