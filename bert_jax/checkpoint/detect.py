"""Which checkpoint format a path holds, and loading any of them as (params, config,
tokenizer, report).

Accepted: a bert-jax model directory, a training workdir or one of its step folders
(``bert_jax.checkpoint.store``), or a Hugging Face model directory (``config.json`` without
bert-jax's ``"format"`` beside ``model.safetensors`` / ``pytorch_model.bin`` or their index).
"""

from __future__ import annotations

import json
from typing import Any

from bert_jax import storage
from bert_jax.checkpoint import store
from bert_jax.config import BertConfig

HF_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                   "pytorch_model.bin.index.json")


def is_hf_directory(path: str) -> bool:
    """A Hugging Face model directory (config.json without bert-jax's format + weights)."""
    config_path = storage.join(path, store.CONFIG_FILE)
    if not storage.isfile(config_path):
        return False
    try:
        if json.loads(storage.read_text(config_path)).get("format") == "bert_jax":
            return False
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return False
    return any(storage.exists(storage.join(path, w)) for w in HF_WEIGHT_FILES)


def load_checkpoint(path: str) -> tuple[dict, BertConfig, Any, list[str]]:
    """(params, config, tokenizer-or-None, report lines) of a bert-jax or HF checkpoint."""
    if storage.isdir(path) and is_hf_directory(path):
        from bert_jax.checkpoint.families import load_hf_any

        params, config, tokenizer, report = load_hf_any(path)
        return params, config, tokenizer, [f"Hugging Face checkpoint: {line}"
                                           for line in report.lines()]
    params, config, tokenizer, _, params_dir = store.load_model(path, with_source=True)
    return params, config, tokenizer, [f"bert-jax checkpoint: {params_dir}"]
