"""glibc malloc settings for runs whose XLA programs execute on the host CPU.

XLA's CPU runtime allocates each execution's temporary buffer afresh (tens of MB for the
demo's train step) from its worker threads. glibc serves such a request from a fresh
``mmap`` (it is above the largest mmap threshold glibc accepts, 32 MiB) or from a
per-thread arena heap that it unmaps again once the block is free, so every step touches
new zero pages: a page fault per 4 KiB, most of the process's system time. With one arena,
no ``mmap`` for large blocks and a trim threshold above the program's working set, freed
blocks go back to the heap and the next step reuses them (``docs/performance.md``, "The
host CPU").

The settings apply to arenas created after :func:`configure` runs, so the CLI calls it
before anything starts threads. Machines with an accelerator keep glibc's defaults: there
the host's memory traffic is the input pipeline, whose many threads do better with
per-thread arenas. ``BERT_JAX_CPU_MALLOC=0`` keeps the defaults on a CPU-only machine too;
``=1`` applies the settings whatever the machine has.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os

ENVIRONMENT_SWITCH = "BERT_JAX_CPU_MALLOC"

# mallopt parameter numbers (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8

ARENAS = 1
TRIM_THRESHOLD = 1 << 30  # bytes of free heap top kept before memory goes back to the system

# Device files of the accelerators jax drives: NVIDIA GPUs, TPU v2-v4 (accel), TPU v5+ (vfio).
_ACCELERATOR_FILES = ("/dev/nvidia[0-9]*", "/dev/accel[0-9]*", "/dev/vfio/[0-9]*")


def host_runs_programs(environ=os.environ) -> bool:
    """Whether jax will execute on the CPU: ``JAX_PLATFORMS`` says only ``cpu``, or no
    accelerator device file exists."""
    platforms = environ.get("JAX_PLATFORMS", "").strip().lower()
    if platforms:
        return platforms == "cpu"
    return not any(glob.glob(pattern)  # local: this machine's device files
                   for pattern in _ACCELERATOR_FILES)


def _glibc():
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # noqa: B018 - present in glibc only
        return libc
    except (OSError, AttributeError):
        return None


def configure(environ=os.environ) -> bool:
    """Applies the settings above where they help; returns whether they were applied."""
    switch = environ.get(ENVIRONMENT_SWITCH, "").strip()
    if switch == "0" or (switch != "1" and not host_runs_programs(environ)):
        return False
    libc = _glibc()
    if libc is None:  # musl, macOS: another allocator, nothing to set
        return False
    applied = [
        libc.mallopt(_M_ARENA_MAX, ARENAS),
        libc.mallopt(_M_MMAP_MAX, 0),
        libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD),
    ]
    return all(applied)
