"""Packed training rows for sentence(-pair) classification and regression (``packing=True``).

Training features (one right-padded row per example) become packed rows of several examples
(``bert_jax/data/packing.py``); labels (and a distillation teacher's logits) become
[rows, max_examples_per_row] per-slot values, and ``example_slots`` marks the filled slots,
which is what the loss weighs. Evaluation and prediction stay unpacked: one output per
example in the original order, the same numbers as without packing.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from bert_jax.data import packing
from bert_jax.errors import BertJaxError

PACKABLE_KINDS = ("classification", "regression")
SLOTS_KEY = "example_slots"  # [rows, k] float32: 1 where a slot holds an example
# Inputs a packed batch adds to the unpacked ones (the model's packing inputs).
INPUT_KEYS = ("example_ids", "position_ids", "cls_positions")


def check_supported(task, config) -> None:
    """A clear error naming ``packing`` for a task or setting packing does not cover."""
    if task.kind not in PACKABLE_KINDS:
        raise BertJaxError(f"packing=True: task {task.name} ({task.kind}) cannot be packed; "
                           "packing covers sentence(-pair) classification and regression "
                           "(GLUE). Set --config.packing=false")
    if config.feature_layers != "last" or config.feature_head != "linear":
        raise BertJaxError("packing=True needs feature_layers='last' and "
                           "feature_head='linear' (the pooled classifier)")


def pack_train_features(features: Mapping[str, np.ndarray], label_keys, config,
                        extra_keys=()) -> dict[str, np.ndarray]:
    """Per-example training features -> packed rows (placement seeded by ``config.seed``)."""
    lengths = np.asarray(features["input_mask"]).sum(axis=1)
    rows = packing.pack_lengths(lengths, config.max_seq_length, config.max_examples_per_row,
                                seed=config.seed)
    per_example = [k for k in (*label_keys, *extra_keys) if k in features]
    return packing.pack_features(features, rows, config.max_examples_per_row, per_example)


def is_packed(features: Mapping[str, np.ndarray]) -> bool:
    return SLOTS_KEY in features
