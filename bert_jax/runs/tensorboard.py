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

from bert_jax import fileio, protowire, storage


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
    """Appends scalar summaries to a new event file in ``directory`` (created if missing).

    In a bucket (no append) the events are kept in memory and :meth:`flush` uploads the
    whole file again; TensorBoard reads it like any other event file."""

    def __init__(self, directory: str):
        storage.makedirs(directory)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
        self.path = storage.join(directory, name)
        self.remote = storage.is_remote(self.path)
        first = protowire.tfrecord(_event(file_version="brain.Event:2"))
        if self.remote:
            self._events = bytearray(first)
        else:
            self._file = open(self.path, "ab")  # local: append
            self._file.write(first)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """One event at ``step`` holding every ``tag: value`` of ``values``."""
        if step < 0:
            raise ValueError(f"a TensorBoard step must be non-negative, got {step}")
        event = protowire.tfrecord(_event(step, values))
        if self.remote:
            self._events += event
        else:
            self._file.write(event)

    def flush(self) -> None:
        if self.remote:
            fileio.atomic_write(self.path, bytes(self._events))
        else:
            self._file.flush()

    def close(self) -> None:
        if self.remote:
            self.flush()
        else:
            self._file.close()
