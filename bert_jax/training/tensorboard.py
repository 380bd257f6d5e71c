"""TensorBoard event files of scalars, written without tensorflow, tensorboardX or torch.

An event file is a TFRecord file of ``tensorflow.Event`` messages: first one that names the
format (``file_version: "brain.Event:2"``), then one per step, ``Event{wall_time=1: double,
step=2: int64, summary=5: Summary{value=1: Value{tag=1: string, simple_value=2: float}}}``.
``tensorboard --logdir DIR`` reads every ``events.out.tfevents.*`` file under DIR.
"""

from __future__ import annotations

import os
import socket
import time

from bert_jax import protowire


def _event(step: int | None = None, scalars: dict[str, float] | None = None,
           file_version: str | None = None) -> bytes:
    out = protowire.field_double(1, time.time())
    if step is not None:
        out += protowire.field_varint(2, step)
    if file_version is not None:
        out += protowire.field_bytes(3, file_version)
    if scalars:
        values = b"".join(
            protowire.field_bytes(1, protowire.field_bytes(1, tag)
                                  + protowire.field_float(2, float(value)))
            for tag, value in scalars.items())
        out += protowire.field_bytes(5, values)
    return out


class EventWriter:
    """Appends scalar summaries to a new event file in ``directory`` (created if missing)."""

    def __init__(self, directory: str):
        os.makedirs(directory, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
        self.path = os.path.join(directory, name)
        self._file = open(self.path, "ab")
        self._file.write(protowire.tfrecord(_event(file_version="brain.Event:2")))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """One event at ``step`` holding every ``tag: value`` of ``values``."""
        if step < 0:
            raise ValueError(f"a TensorBoard step must be non-negative, got {step}")
        self._file.write(protowire.tfrecord(_event(step, values)))

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()
