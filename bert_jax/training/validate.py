"""Range checks of every number in a pretraining config, run when the config is loaded.

A bad value stops the run before anything is compiled or written, with one message naming
the key and the allowed range (``global_batch_size=0: expected an integer >= 1``). The
checks that need the devices (the batch split over the mesh) run in the loop's setup, still
before compilation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from bert_jax.errors import BertJaxError

# The pretraining objectives (training/config.py reads them from here) and data sources
# (auto: picked from what data.directory holds; training/inputs.py).
OBJECTIVES = ("nsp", "sop", "mlm", "sbo", "electra", "distill")
DATA_SOURCES = ("auto", "tfrecord", "materialized", "synthetic")


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
    for axis in config[section].keys():
        check.integer(f"{section}.{axis}", 1, allow=(-1,))


def validate_pretraining(config) -> None:
    """BertJaxError naming the first out-of-range value of a pretraining ConfigDict."""
    c = Checker(config)
    c.choice("objective", OBJECTIVES)
    c.choice("data.source", DATA_SOURCES)
    c.integer("data.max_seq_length", 8)
    c.integer("data.max_predictions_per_seq", 1)
    c.probability("data.masked_lm_prob", zero=False)
    c.integer("data.shuffle_buffer", 1)
    c.integer("data.seed", 0)
    c.number("data.wait_timeout_s", 0.0)
    if "short_seq_prob" in config.data:
        c.probability("data.short_seq_prob")
    batch = c.integer("global_batch_size", 1)
    micro = c.integer("microbatches", 1)
    if batch % micro:
        raise BertJaxError(f"global_batch_size={batch}: expected a multiple of "
                           f"microbatches={micro}")
    c.integer("num_train_steps", 1)
    c.integer("seed", 0)
    c.choice("optimizer.name", ("adamw", "lamb"))
    c.number("optimizer.learning_rate", 0.0, low_open=True)
    c.integer("optimizer.warmup_steps", 0)
    c.choice("optimizer.decay", ("linear", "polynomial", "cosine", "constant"))
    c.integer("optimizer.decay_steps", 1, allow=(-1,))
    c.number("optimizer.end_learning_rate", 0.0)
    c.number("optimizer.power", 0.0, low_open=True)
    c.number("optimizer.b1", 0.0, 1.0, high_open=True)
    c.number("optimizer.b2", 0.0, 1.0, high_open=True)
    c.number("optimizer.eps", 0.0, low_open=True)
    c.number("optimizer.weight_decay", 0.0)
    c.number("optimizer.clip_norm", 0.0)
    check_mesh(c, "parallel.mesh", config)
    check_mesh(c, "parallel.dcn_mesh", config)
    c.integer("checkpoint.every_steps", 1)
    c.integer("checkpoint.keep", 1)
    c.integer("log_every", 1)
    c.integer("eval_every", 1)
    c.integer("eval_steps", 0)
    c.integer("max_skipped_in_row", 1)
    c.number("peak_tflops", 0.0, low_open=True, optional=True)
    profile = tuple(config.profile_steps)
    if profile and (len(profile) != 2 or not all(isinstance(s, int) for s in profile)
                    or not 0 <= profile[0] < profile[1]):
        raise BertJaxError(f"profile_steps={profile!r}: expected () or (first, last) with "
                           "0 <= first < last")
    for key, value in config.model.items():
        if key in ("preset",) or value is None:
            continue
        if isinstance(value, int | float) and not isinstance(value, bool):
            if key.endswith("_prob"):
                c.probability(f"model.{key}")
            elif key in ("initializer_range", "layer_norm_eps"):
                c.number(f"model.{key}", 0.0, low_open=True)
            elif key != "pad_token_id":
                c.integer(f"model.{key}", 1)
