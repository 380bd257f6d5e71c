"""Parameter-tree utilities: scanned <-> unrolled layer layouts, merging a pretrained encoder
into freshly initialised heads (the pretraining -> fine-tuning bridge)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import numpy as np

from bert_jax.config import BertConfig
from bert_jax.errors import BertJaxError

Params = dict[str, Any]


def unbox(params):
    """Strips flax logical-partitioning boxes."""
    return nn.unbox(params)


def encoder_layout(encoder: Params) -> str:
    """'scan' (stacked ``layers``), 'shared' (one ``layer``) or 'unrolled' (``layer_i``)."""
    if "layers" in encoder:
        return "scan"
    if "layer" in encoder:
        return "shared"
    return "unrolled"


def stack_layers(encoder: Params, num_layers: int) -> Params:
    """{'layer_0': t, ..., 'layer_{L-1}': t} -> {'layers': stacked t} (leading layer axis)."""
    missing = [f"layer_{i}" for i in range(num_layers) if f"layer_{i}" not in encoder]
    if missing:
        raise BertJaxError(f"encoder parameters lack {missing}")
    layers = [encoder[f"layer_{i}"] for i in range(num_layers)]
    return {"layers": jax.tree_util.tree_map(lambda *xs: np.stack(xs), *layers)}


def unstack_layers(encoder: Params) -> Params:
    """{'layers': stacked t} -> {'layer_i': t}."""
    stacked = encoder["layers"]
    n = jax.tree_util.tree_leaves(stacked)[0].shape[0]
    return {f"layer_{i}": jax.tree_util.tree_map(lambda x, i=i: x[i], stacked) for i in range(n)}


def to_layout(params: Params, config: BertConfig) -> Params:
    """Converts a params tree ({'bert': {'encoder': ...}, heads...}) to the layer layout that
    ``config`` builds (scan_layers / share_layers). Shared layers stay a single ``layer``."""
    if "bert" not in params:
        return params
    enc = params["bert"]["encoder"]
    layout = encoder_layout(enc)
    if config.share_layers:
        if layout not in ("shared",) and not (layout == "scan" and config.scan_layers):
            raise BertJaxError("checkpoint has per-layer weights but the config shares layers")
        if config.scan_layers and layout == "shared":
            enc = {"layers": enc["layer"]}
        elif not config.scan_layers and layout == "scan":
            enc = {"layer": enc["layers"]}
    else:
        if layout == "shared":
            raise BertJaxError("checkpoint shares one layer but the config has per-layer weights")
        if config.scan_layers and layout == "unrolled":
            enc = stack_layers(enc, config.num_hidden_layers)
        elif not config.scan_layers and layout == "scan":
            enc = unstack_layers(enc)
    out = dict(params)
    out["bert"] = dict(params["bert"], encoder=enc)
    return out


def merge_pretrained(init_params: Params, pretrained: Params, dont_load: tuple[str, ...] = ()
                     ) -> tuple[Params, list[str]]:
    """Copies every leaf of ``pretrained`` whose path exists in ``init_params`` with the same
    shape (pretrained encoder into a fresh task model). Returns (params, unused paths).

    A path present in both with different shapes is an error naming both shapes; paths
    starting with one of ``dont_load`` keep their fresh initialisation.
    """
    flat_init = _flatten(init_params)
    flat_pre = _flatten(pretrained)
    unused = []
    for path, value in flat_pre.items():
        if path not in flat_init or any(path.startswith(p) for p in dont_load):
            unused.append(path)
            continue
        want = np.shape(flat_init[path])
        if np.shape(value) != want:
            raise BertJaxError(f"parameter {path}: checkpoint shape {np.shape(value)} does not "
                               f"match the model's {want}")
        fresh = flat_init[path]  # an array, or a ShapeDtypeStruct (not initialised yet)
        dtype = fresh.dtype if hasattr(fresh, "dtype") else np.asarray(fresh).dtype
        flat_init[path] = np.asarray(value).astype(dtype)
    return _unflatten(flat_init), sorted(unused)


def _flatten(tree: Params, prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        path = f"{prefix}/{key}" if prefix else key
        if isinstance(value, dict):
            out.update(_flatten(value, path))
        else:
            out[path] = value
    return out


def _unflatten(flat: dict[str, Any]) -> Params:
    out: Params = {}
    for path, value in flat.items():
        node = out
        *parents, leaf = path.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


flatten_params = _flatten
unflatten_params = _unflatten
