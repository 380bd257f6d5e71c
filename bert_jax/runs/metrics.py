"""Training metrics: model FLOPs / MFU, and the writers (metrics.jsonl + TensorBoard).

FLOPs per trained sequence (forward + backward = 3x forward, 2 FLOPs per multiply-add):
``6*s*(12*L*H^2) + 12*L*s^2*H + 6*p*(H^2 + H*V)`` — encoder matmuls, attention scores and
context, and the MLM head on the ``p`` predicted positions only.
"""

from __future__ import annotations

import json
import time
from typing import Any

import jax

from bert_jax import fileio, storage
from bert_jax.runs.tensorboard import EventWriter

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
    path = storage.join(workdir, "metrics.jsonl")
    records = [json.loads(line) for line in storage.read_text(path).splitlines()
               if line.strip()]
    return [r for r in records if split is None or r.get("split") == split]


def truncate_metrics(path: str, after_step: int) -> int:
    """Atomically drops the records of ``path`` with a step beyond ``after_step`` (those a
    resumed run writes again) and any partial last line; returns how many were dropped."""
    if not storage.exists(path):
        return 0
    lines = storage.read_bytes(path).split(b"\n")
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
    TensorBoard event files (``runs/tensorboard.py``). Only process 0 writes.
    ``after_step`` (a resumed run's restored step) first drops later records, so every step
    appears once.

    A bucket has no append: there the records are kept in memory and the whole object is
    rewritten (one atomic upload) at most every ``flush_every_s`` seconds, at :meth:`flush`
    (the training loop calls it after each checkpoint) and at :meth:`close`."""

    def __init__(self, workdir: str, enabled: bool = True, after_step: int | None = None,
                 flush_every_s: float = 30.0):
        self.enabled = enabled
        if not enabled:
            return
        self.path = storage.join(workdir, "metrics.jsonl")
        self.remote = storage.is_remote(self.path)
        self.flush_every_s = flush_every_s
        if after_step is not None:
            truncate_metrics(self.path, after_step)
        if self.remote:
            self._lines = (storage.read_text(self.path).splitlines(keepends=True)
                           if storage.exists(self.path) else [])
            self._dirty, self._flushed_at = False, time.monotonic()
        else:
            self._file = open(self.path, "a", encoding="utf-8")  # local: append
        self._tb = EventWriter(storage.join(workdir, "tensorboard"))

    def write(self, step: int, metrics: dict[str, Any], prefix: str = "train") -> None:
        if not self.enabled:
            return
        record = {"step": step, "split": prefix, **{k: _plain(v) for k, v in metrics.items()}}
        line = json.dumps(record, sort_keys=True) + "\n"
        self._tb.scalars(step, {f"{prefix}/{key}": value for key, value in record.items()
                                if isinstance(value, int | float) and key != "step"})
        if self.remote:
            self._lines.append(line)
            self._dirty = True
            if time.monotonic() - self._flushed_at >= self.flush_every_s:
                self.flush()
        else:
            self._file.write(line)
            self._file.flush()
            self._tb.flush()

    def flush(self) -> None:
        """Makes every record written so far durable."""
        if not self.enabled:
            return
        if self.remote:
            if self._dirty:
                fileio.atomic_write(self.path, "".join(self._lines))
                self._dirty = False
                self._tb.flush()
            self._flushed_at = time.monotonic()
        else:
            self._file.flush()
            self._tb.flush()

    def close(self) -> None:
        if self.enabled:
            self.flush()
            if not self.remote:
                self._file.close()
            self._tb.close()


def _plain(value):
    if hasattr(value, "item"):
        return value.item()
    return value
