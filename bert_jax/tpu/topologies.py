"""TPU slice names (``v4-32``, ``v5e-256``, ``v5p-128``, ``v6e-64``) -> chip data and the
abstract devices ``libtpu`` compiles for, without TPU hardware.

A slice name counts TensorCores for v4 and v5p (two per chip, run as one "megacore" device)
and chips for v5e and v6e (one TensorCore each), as ``gcloud`` accelerator types do. The
per-chip peaks are Google's published numbers (https://cloud.google.com/tpu/docs/v4, /v5e,
/v5p, /v6e): bf16 matmul peak, HBM capacity and HBM bandwidth.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

from bert_jax.errors import BertJaxError

GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Chip:
    """One TPU generation's per-chip data."""

    name: str  # v4 | v5e | v5p | v6e
    peak_tflops: float  # bf16 dense matmul peak
    hbm_bytes: int
    hbm_bytes_per_s: float
    cores_per_chip: int  # TensorCores behind one JAX device; slice names count cores
    torus_dims: int  # 3 (v4, v5p) or 2 (v5e, v6e)
    chip_config: str  # libtpu's chip config: megacore (two cores as one device) or default
    max_chips: int  # the largest single slice
    # collective (ring) bandwidth per chip over ICI: half the published bidirectional ICI
    # bandwidth (v5e 400 -> 200 GB/s, v6e 800 -> 400, v5p 1200 -> 600), which is also the
    # published all-reduce bandwidth per pod over its chips (v5e 51.2 TB/s / 256, v6e
    # 102.4 / 256, v4 1.1 PB/s / 4096 = 268 GB/s)
    ici_bytes_per_s: float = 0.0
    # data-center network per chip between slices: v5p's published 50 Gbps per chip; v5e's
    # 2 x 100 Gbps per 4-chip host is the same; v4 and v6e taken as the same
    dcn_bytes_per_s: float = 6.25e9


CHIPS: dict[str, Chip] = {
    "v4": Chip("v4", 275.0, 32 * GIB, 1.2e12, 2, 3, "megacore", 4096, 268e9),
    "v5e": Chip("v5e", 197.0, 16 * GIB, 819e9, 1, 2, "default", 256, 200e9),
    "v5p": Chip("v5p", 459.0, 95 * GIB, 2.765e12, 2, 3, "megacore", 8960, 600e9),
    "v6e": Chip("v6e", 918.0, 32 * GIB, 1.64e12, 1, 2, "default", 256, 400e9),
}
ALIASES = {"v5litepod": "v5e", "v5lite": "v5e"}


@dataclasses.dataclass(frozen=True)
class Slice:
    """A TPU slice (or several identical ones over DCN): its chip, chip grid and hosts."""

    name: str  # as given, e.g. v5p-128
    chip: Chip
    shape: tuple[int, ...]  # chips along each torus axis
    num_slices: int = 1

    @property
    def chips_per_slice(self) -> int:
        return math.prod(self.shape)

    @property
    def chips(self) -> int:
        return self.chips_per_slice * self.num_slices

    @property
    def chips_per_host(self) -> int:
        return min(4, self.chips_per_slice)

    @property
    def hosts(self) -> int:
        return self.chips // self.chips_per_host

    @property
    def topology_name(self) -> str:
        """libtpu's name, e.g. ``v5p:4x4x4``."""
        return f"{self.chip.name}:{'x'.join(map(str, self.shape))}"

    def describe(self) -> str:
        slices = f" x {self.num_slices} slices (DCN)" if self.num_slices > 1 else ""
        return (f"{self.name}{slices}: {self.chips} {self.chip.name} chips "
                f"({self.topology_name}, {self.hosts} hosts)")


def chip_grid(chips: int, dims: int) -> tuple[int, ...]:
    """The usual torus shape of a slice: each doubling doubles the smallest axis (the last
    one on ties), from 2x2x1 for 3-D tori (2x2x2, 2x2x4, 2x4x4, 4x4x4, 4x4x8...) and from 1x1
    for 2-D ones (1x2, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16)."""
    if chips < 1 or chips & (chips - 1):
        raise ValueError(f"{chips} chips: slice sizes are powers of two")
    if dims == 3 and chips < 4:
        return (1, 1, chips)
    shape = [2, 2, 1] if dims == 3 else [1, 1]
    while math.prod(shape) < chips:
        smallest = min(shape)
        shape[max(i for i, v in enumerate(shape) if v == smallest)] *= 2
    return tuple(shape)


def parse_slice(name: str, num_slices: int = 1) -> Slice:
    """``v5p-128`` (or ``v5litepod-16``) -> Slice; one clear error naming what is valid."""
    match = re.fullmatch(r"(v\d+[a-z]*)-(\d+)", name.strip().lower())
    valid = ", ".join(f"{c}-N" for c in CHIPS)
    if not match:
        raise BertJaxError(f"--topology {name!r}: expected a slice name such as v4-32, "
                           f"v5e-256, v5p-128 or v6e-64 ({valid})")
    kind, count = ALIASES.get(match[1], match[1]), int(match[2])
    if kind not in CHIPS:
        raise BertJaxError(f"--topology {name!r}: unknown TPU generation {match[1]!r}; "
                           f"known: {sorted(CHIPS)}")
    chip = CHIPS[kind]
    if count % chip.cores_per_chip:
        raise BertJaxError(f"--topology {name!r}: {kind} slice names count TensorCores, "
                           f"{chip.cores_per_chip} per chip")
    chips = count // chip.cores_per_chip
    if chips < 1 or chips & (chips - 1) or chips > chip.max_chips:
        raise BertJaxError(f"--topology {name!r}: {chips} chips; {kind} slices here are powers "
                           f"of two up to {chip.max_chips * chip.cores_per_chip}")
    if num_slices < 1:
        raise BertJaxError(f"--num-slices {num_slices}: expected a positive integer")
    return Slice(name, chip, chip_grid(chips, chip.torus_dims), num_slices)


def prepare_environment() -> None:
    """Environment for compiling against libtpu on a machine without TPUs; call before jax
    initializes its backends. The CPU is the runtime platform (the TPU is only a compile
    target), several processes may load libtpu at once, and libtpu's host probing gets a
    local answer instead of the cloud metadata server. Values already set are kept."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v4-8")


def quiet_libtpu_without_tpus() -> None:
    """On a machine with libtpu installed but no TPU chips (a CPU or GPU machine with the
    test extra), JAX still loads the TPU plugin at start, which then asks the cloud metadata
    server about the host and logs errors. Give it local answers instead (and let several
    processes load it), before JAX initializes; on TPU hosts nothing changes."""
    import glob
    import importlib.util

    if importlib.util.find_spec("libtpu") is None:
        return
    # local: system files. Google's PCI vendor id marks a TPU.
    for path in glob.glob("/sys/bus/pci/devices/*/vendor"):  # local: system file
        try:
            with open(path, encoding="ascii") as f:  # local: system file
                if f.read().strip() == "0x1ae0":
                    return
        except OSError:
            continue
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v4-8")


def abstract_devices(tpu: Slice) -> list:
    """The slice's devices as libtpu describes them (no hardware needed): a compile target
    for ``jax.jit(...).lower(...).compile()``."""
    try:
        from jax.experimental import topologies
    except ImportError as e:  # pragma: no cover - jax without the experimental module
        raise BertJaxError(f"this jax has no topology API ({e})") from None
    bounds = (2, 2, 1) if tpu.chips_per_slice >= 4 else (1, 1, 1)
    if tpu.chips_per_slice == 2:
        bounds = (1, 2, 1) if tpu.chip.torus_dims == 2 else (1, 1, 2)
    try:
        desc = topologies.get_topology_desc(
            platform="tpu", topology_name=tpu.topology_name,
            chip_config_name=tpu.chip.chip_config, chips_per_host_bounds=bounds,
            num_slices=tpu.num_slices)
    except Exception as e:  # libtpu missing or refusing the topology
        raise BertJaxError(
            f"cannot describe TPU topology {tpu.topology_name} x {tpu.num_slices}: {e}. "
            "Compiling for TPUs needs libtpu (pip install 'jax[tpu]' matching the installed "
            "jax, or the test extra)") from None
    return list(desc.devices)
