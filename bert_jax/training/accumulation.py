"""Gradient accumulation sized to the device memory (``microbatches=0``, "auto").

A large-batch recipe names its global batch (64k sequences); how many of them a chip can
take at once depends on the chip, the slice and the mesh. ``largest_fitting`` finds the
largest micro-batch per batch shard whose compiled step fits, by compiling: each probe
compiles the step at one micro-batch and reports its memory. The search starts with the
whole batch per shard (no accumulation), brackets the answer between a probe that fits and
one that does not, and picks each next probe from their memory (which grows about linearly
with the micro-batch) and the bisection's middle.
The step then accumulates ``microbatches = batch per shard / micro-batch`` of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from bert_jax.errors import BertJaxError


@dataclasses.dataclass(frozen=True)
class Probe:
    """One compile of the step at one micro-batch."""

    micro_batch: int  # sequences per batch shard (chip) in one microbatch
    microbatches: int  # accumulation steps for the global batch
    total_bytes: int | None  # the compiled step's memory per device (None: not reported)
    limit_bytes: int  # the device memory it must fit
    fits: bool
    detail: object = None  # whatever the probe's compile returned (an estimate), for reuse

    def describe(self) -> str:
        used = "?" if self.total_bytes is None else f"{self.total_bytes / 2 ** 30:.2f}"
        return (f"micro-batch {self.micro_batch:>5} per chip ({self.microbatches:>4} "
                f"microbatches): {used} of {self.limit_bytes / 2 ** 30:.2f} GiB "
                f"{'fits' if self.fits else 'does not fit'}")


def micro_batch_options(global_batch: int, shards: int) -> list[int]:
    """Micro-batches per shard that split the global batch evenly: the divisors of the
    per-shard batch, ascending."""
    if global_batch < 1 or global_batch % shards:
        raise BertJaxError(f"global_batch_size={global_batch} must be a positive multiple of "
                           f"the {shards} batch shards of the mesh")
    per_shard = global_batch // shards
    return [m for m in range(1, per_shard + 1) if per_shard % m == 0]


def _next_index(options: list[int], lo: int | None, hi: int, probes: dict[int, Probe]
                ) -> int:
    """The next option to probe below ``hi`` (does not fit) and above ``lo`` (fits; None:
    none probed yet). Without ``lo``: the micro-batch at which ``hi``'s memory, scaled in
    proportion, meets the limit (an underestimate: part of the memory does not grow with the
    micro-batch). With it: halfway (in options) between the bisection's middle and where the
    line through both probes' memory meets the limit (memory is about linear in the
    micro-batch; the halving guards against curvature)."""
    b = probes[hi]
    if lo is None:
        if not b.total_bytes:
            return hi // 2
        target = options[hi] * b.limit_bytes / b.total_bytes
        return min(max([i for i in range(hi) if options[i] <= target], default=0), hi - 1)
    a = probes[lo]
    middle = guess = (lo + hi + 1) // 2
    if a.total_bytes is not None and b.total_bytes is not None \
            and b.total_bytes > a.total_bytes:
        slope = (b.total_bytes - a.total_bytes) / (b.micro_batch - a.micro_batch)
        target = a.micro_batch + (a.limit_bytes - a.total_bytes) / slope
        guess = max([i for i in range(lo, hi + 1) if options[i] <= target], default=lo)
    return min(max((guess + middle + 1) // 2, lo + 1), hi - 1)


def largest_fitting(options: list[int], probe: Callable[[int], Probe],
                    report: Callable[[Probe], None] | None = None
                    ) -> tuple[Probe, list[Probe]]:
    """The probe of the largest option that fits, and every probe made (in order).
    The largest option (no accumulation) is tried first; ``probe(m)`` compiles at
    micro-batch ``m``."""
    probes: dict[int, Probe] = {}
    made: list[Probe] = []

    def run(i: int) -> Probe:
        p = probes[i] = probe(options[i])
        made.append(p)
        if report is not None:
            report(p)
        return p

    hi, lo = len(options) - 1, None
    if run(hi).fits:
        return probes[hi], made
    while lo is None or hi - lo > 1:
        if lo is None and hi == 0:
            raise BertJaxError(
                f"not even {options[0]} sequence(s) per chip at once fit: "
                f"{made[-1].describe()}; shard the state (--config.parallel.mesh.fsdp=-1), "
                "recompute activations (--config.model.remat_policy=dots) or take a larger "
                "slice")
        i = _next_index(options, lo, hi, probes)
        if run(i).fits:
            lo = i
        else:
            hi = i
    return probes[lo], made
