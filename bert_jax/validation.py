"""Typed range checks over a nested config, shared by the pretraining checks
(``training/validate.py``) and the fine-tuning checks (``finetuning/validate.py``): each failure is
one ``BertJaxError`` naming the dotted key, its value and the allowed range
(``global_batch_size=0: expected an integer >= 1``)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from bert_jax.errors import BertJaxError


class Checker:
    """Small typed range checks over a (nested) config, errors naming the dotted key."""

    def __init__(self, config, prefix: str = ""):
        self.config, self.prefix = config, prefix

    def _value(self, key: str) -> Any:
        node = self.config
        for part in key.split("."):
            node = node[part]
        return node

    def _fail(self, key: str, value: Any, expected: str):
        raise BertJaxError(f"{self.prefix}{key}={value!r}: expected {expected}")

    def integer(self, key: str, low: int | None = None, high: int | None = None,
                allow: Iterable[int] = ()) -> int:
        value = self._value(key)
        allowed = tuple(allow)
        if value in allowed and not isinstance(value, bool):
            return value
        text = ("an integer" + (f" >= {low}" if low is not None else "")
                + (f" and <= {high}" if high is not None else "")
                + (f" (or {', '.join(map(str, allowed))})" if allowed else ""))
        if isinstance(value, bool) or not isinstance(value, int):
            self._fail(key, value, text)
        if (low is not None and value < low) or (high is not None and value > high):
            self._fail(key, value, text)
        return value

    def number(self, key: str, low: float | None = None, high: float | None = None, *,
               low_open: bool = False, high_open: bool = False,
               optional: bool = False) -> float | None:
        value = self._value(key)
        if value is None and optional:
            return None
        lo = "" if low is None else f"{'>' if low_open else '>='} {low:g}"
        hi = "" if high is None else f"{'<' if high_open else '<='} {high:g}"
        text = "a finite number" + (f" {lo}" if lo else "") + (" and" if lo and hi else "") \
            + (f" {hi}" if hi else "")
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not math.isfinite(value):
            self._fail(key, value, text)
        if low is not None and (value < low or (low_open and value == low)):
            self._fail(key, value, text)
        if high is not None and (value > high or (high_open and value == high)):
            self._fail(key, value, text)
        return float(value)

    def probability(self, key: str, *, zero: bool = True) -> float:
        return self.number(key, 0.0, 1.0, low_open=not zero)

    def choice(self, key: str, choices: Iterable[str]) -> str:
        value, choices = self._value(key), tuple(choices)
        if value not in choices:
            self._fail(key, value, f"one of {', '.join(choices)}")
        return value


def check_mesh(check: Checker, section: str, config) -> None:
    """Every axis of a mesh section: a size >= 1, or -1 (the rest of the devices)."""
    for axis in config[section].keys():
        check.integer(f"{section}.{axis}", 1, allow=(-1,))


def check_optimizer(check: Checker, *, warmup_steps_allow: Iterable[int] = (),
                    warmup_proportion: bool = False) -> None:
    """The ``optimizer`` section (``runs/optimizers.py``'s fields); ``warmup_steps_allow``:
    sentinel values besides counts (fine-tuning's -1: from ``warmup_proportion``)."""
    check.choice("optimizer.name", ("adamw", "lamb"))
    check.number("optimizer.learning_rate", 0.0, low_open=True)
    check.integer("optimizer.warmup_steps", 0, allow=warmup_steps_allow)
    if warmup_proportion:
        check.probability("optimizer.warmup_proportion")
    check.choice("optimizer.decay", ("linear", "polynomial", "cosine", "constant"))
    check.integer("optimizer.decay_steps", 1, allow=(-1,))
    check.number("optimizer.end_learning_rate", 0.0)
    check.number("optimizer.power", 0.0, low_open=True)
    check.number("optimizer.b1", 0.0, 1.0, high_open=True)
    check.number("optimizer.b2", 0.0, 1.0, high_open=True)
    check.number("optimizer.eps", 0.0, low_open=True)
    check.number("optimizer.weight_decay", 0.0)
    check.number("optimizer.clip_norm", 0.0)


def check_model(check: Checker, config) -> None:
    """The numbers of the ``model`` section (BertConfig fields, None = the preset's): dropout
    probabilities in [0, 1], ``initializer_range`` and ``layer_norm_eps`` > 0, every other
    number (sizes, counts, the kernels' tile counts) an integer >= 1 except
    ``pad_token_id``."""
    for key, value in config.model.items():
        if key == "preset" or isinstance(value, bool) or not isinstance(value, int | float):
            continue  # the preset, fields left to it (None), switches, names and tiles
        if isinstance(value, float) and key.endswith("_prob"):
            check.probability(f"model.{key}")
        elif key in ("initializer_range", "layer_norm_eps"):
            check.number(f"model.{key}", 0.0, low_open=True)
        elif key != "pad_token_id":
            check.integer(f"model.{key}", 1)
    for key, value in (config.model.get("kernels") or {}).items():
        if isinstance(value, int) and not isinstance(value, bool):  # tile counts
            check.integer(f"model.kernels.{key}", 1)
