"""Holding out a dev split from train, reproducibly.

Some data comes with a train split only (a GLUE task folder with train.tsv alone, a SQuAD
sample). The dev split is then a seeded random fraction of train: by row for GLUE,
CoNLL and SWAG; by article for SQuAD, so no context paragraph or article is seen in both.
The same (fraction, seed) always gives the same rows, and the two parts never overlap.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Sequence

import numpy as np

from bert_jax import storage
from bert_jax.errors import BertJaxError
from bert_jax.tasks.base import ExampleList


def holdout_groups(groups: Sequence[Hashable], fraction: float, seed: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (train, dev), both sorted: whole groups go to dev until ``fraction`` of the
    distinct groups is reached (at least one, never all)."""
    if not 0.0 < fraction < 1.0:
        raise BertJaxError(f"holdout_fraction={fraction}: expected a number in (0, 1)")
    order = list(dict.fromkeys(groups))  # distinct groups in first-seen order
    if len(order) < 2:
        raise BertJaxError(f"cannot hold out a dev split from {len(order)} group(s) of train")
    count = min(len(order) - 1, max(1, int(round(fraction * len(order)))))
    perm = np.random.default_rng(seed).permutation(len(order))
    dev_groups = {order[i] for i in perm[:count]}
    is_dev = np.fromiter((g in dev_groups for g in groups), dtype=bool, count=len(groups))
    return np.flatnonzero(~is_dev), np.flatnonzero(is_dev)


def holdout_rows(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (train, dev) of ``n`` rows, ``round(fraction * n)`` of them in dev."""
    return holdout_groups(range(n), fraction, seed)


def squad_articles(path: str) -> dict[str, int]:
    """Question id -> index of its article in an official SQuAD JSON file."""
    data = json.loads(storage.read_text(path))
    return {qa["id"]: a for a, article in enumerate(data["data"])
            for paragraph in article.get("paragraphs", []) for qa in paragraph["qas"]}


def split_examples(examples: Sequence, fraction: float, seed: int,
                   groups: Sequence[Hashable] | None = None) -> tuple[ExampleList, ExampleList]:
    """(train, dev) example lists; ``groups`` (one key per example) keeps groups together."""
    keys = range(len(examples)) if groups is None else groups
    if len(keys) != len(examples):
        raise BertJaxError(f"{len(keys)} group keys for {len(examples)} examples")
    train_idx, dev_idx = holdout_groups(list(keys), fraction, seed)
    return (ExampleList([examples[i] for i in train_idx]),
            ExampleList([examples[i] for i in dev_idx]))
