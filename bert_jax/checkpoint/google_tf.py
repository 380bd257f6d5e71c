"""Google's original TF BERT checkpoints (``bert_config.json``, ``bert_model.ckpt.*``,
``vocab.txt``) -> bert-jax parameters.

TF variable names are translated to Hugging Face state-dict names (dense kernels ``[in, out]``
transposed to torch's ``[out, in]``) and converted by :mod:`bert_jax.checkpoint.hf`, so both
formats share one mapping; messages still name the original TF variables. Optimizer slots
(``adam_m``, ``adam_v``, ``global_step``) are skipped and reported. TensorFlow is imported only
inside :func:`read_tf_checkpoint`.
"""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np

from bert_jax import storage
from bert_jax.checkpoint.hf import ConversionReport, params_from_hf_state
from bert_jax.config import BertConfig
from bert_jax.errors import BertJaxError

GOOGLE_CONFIG_FILE = "bert_config.json"
VOCAB_FILE = "vocab.txt"

_OPTIMIZER_SLOTS = ("adam_m", "adam_v", "Adam", "Adam_1", "Momentum")
_TRAINING_STATE = ("global_step",)
# Heads of Google's fine-tuning scripts: run_classifier.py and run_squad.py.
_TOP_LEVEL = {
    "cls/predictions/output_bias": "cls.predictions.bias",
    "cls/seq_relationship/output_weights": "cls.seq_relationship.weight",
    "cls/seq_relationship/output_bias": "cls.seq_relationship.bias",
    "output_weights": "classifier.weight",
    "output_bias": "classifier.bias",
    "cls/squad/output_weights": "qa_outputs.weight",
    "cls/squad/output_bias": "qa_outputs.bias",
}


def is_optimizer_state(name: str) -> bool:
    return name in _TRAINING_STATE or name.split("/")[-1] in _OPTIMIZER_SLOTS


def tf_to_hf_name(name: str) -> tuple[str, bool] | None:
    """TF variable name -> (HF state key, transpose?) or None if it is not a BERT weight."""
    if name in _TOP_LEVEL:
        return _TOP_LEVEL[name], False
    if not (name.startswith("bert/") or name.startswith("cls/predictions/transform/")):
        return None
    parts = name.split("/")
    leaf = parts[-1]
    parts = [re.sub(r"^layer_(\d+)$", r"layer.\1", p) for p in parts[:-1]]
    if leaf == "kernel":
        return ".".join(parts + ["weight"]), True
    if leaf in ("gamma", "beta", "bias"):
        return ".".join(parts + ["weight" if leaf == "gamma" else "bias"]), False
    if parts[:2] == ["bert", "embeddings"] and leaf.endswith("_embeddings"):
        return ".".join(parts + [leaf, "weight"]), False
    return None


def find_checkpoint(path: str) -> tuple[str, str]:
    """A directory or checkpoint prefix -> (checkpoint prefix, directory of its files)."""
    path = os.fspath(path)
    if storage.is_remote(path):  # TensorFlow's reader opens files by name: a local copy
        path = (storage.localize(path) if storage.isdir(path) else
                os.path.join(storage.localize(storage.dirname(path)), storage.basename(path)))
    if storage.isdir(path):
        indexes = sorted(storage.glob(storage.join(path, "*.index")))
        if not indexes:
            raise BertJaxError(f"{path}: no TF checkpoint (*.ckpt*.index) found")
        preferred = [p for p in indexes if storage.basename(p) == "bert_model.ckpt.index"]
        if not preferred and len(indexes) > 1:
            found = ", ".join(storage.basename(p) for p in indexes)
            raise BertJaxError(f"{path}: several checkpoints ({found}); pass the prefix of "
                               "one, e.g. DIR/model.ckpt-1000")
        return (preferred or indexes)[0][: -len(".index")], path
    if storage.exists(path + ".index"):
        return path, storage.dirname(storage.abspath(path))
    raise BertJaxError(f"{path}: neither a directory nor a TF checkpoint prefix "
                       f"({path}.index not found)")


def read_tf_checkpoint(prefix: str) -> dict[str, np.ndarray]:
    """Every variable of a TF checkpoint as numpy arrays."""
    try:
        import tensorflow as tf
    except ImportError:
        raise BertJaxError("reading Google TF checkpoints needs TensorFlow (pip install "
                           "'bert-jax[data]')") from None
    try:
        reader = tf.train.load_checkpoint(prefix)
    except Exception as e:  # tf raises several error types for unreadable checkpoints
        raise BertJaxError(f"{prefix}: cannot read TF checkpoint ({e})") from None
    return {name: np.asarray(reader.get_tensor(name))
            for name in sorted(reader.get_variable_to_shape_map())}


def params_from_tf_variables(variables: dict[str, np.ndarray], config: BertConfig,
                             source: str) -> tuple[dict[str, Any], ConversionReport]:
    """TF variables (original Google names) -> bert-jax params and a report in TF names."""
    state, names, ignored, unknown = {}, {}, [], []
    for name, value in variables.items():
        if is_optimizer_state(name):
            ignored.append(name)
            continue
        mapped = tf_to_hf_name(name)
        if mapped is None:
            unknown.append(name)
            continue
        key, transpose = mapped
        state[key] = value.T if transpose else value
        names[key] = name
    params, report = params_from_hf_state(state, config, source=source, names=names)
    report.ignored = sorted(ignored + report.ignored)
    report.unused = sorted(unknown + report.unused)
    return params, report


def load_google_tf(path: str, **config_overrides: Any):
    """Loads a Google BERT checkpoint from its directory or prefix (``DIR/bert_model.ckpt``).

    Returns ``(params, config, tokenizer-or-None, report)`` like :func:`hf.load_hf`.
    """
    from bert_jax.tokenization.wordpiece import WordPieceTokenizer

    prefix, directory = find_checkpoint(path)
    config_path = storage.join(directory, GOOGLE_CONFIG_FILE)
    if not storage.exists(config_path):
        raise BertJaxError(f"{directory}: {GOOGLE_CONFIG_FILE} not found next to the checkpoint")
    config = BertConfig.from_json_file(config_path, **config_overrides)
    params, report = params_from_tf_variables(read_tf_checkpoint(prefix), config,
                                              source=prefix)
    report.architecture = "google-bert"
    vocab = storage.join(directory, VOCAB_FILE)
    tokenizer = WordPieceTokenizer.from_vocab_file(vocab) if storage.exists(vocab) else None
    report.check_tokenizer(tokenizer, config)
    return params, config, tokenizer, report
