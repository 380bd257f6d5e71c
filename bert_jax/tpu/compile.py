"""Ahead-of-time compile of the pretraining train step for a TPU slice, without TPUs.

``libtpu`` describes any slice's devices (``topologies.abstract_devices``); the loop's own
mesh, logical-axis rules, sharded abstract state and jitted step (``training/setup.py``
``build_training``) are built over them, lowered with ShapeDtypeStructs (no parameter is ever
materialized) and compiled by the real TPU compiler. The compiled program gives:

* memory per chip (``memory_analysis``): arguments (parameters, optimizer state, the batch),
  outputs not aliased to donated arguments, and temporaries (activations kept for the
  backward pass, gradients, workspace), against the chip's HBM;
* FLOPs and HBM bytes per chip (``cost_analysis``).

Time is predicted with a roofline: a step takes at least its compiled FLOPs at the chip's
bf16 peak and at least its HBM bytes at the chip's HBM bandwidth; the larger of the two is
the estimate. XLA's own ``optimal_seconds`` is not used (it comes back negative for whole
training steps). Collectives over ICI and DCN, pipeline bubbles and kernel inefficiency are
not in the estimate, so real steps are slower: the predicted MFU is an upper bound.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Callable
from typing import Any

from bert_jax.errors import BertJaxError
from bert_jax.tpu import hlo
from bert_jax.tpu.topologies import GIB, Slice
from bert_jax.training.accumulation import Probe


@dataclasses.dataclass
class Estimate:
    """One compiled step on one slice: memory per chip, compiled cost, roofline time."""

    slice: str
    topology: str
    chips: int
    num_slices: int
    chip: str
    mesh: dict[str, int]
    global_batch_size: int
    batch_per_chip: float
    seq_len: int
    num_train_steps: int
    params_bytes: int  # per chip, as sharded
    optimizer_bytes: int
    argument_bytes: int  # everything the step takes (params, optimizer state, batch)
    output_bytes: int  # outputs not aliased to donated arguments
    temp_bytes: int  # activations, gradients, workspace
    code_bytes: int
    hbm_bytes: int
    compiled_flops: float  # per chip per step
    hbm_bytes_accessed: float  # per chip per step
    model_flops_per_sequence: float
    compile_seconds: float
    notes: list[str] = dataclasses.field(default_factory=list)
    microbatches: int = 1  # gradient accumulation steps of the global batch
    scan_layers: bool = False
    num_layers: int = 0
    # the micro-batch search's probes (``microbatches=0`` or ``--max-batch``), in order
    search: list[dict] = dataclasses.field(default_factory=list)
    # HBM bytes per chip per step by part and the collectives, from the compiled HLO with
    # loops weighted by their trip counts (``tpu/hlo.py``)
    hbm_parts: dict[str, float] = dataclasses.field(default_factory=dict)
    collectives: list[dict] = dataclasses.field(default_factory=list)
    chips_per_slice: int = 0
    # the compiled program (optimized HLO text: ``bert-jax compile --save-hlo``); not in
    # the JSON record
    hlo_text: str = dataclasses.field(default="", repr=False)

    @property
    def collective_seconds(self) -> dict[str, float]:
        """Link time per step: ICI for groups inside a slice, DCN for groups that span
        slices (a group larger than a slice, or of exactly ``num_slices`` devices)."""
        from bert_jax.tpu.topologies import CHIPS

        chip = CHIPS[self.chip]
        out = {"ici": 0.0, "dcn": 0.0, "ici_exposed": 0.0, "dcn_exposed": 0.0}
        for c in self.collectives:
            dcn = self.num_slices > 1 and (c["group"] > (self.chips_per_slice or self.chips)
                                           or c["group"] == self.num_slices)
            net = "dcn" if dcn else "ici"
            seconds = c["link_bytes"] / (chip.dcn_bytes_per_s if dcn else chip.ici_bytes_per_s)
            out[net] += seconds
            if not c["asynchronous"]:
                out[f"{net}_exposed"] += seconds
        return out

    @property
    def micro_batch_per_chip(self) -> float:
        return self.batch_per_chip / self.microbatches

    @property
    def loop_scale(self) -> float:
        """XLA's cost analysis counts a loop body once (scanned layers, microbatches), so a
        looping step reports fewer FLOPs than the model does; the roofline then takes the
        model's FLOPs instead (this factor; 1 for unrolled steps, whose compiled FLOPs exceed
        the model count). Its bytes stay as counted, a lower bound like the rest."""
        model = self.model_flops_per_sequence * self.batch_per_chip
        return max(1.0, model / self.compiled_flops) if self.compiled_flops > 0 else 1.0

    @property
    def total_bytes(self) -> int:
        return self.argument_bytes + self.output_bytes + self.temp_bytes + self.code_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.hbm_bytes

    @property
    def compute_seconds(self) -> float:
        from bert_jax.tpu.topologies import CHIPS

        return self.compiled_flops * self.loop_scale / (CHIPS[self.chip].peak_tflops * 1e12)

    @property
    def memory_seconds(self) -> float:
        from bert_jax.tpu.topologies import CHIPS

        return self.hbm_bytes_accessed / CHIPS[self.chip].hbm_bytes_per_s

    @property
    def step_seconds(self) -> float:
        return max(self.compute_seconds, self.memory_seconds)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_seconds >= self.memory_seconds else "HBM bandwidth"

    @property
    def sequences_per_second(self) -> float:
        return self.global_batch_size / self.step_seconds

    @property
    def mfu(self) -> float:
        from bert_jax.tpu.topologies import CHIPS

        peak = CHIPS[self.chip].peak_tflops * 1e12 * self.chips
        return self.sequences_per_second * self.model_flops_per_sequence / peak

    @property
    def schedule_hours(self) -> float:
        return self.num_train_steps * self.step_seconds / 3600.0

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        del out["hlo_text"]
        out.update(total_bytes=self.total_bytes, fits=self.fits,
                   compute_seconds=self.compute_seconds, memory_seconds=self.memory_seconds,
                   step_seconds=self.step_seconds, bound=self.bound,
                   sequences_per_second=self.sequences_per_second,
                   tokens_per_second=self.sequences_per_second * self.seq_len, mfu=self.mfu,
                   schedule_hours=self.schedule_hours, loop_scale=self.loop_scale,
                   chip_hours=self.schedule_hours * self.chips,
                   micro_batch_per_chip=self.micro_batch_per_chip,
                   collective_seconds=self.collective_seconds)
        return out


def _sharded_bytes(tree) -> int:
    """Bytes one device holds of a tree of ShapeDtypeStructs with shardings (the most any
    device holds: shards of uneven splits are padded)."""
    import jax

    total = 0
    for leaf in jax.tree.leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None \
            else leaf.shape
        total += math.prod(shape) * leaf.dtype.itemsize
    return total


def _check_batch(config, mesh, rules) -> None:
    from bert_jax import parallel

    batch, k = config.global_batch_size, config.microbatches
    divisor = parallel.batch_divisor(mesh, rules)
    if k < 1 or batch % k:
        raise BertJaxError(f"global_batch_size={batch} is not divisible by microbatches={k}")
    if (batch // k) % divisor:
        raise BertJaxError(f"each microbatch ({batch // k} sequences) must split evenly over "
                           f"the {divisor} batch shards of the mesh {dict(mesh.shape)}: set "
                           "--config.global_batch_size to a multiple")


def compile_pretraining(config, tpu: Slice, devices: list | None = None,
                        layer_costs: str = "auto", max_batch: bool = False,
                        report: Callable[[str], None] | None = None) -> Estimate:
    """Builds the loop's sharded train step over ``tpu``'s abstract devices, compiles it for
    that slice and returns the estimate. With scanned layers or gradient accumulation,
    ``layer_costs="extrapolate"`` takes FLOPs and bytes from small unrolled compiles
    (``_unrolled_costs``); ``"scanned"`` keeps the looping program's own counts (memory
    checks only). ``microbatches=0`` in the config (auto), or ``max_batch``, first finds the
    largest micro-batch per chip that fits by compiling (``training/accumulation.py``;
    ``report`` gets one line per probe) and estimates the step at it."""
    from bert_jax import parallel
    from bert_jax.tpu.topologies import abstract_devices
    from bert_jax.training.accumulation import largest_fitting, micro_batch_options

    devices = abstract_devices(tpu) if devices is None else devices
    if not (max_batch or config.microbatches == 0):
        estimate = _compile_step(config, tpu, devices)
    else:
        mesh = _mesh(config, tpu, devices)
        shards = parallel.batch_divisor(
            mesh, parallel.rules_from_config(config.parallel.logical_axis_rules))
        per_shard = config.global_batch_size // shards

        def probe(micro: int) -> Probe:
            k = per_shard // micro
            try:
                e = _compile_step(_with_microbatches(config, k), tpu, devices)
            except CompileFailed as failed:
                if not failed.out_of_memory:
                    raise
                return Probe(micro, k, failed.used_bytes, tpu.chip.hbm_bytes, False)
            return Probe(micro, k, e.total_bytes, tpu.chip.hbm_bytes, e.fits, e)

        chosen, probes = largest_fitting(
            micro_batch_options(config.global_batch_size, shards), probe,
            None if report is None else lambda p: report(f"probe       {p.describe()}"))
        config = _with_microbatches(config, chosen.microbatches)
        estimate = chosen.detail
        estimate.search = [dataclasses.asdict(dataclasses.replace(p, detail=None))
                           for p in probes]
    if layer_costs == "auto":
        layer_costs = "hlo" if estimate.microbatches > 1 else "extrapolate"
    if layer_costs == "hlo":
        micro = config.global_batch_size // estimate.microbatches  # sequences per microbatch
        per_chip = estimate.micro_batch_per_chip
        small = micro // int(per_chip // 8) if per_chip >= 8 and per_chip % 8 == 0 else micro
        _hlo_costs(estimate, _compile_step(_probe_config(
            _with_batch(config, small * estimate.microbatches), 1, 1), tpu, devices))
    else:
        _unrolled_costs(estimate, config, layer_costs, lambda layers, k: _compile_step(
            _probe_config(config, layers, k), tpu, devices, unroll_microbatches=True))
    return estimate


def _hlo_costs(estimate: Estimate, probe: Estimate) -> None:
    """Costs of a looping step without unrolled compiles at its size: HBM bytes from the
    compiled program itself, loops weighted by their trip counts (``tpu/hlo.py``); FLOPs as
    the model's times the compiled-over-model ratio of ``probe`` (one unrolled layer at a
    few sequences per chip: attention, softmax, padding beyond the model count)."""
    model = probe.model_flops_per_sequence * probe.batch_per_chip
    ratio = probe.compiled_flops / model if model > 0 else 1.0
    estimate.compiled_flops = ratio * estimate.model_flops_per_sequence * \
        estimate.batch_per_chip
    estimate.hbm_bytes_accessed = sum(estimate.hbm_parts.values())
    estimate.compile_seconds += probe.compile_seconds
    estimate.notes.append(
        f"note        the step loops: HBM bytes are the compiled program's top-level operands "
        f"and results, loops (layers, microbatches) x their trip counts (bert_jax/tpu/hlo.py); "
        f"FLOPs the model's x {ratio:.3f} (compiled over model FLOPs of one unrolled layer "
        f"at {probe.batch_per_chip:g} sequences per chip)")


def _mesh(config, tpu: Slice, devices: list):
    from bert_jax import parallel

    dcn = dict(config.parallel.dcn_mesh)
    if tpu.num_slices > 1 and math.prod(int(v) for v in dcn.values() if v != -1) == 1 \
            and -1 not in dcn.values():
        dcn["data"] = tpu.num_slices  # multislice with an unset DCN mesh: data parallel
    return parallel.create_mesh(config.parallel.mesh, dcn, devices=devices)


def _compile_step(config, tpu: Slice, devices: list, unroll_microbatches: bool = False
                  ) -> Estimate:
    """One compile of the loop's step for ``config`` as it stands (no cost probes)."""
    import jax
    import jax.numpy as jnp

    from bert_jax import parallel
    from bert_jax.runs.metrics import flops_per_sequence
    from bert_jax.training import config as config_lib
    from bert_jax.training.inputs import examples_per_row
    from bert_jax.training.setup import abstract_batch, build_training

    model_cfg = config_lib.model_config(config)
    seq, preds = config.data.max_seq_length, config.data.max_predictions_per_seq
    if seq > model_cfg.max_position_embeddings:
        raise BertJaxError(f"data.max_seq_length={seq} exceeds model max_position_embeddings="
                           f"{model_cfg.max_position_embeddings}")
    mesh = _mesh(config, tpu, devices)
    rules = parallel.rules_from_config(config.parallel.logical_axis_rules)
    _check_batch(config, mesh, rules)
    training = build_training(config, model_cfg, mesh,
                              unroll_microbatches=unroll_microbatches)
    batch = abstract_batch(training.batch_shardings, config.global_batch_size, seq, preds,
                           examples_per_row(config))
    rng = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=parallel.replicated(mesh))
    flops = flops_per_sequence(seq, model_cfg.num_hidden_layers, model_cfg.hidden_size,
                               model_cfg.vocab_size, preds)
    estimate = estimate_step(tpu, mesh, training.train_step,
                             (training.abstract_state, batch, rng), training.abstract_state,
                             global_batch=config.global_batch_size, seq_len=seq,
                             num_train_steps=config.num_train_steps,
                             model_flops_per_sequence=flops)
    estimate.microbatches = int(config.microbatches)
    estimate.scan_layers = bool(model_cfg.scan_layers)
    estimate.num_layers = int(model_cfg.num_hidden_layers)
    return estimate


def _with_layers(config, layers: int):
    """``config`` with ``layers`` unrolled encoder layers (a cost probe)."""
    probe = config.copy_and_resolve_references()
    with probe.unlocked():
        probe.model.num_hidden_layers = layers
        probe.model.scan_layers = False
    return probe


def _with_batch(config, batch: int):
    out = config.copy_and_resolve_references()
    with out.unlocked():
        out.global_batch_size = batch
    return out


def _with_microbatches(config, k: int):
    out = config.copy_and_resolve_references()
    with out.unlocked():
        out.microbatches = k
    return out


def _probe_config(config, layers: int, microbatches: int):
    """A cost probe of ``config``: ``layers`` unrolled encoder layers and ``microbatches``
    microbatches of the same size as the config's."""
    probe = config.copy_and_resolve_references()
    micro = config.global_batch_size // config.microbatches
    with probe.unlocked():
        probe.model.num_hidden_layers = layers
        probe.model.scan_layers = False
        probe.microbatches = microbatches
        probe.global_batch_size = micro * microbatches
    return probe


def _unrolled_costs(estimate: Estimate, config, layer_costs: str, compile_with) -> None:
    """With ``layer_costs="extrapolate"``, replaces the step's FLOPs and HBM bytes where XLA
    counts a loop body once (scanned layers, the accumulation loop) with the unrolled step's,
    from small compiles with 1 and 2 unrolled layers (scanned layers only) and 1 and 2
    unrolled microbatches of the step's size (accumulation only), extrapolated to L layers
    and k microbatches: cost(L, k) = c11 + (L-1) dL + (k-1) dk + (L-1)(k-1) dLk, exact for a
    stack of identical layers and identical microbatches. Memory stays the step's own."""
    layers, k = estimate.num_layers, estimate.microbatches
    scanned = estimate.scan_layers and layers > 2
    if layer_costs != "extrapolate" or not (scanned or k > 1):
        return
    ls = (1, 2) if scanned else (layers,)
    ks = (1, 2) if k > 1 else (1,)
    probes = {(a, b): compile_with(a, b) for a in ls for b in ks}
    x = (layers - 1) if scanned else 0
    y = (k - 1) if k > 1 else 0

    def extrapolate(field: str) -> float:
        c = {key: getattr(e, field) for key, e in probes.items()}
        base = c[(ls[0], ks[0])]
        d_l = c[(2, ks[0])] - base if scanned else 0.0
        d_k = c[(ls[0], 2)] - base if k > 1 else 0.0
        d_lk = (c[(2, 2)] - c[(2, 1)] - c[(1, 2)] + base) if scanned and k > 1 else 0.0
        return base + x * d_l + y * d_k + x * y * d_lk

    estimate.compiled_flops = extrapolate("compiled_flops")
    estimate.hbm_bytes_accessed = extrapolate("hbm_bytes_accessed")
    estimate.compile_seconds += sum(e.compile_seconds for e in probes.values())
    what = " and ".join(part for part, on in (
        (f"{layers} layers from compiles with 1 and 2 unrolled layers", scanned),
        (f"{k} microbatches from 1 and 2 unrolled microbatches", k > 1)) if on)
    estimate.notes.append(
        f"note        the step loops (XLA counts a loop body once): FLOPs and HBM bytes are "
        f"the unrolled step's, extrapolated to {what}; memory is the looping program's")


def estimate_step(tpu: Slice, mesh, step, args, state, *, global_batch: int, seq_len: int,
                  num_train_steps: int, model_flops_per_sequence: float) -> Estimate:
    """Lowers and compiles the jitted ``step`` on abstract ``args`` (ShapeDtypeStructs with
    shardings over ``mesh``); ``state`` is the abstract TrainState among them."""
    start = time.perf_counter()
    try:
        compiled = step.lower(*args).compile()
    except Exception as e:  # the TPU compiler refusing the program (e.g. out of memory)
        raise CompileFailed(tpu, str(e)) from e
    seconds = time.perf_counter() - start
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    text = compiled.as_text()
    parts = hlo.breakdown(text, tpu.chips, tpu.num_slices)
    return Estimate(
        slice=tpu.name, topology=tpu.topology_name, chips=tpu.chips,
        num_slices=tpu.num_slices, chip=tpu.chip.name,
        mesh={k: int(v) for k, v in mesh.shape.items()},
        global_batch_size=global_batch, batch_per_chip=global_batch / tpu.chips,
        seq_len=seq_len, num_train_steps=num_train_steps,
        params_bytes=_sharded_bytes(state.params),
        optimizer_bytes=_sharded_bytes(state.opt_state),
        argument_bytes=int(memory.argument_size_in_bytes),
        output_bytes=int(memory.output_size_in_bytes - memory.alias_size_in_bytes),
        temp_bytes=int(memory.temp_size_in_bytes),
        code_bytes=int(memory.generated_code_size_in_bytes), hbm_bytes=tpu.chip.hbm_bytes,
        compiled_flops=float(cost.get("flops", 0.0)),
        hbm_bytes_accessed=float(cost.get("bytes accessed", 0.0)),
        model_flops_per_sequence=model_flops_per_sequence, compile_seconds=seconds,
        hbm_parts=parts.parts, collectives=parts.to_dict()["collectives"],
        chips_per_slice=tpu.chips_per_slice, hlo_text=text)


class CompileFailed(BertJaxError):
    """The TPU compiler rejected the step (most often: it does not fit in HBM)."""

    def __init__(self, tpu: Slice, message: str):
        first = message.strip().splitlines()[0] if message.strip() else "unknown error"
        self.out_of_memory = "RESOURCE_EXHAUSTED" in message or "memory" in message.lower()
        # XLA:TPU's out-of-memory messages: "... Used 18.31G of 15.75G hbm ..." or "... the
        # total memory required for HLO temporaries (15.75G) exceeds available HBM (15.75G)"
        used = (re.search(r"Used ([\d.]+)([KMGT]?) of ([\d.]+)([KMGT]?) hbm", message)
                or re.search(r"required for HLO temporaries \(([\d.]+)([KMGT]?)\) exceeds "
                             r"available HBM \(([\d.]+)([KMGT]?)\)", message))
        self.used_bytes = self.limit_bytes = None
        if used:
            self.used_bytes = _size(used[1], used[2])
            self.limit_bytes = _size(used[3], used[4])
        super().__init__(f"the TPU compiler rejected the step for {tpu.describe()}: {first}")


def _size(number: str, unit: str) -> int:
    return int(float(number) * 1024 ** " KMGT".index(unit or " "))


LEVERS = ("shard parameters and optimizer state (FSDP): --config.parallel.mesh.data=1 "
          "--config.parallel.mesh.fsdp=-1",
          "recompute activations in the backward pass: --config.model.remat_policy=dots "
          "(or full)",
          "fewer sequences per chip at once: --config.microbatches=N (gradient accumulation) "
          "or a smaller --config.global_batch_size",
          "a larger slice (--topology) or more slices (--num-slices)")


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def format_report(e: Estimate) -> str:
    """The human-readable report ``bert-jax compile`` prints."""
    verdict = (f"FITS: {_gib(e.total_bytes)} of {_gib(e.hbm_bytes)} per chip "
               f"({_gib(e.hbm_bytes - e.total_bytes)} free)") if e.fits else (
        f"DOES NOT FIT: {_gib(e.total_bytes)} per chip, the chip has {_gib(e.hbm_bytes)} "
        f"(over by {_gib(e.total_bytes - e.hbm_bytes)})")
    batch_other = e.argument_bytes - e.params_bytes - e.optimizer_bytes
    lines = [
        f"slice       {e.slice}{f' x {e.num_slices}' if e.num_slices > 1 else ''}: "
        f"{e.chips} {e.chip} chips ({e.topology}), mesh {e.mesh}",
        f"batch       {e.global_batch_size} sequences of {e.seq_len} per step "
        f"({e.batch_per_chip:g} per chip)",
        f"accumulate  {e.microbatches} microbatch{'es' if e.microbatches > 1 else ''} of "
        f"{e.micro_batch_per_chip:g} sequences per chip"
        + (f" (the largest micro-batch that fits, {len(e.search)} compiles)" if e.search
           else ""),
        "memory per chip (compiler's memory analysis)",
        f"  parameters            {_gib(e.params_bytes)}",
        f"  optimizer state       {_gib(e.optimizer_bytes)}",
        f"  batch, step, rng      {_gib(batch_other)}",
        f"  outputs (not donated) {_gib(e.output_bytes)}",
        f"  activations + temps   {_gib(e.temp_bytes)}",
        f"  program code          {_gib(e.code_bytes)}",
        f"  total                 {_gib(e.total_bytes)} of {_gib(e.hbm_bytes)} HBM",
        f"verdict     {verdict}",
        f"compiled    {e.compiled_flops / 1e12:.3f} TFLOP and {e.hbm_bytes_accessed / 1e9:.2f} GB "
        f"HBM traffic per chip per step (compiled in {e.compile_seconds:.1f} s)",
        f"roofline    {e.step_seconds * 1e3:.2f} ms per step ({e.bound} bound: compute "
        f"{e.compute_seconds * 1e3:.2f} ms, HBM {e.memory_seconds * 1e3:.2f} ms)",
        f"predicted   {e.sequences_per_second:,.0f} sequences/s, "
        f"{e.sequences_per_second * e.seq_len:,.0f} tokens/s, MFU {e.mfu:.1%} "
        f"(model FLOPs {e.model_flops_per_sequence / 1e9:.1f} GFLOP per sequence)",
        *_parts_lines(e),
        f"schedule    {e.num_train_steps:,} steps: {e.schedule_hours:,.1f} h wall, "
        f"{e.schedule_hours * e.chips:,.0f} chip-hours",
        "These are compiler estimates: a roofline lower bound on time (collectives, "
        "stalls and kernel efficiency are not counted), so MFU is an upper bound.",
    ]
    if e.loop_scale > 1.05:
        lines.append(
            f"note        the step loops (scanned layers or microbatches): XLA counts a loop "
            f"body once, so the roofline takes the model's FLOPs ({e.loop_scale:.1f}x the "
            f"compiled count); HBM bytes are counted once per loop body (a lower bound)")
    lines += e.notes
    return "\n".join(lines)


def _parts_lines(e: Estimate) -> list[str]:
    """HBM bytes by part and the collectives' link volume and time (``tpu/hlo.py``)."""
    if not e.hbm_parts:
        return []
    total = sum(e.hbm_parts.values())
    parts = ", ".join(f"{k} {v / 1e9:.2f}" for k, v in e.hbm_parts.items() if v)
    lines = [f"HBM parts   {parts} GB (sum {total / 1e9:.2f} GB: the looping program's HLO, "
             f"loops x trip counts)"]
    seconds = e.collective_seconds
    for c in e.collectives:
        lines.append(f"collective  {c['kind']} over groups of {c['group']}: "
                     f"{c['payload_bytes'] / 1e9:.3f} GB payload, {c['link_bytes'] / 1e9:.3f} GB "
                     f"on the links per chip per step, "
                     f"{'async (overlappable)' if c['asynchronous'] else 'synchronous'}")
    if e.collectives:
        lines.append(f"links       ICI {seconds['ici'] * 1e3:.2f} ms (synchronous "
                     f"{seconds['ici_exposed'] * 1e3:.2f} ms), DCN {seconds['dcn'] * 1e3:.2f} ms "
                     f"(synchronous {seconds['dcn_exposed'] * 1e3:.2f} ms) per step, from "
                     f"published link bandwidths; not in the roofline")
    return lines


def not_fit_message(e: Estimate) -> str:
    return (f"the step needs {_gib(e.total_bytes)} per chip but a {e.chip} chip has "
            f"{_gib(e.hbm_bytes)} (over by {_gib(e.total_bytes - e.hbm_bytes)}); levers:\n  "
            + "\n  ".join(LEVERS))


def finetune_batch(task, mesh, rules, batch: int, seq: int) -> dict:
    """ShapeDtypeStructs of one fine-tuning batch of ``task`` (inputs, labels, row weights)
    with the batch split as the loop splits it."""
    import jax
    import jax.numpy as jnp

    from bert_jax import parallel
    from bert_jax.finetuning.trainer import WEIGHT_KEY
    from bert_jax.tasks.base import INPUT_KEYS

    rows = (batch, task.num_choices) if task.kind == "multiple_choice" else (batch,)
    shapes = {k: ((*rows, seq), jnp.int32) for k in INPUT_KEYS}
    for key in task.label_keys:
        if task.kind == "token_classification":
            shapes[key] = ((batch, seq), jnp.int32)
        else:
            shapes[key] = ((batch,), jnp.float32 if task.kind == "regression" else jnp.int32)
    shapes[WEIGHT_KEY] = ((batch,), jnp.float32)
    return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=parallel.batch_sharding(
        mesh, rules, len(shape))) for k, (shape, dtype) in shapes.items()}


def compile_finetuning(config, tpu: Slice, devices: list | None = None,
                       layer_costs: str = "extrapolate") -> Estimate:
    """The fine-tuning loop's train step (``finetuning/trainer.py`` Finetuner, the run config's
    task head, optimizer, mesh and rules) compiled for ``tpu``. The encoder comes from
    ``model.preset`` and the config's model fields (no checkpoint is read: its weights do not
    change the step); the schedule's length depends on the data, so the report gives time per
    step and per 1,000 steps."""
    import jax
    import jax.numpy as jnp

    from bert_jax import parallel
    from bert_jax.finetuning.trainer import Finetuner, build_model, make_tx
    from bert_jax.runs.metrics import flops_per_sequence
    from bert_jax.tasks.registry import get_task
    from bert_jax.tpu.topologies import abstract_devices
    from bert_jax.training import config as config_lib

    devices = abstract_devices(tpu) if devices is None else devices
    task = get_task(config.task)
    if not task.label_keys:
        raise BertJaxError(f"task {task.name} has no training step (no labels)")
    model_cfg = config_lib.model_config(config)
    seq = config.max_seq_length
    if seq > model_cfg.max_position_embeddings:
        raise BertJaxError(f"max_seq_length={seq} exceeds the model's "
                           f"max_position_embeddings={model_cfg.max_position_embeddings}")
    dcn = {"data": tpu.num_slices} if tpu.num_slices > 1 else None
    mesh = parallel.create_mesh(config.parallel.mesh, dcn, devices=devices)
    rules = parallel.rules_from_config(config.parallel.logical_axis_rules)
    steps = 1000
    tx, _ = make_tx(config, steps)
    # (the evaluation batch plays no part in the train step: the train batch stands in for it)
    finetuner = Finetuner(task, build_model(task, model_cfg, config.freeze_encoder), mesh,
                          rules, config.global_batch_size, config.global_batch_size, seq, tx)
    abstract_state, shardings = parallel.abstract_and_shardings(
        lambda rng: finetuner._init_state(finetuner._init_params(rng)), mesh, rules,
        jax.random.PRNGKey(0))
    batch = finetune_batch(task, mesh, rules, config.global_batch_size, seq)
    rng = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=parallel.replicated(mesh))
    per_row = task.num_choices if task.kind == "multiple_choice" else 1
    flops = per_row * flops_per_sequence(seq, model_cfg.num_hidden_layers,
                                         model_cfg.hidden_size, model_cfg.vocab_size, 0)
    estimate = estimate_step(tpu, mesh, finetuner.train_step, (abstract_state, batch, rng),
                             abstract_state, global_batch=config.global_batch_size,
                             seq_len=seq, num_train_steps=steps,
                             model_flops_per_sequence=flops)
    estimate.scan_layers = bool(model_cfg.scan_layers)
    estimate.num_layers = int(model_cfg.num_hidden_layers)
    _unrolled_costs(estimate, config, layer_costs, lambda layers, _: compile_finetuning(
        _with_layers(config, layers), tpu, devices))
    estimate.notes.append(f"fine-tuning {task.name} ({task.kind}); the schedule line is per "
                          f"{steps:,} steps (a run's steps depend on its data)")
    return estimate
