"""Training metrics: model FLOPs / MFU, and the writers (metrics.jsonl + TensorBoard).

FLOPs per trained sequence (forward + backward = 3x forward, 2 FLOPs per multiply-add):
``6*s*(12*L*H^2) + 12*L*s^2*H + 6*p*(H^2 + H*V)`` — encoder matmuls, attention scores and
context, and the MLM head on the ``p`` predicted positions only.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax

from bert_jax import fileio
from bert_jax.training.tensorboard import EventWriter

# Dense bf16 peak TFLOP/s per device (vendor data sheets), keyed by jax device_kind prefix.
PEAK_TFLOPS = {
    "NVIDIA H200": 989.0,
    "NVIDIA H100": 989.0,
    "NVIDIA A100": 312.0,
    "TPU v6": 918.0,
    "TPU v5p": 459.0,
    "TPU v5 lite": 197.0,
    "TPU v5e": 197.0,
    "TPU v4": 275.0,
}


def flops_per_sequence(seq_len: int, num_layers: int, hidden: int, vocab: int,
                       predictions: int) -> float:
    s, L, H, V, p = seq_len, num_layers, hidden, vocab, predictions
    return 6 * s * (12 * L * H * H) + 12 * L * s * s * H + 6 * p * (H * H + H * V)


def peak_tflops(configured: float | None) -> float | None:
    """Configured peak, else the data-sheet value for this device kind, else None."""
    if configured:
        return float(configured)
    kind = jax.devices()[0].device_kind
    return next((v for k, v in PEAK_TFLOPS.items() if kind.startswith(k)), None)


def read_metrics(workdir: str, split: str | None = "train") -> list[dict[str, Any]]:
    """The records :class:`MetricsWriter` appended to ``WORKDIR/metrics.jsonl``, in order
    (one per step and split: a resumed run first drops the records after its restored
    step), filtered to ``split`` unless None."""
    path = os.path.join(workdir, "metrics.jsonl")
    with open(path, encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    return [r for r in records if split is None or r.get("split") == split]


def truncate_metrics(path: str, after_step: int) -> int:
    """Atomically drops the records of ``path`` with a step beyond ``after_step`` (those a
    resumed run writes again) and any partial last line; returns how many were dropped."""
    if not os.path.exists(path):
        return 0
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    kept, dropped = [], 0
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            step = int(record["step"])
        except (ValueError, KeyError, TypeError):
            dropped += 1  # a line cut short by a kill
            continue
        if step > after_step:
            dropped += 1
        else:
            kept.append(line + b"\n")
    if dropped:
        fileio.atomic_write(path, b"".join(kept))
    return dropped


class MetricsWriter:
    """Appends one JSON object per line to ``metrics.jsonl`` and mirrors scalars to
    TensorBoard event files (``training/tensorboard.py``). Only process 0 writes.
    ``after_step`` (a resumed run's restored step) first drops later records, so every step
    appears once."""

    def __init__(self, workdir: str, enabled: bool = True, after_step: int | None = None):
        self.enabled = enabled
        if not enabled:
            return
        self.path = os.path.join(workdir, "metrics.jsonl")
        if after_step is not None:
            truncate_metrics(self.path, after_step)
        self._file = open(self.path, "a", encoding="utf-8")
        self._tb = EventWriter(os.path.join(workdir, "tensorboard"))

    def write(self, step: int, metrics: dict[str, Any], prefix: str = "train") -> None:
        if not self.enabled:
            return
        record = {"step": step, "split": prefix, **{k: _plain(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()
        self._tb.scalars(step, {f"{prefix}/{key}": value for key, value in record.items()
                                if isinstance(value, int | float) and key != "step"})
        self._tb.flush()

    def close(self) -> None:
        if self.enabled:
            self._file.close()
            self._tb.close()


def _plain(value):
    if hasattr(value, "item"):
        return value.item()
    return value
