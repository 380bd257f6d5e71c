"""Where one jitted training step spends its device time: a profiler trace of the exact step
that ``bench step pretrain`` (``--task pretrain``, MLM + NSP) or ``bench step finetune``
(``--task classify``) times, summarised per kernel and per kernel category.

  python -m bench profile --task pretrain --model base --seq-len 128 --batch-size 256 \\
      --out bench_out/profile_base128

Every option other than ``--task``, ``--steps``, ``--warmup`` and ``--out`` goes to the
benchmark's own parser (``--model``, ``--seq-len``, ``--batch-size``, ``--attention``,
``--dropout-impl``, ``--xla-flags``, ``--scan``, ``--remat``, ...), and the benchmark's own
``main`` builds the step: it applies the XLA flags (``apply_process_levers``), builds the
state, batches and jitted step, and hands them to ``time_steps``. This suite swaps that one
function for :func:`profile_steps`, so the profiled step is the benchmark's step with no copy of
its set-up; the benchmark stops there (no matmul peak, no record).

:func:`profile_steps` runs ``--warmup`` steps (the first compiles), times ``--steps`` steps
without the profiler, then runs ``--steps`` more under ``jax.profiler.trace(out,
create_perfetto_trace=True)``, blocking on the state and metrics at the end. The Chrome-trace
JSON it writes (``out/plugins/profile/<run>/perfetto_trace.json.gz``, kept) is read here
without tensorboard or xprof: the complete events on the GPU stream lines (processes named
``/device:GPU:N``, threads ``Stream #N(...)``) are summed per kernel name and per category.
Without a GPU (CPU validation) the XLA CPU op events of the host process are used instead.
``summary.json`` and ``summary.md`` go to ``out``; the markdown is printed. XLA also dumps
the step's optimized HLO (flags set before jax starts; kept as ``out/train_step.hlo.txt``),
whose ``op_name`` metadata maps each fusion kernel to the JAX op that produced it: a forward /
backward / optimizer split and an op per top kernel (library kernels stay unattributed).

Caveats: timings are under the profiler (CUPTI adds per-kernel overhead, and XLA may run
op-by-op instead of through command buffers while profiling), so compare the profiled wall
time with the unprofiled one in the same summary before reading the idle gap. Categories come
from kernel names only (:func:`categorize`): check the top-kernel table for names that land
in ``other``.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import re
import shutil
import time
from collections import defaultdict
from unittest import mock

from bench.common import DEFAULT_OUT, environment

TOP_KERNELS = 40

# (category, lower-case name fragments), first match wins. Order matters: collectives before
# reductions ("ReduceScatter"), attention before GEMM (cuDNN/CUTLASS attention kernels),
# GEMM before reductions (cuBLASLt "splitKreduce").
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("memcpy/memset", ("memcpy", "memset")),
    ("collective", ("nccl", "allreduce", "all-reduce", "all_reduce", "allgather", "all-gather",
                    "all_gather", "reducescatter", "reduce-scatter", "reduce_scatter",
                    "alltoall", "all-to-all", "all_to_all", "collective-permute",
                    "collective_permute", "collectivepermute")),
    ("attention", ("flash", "fmha", "sdpa", "cudnn", "_forward_kernel", "_dkdv", "_dq",
                   "attention")),
    ("rng", ("threefry", "philox", "rng")),
    ("gemm", ("gemm", "cutlass", "cublas", "xmma", "nvjet", "dot", "matmul", "gemv")),
    ("reduce/norm", ("reduce", "reduction", "norm", "softmax")),
    ("other fusion", ("fusion", "loop_", "input_", "wrapped_")),
)
OTHER = "other"

# Device-plane lines that are not kernels on a stream (used only when a GPU process has no
# "Stream" lines at all, in case the line naming changes).
_NON_STREAM_LINES = ("cupti overhead", "xla ops", "xla modules", "steps", "framework",
                     "source", "tensorflow", "launch", "counter")


class _StepProfiled(Exception):
    """Raised by the swapped-in ``time_steps`` to end the benchmark's ``main`` after the
    profile (its peak-matmul measurement and result record are not wanted here)."""


# ---- command line ------------------------------------------------------------------------
def parse_args(argv=None) -> tuple[argparse.Namespace, list[str]]:
    """This script's options, and the rest of ``argv`` for the benchmark's parser."""
    ap = argparse.ArgumentParser(
        prog="python -m bench profile",
        description=__doc__.split("\n\n")[0], allow_abbrev=False,
        epilog="All other options are passed to `bench step pretrain` / `bench step finetune` "
               "(--model, --seq-len, --batch-size, --attention, --dropout-impl, "
               "--xla-flags, --scan, --remat, ...; see their --help).")
    ap.add_argument("--task", default="pretrain", choices=["pretrain", "classify"])
    ap.add_argument("--steps", type=int, default=5, help="profiled steps")
    ap.add_argument("--warmup", type=int, default=3, help="unprofiled steps first (compiles)")
    ap.add_argument("--out", default=os.path.join(DEFAULT_OUT, "profile"),
                    help="folder for the trace and summary (default: ./bench_out/profile)")
    args, rest = ap.parse_known_args(argv)
    if args.steps < 1 or args.warmup < 1:
        ap.error("--steps and --warmup must be at least 1 (the first step compiles)")
    return args, rest


def _bench_module(task: str):
    from bench import finetune as bench_finetune
    from bench import pretrain as bench_pretrain

    return bench_pretrain if task == "pretrain" else bench_finetune


# ---- running and tracing -----------------------------------------------------------------
def profile_steps(step, state, batches, rng, *, warmup: int, steps: int, out_dir: str) -> dict:
    """``warmup`` steps, ``steps`` timed steps, then ``steps`` steps under the profiler
    (batches cycled, state threaded through). Returns host wall seconds per step, unprofiled
    and profiled."""
    import jax

    i = 0

    def run(n: int):
        nonlocal state, i
        metrics = None
        for _ in range(n):
            state, metrics = step(state, batches[i % len(batches)], rng)
            i += 1
        jax.block_until_ready((state, metrics))

    run(warmup)
    t0 = time.perf_counter()
    run(steps)
    unprofiled = (time.perf_counter() - t0) / steps
    with jax.profiler.trace(out_dir, create_perfetto_trace=True):
        t0 = time.perf_counter()
        run(steps)
        profiled = (time.perf_counter() - t0) / steps
    return {"wall_s_per_step": profiled, "wall_s_per_step_unprofiled": unprofiled}


def find_trace(out_dir: str) -> str:
    """The newest Chrome-trace file the profiler wrote under ``out_dir`` (the Perfetto copy
    when present, else the ``<host>.trace.json.gz`` it is made from)."""
    for pattern in ("perfetto_trace.json.gz", "*.trace.json.gz"):
        found = glob.glob(os.path.join(out_dir, "plugins", "profile", "*", pattern))
        if found:
            return max(found, key=os.path.getmtime)
    raise FileNotFoundError(f"no perfetto_trace.json.gz or *.trace.json.gz under "
                            f"{out_dir}/plugins/profile: did the profiler write a trace?")


def load_trace(path: str) -> dict:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


# ---- trace parsing -----------------------------------------------------------------------
def categorize(name: str) -> str:
    """The category of a kernel (or XLA op) from its name; see :data:`CATEGORIES`."""
    lower = name.lower()
    for category, fragments in CATEGORIES:
        if any(fragment in lower for fragment in fragments):
            return category
    return OTHER


def _names(trace: dict) -> tuple[dict, dict]:
    """pid -> process name and (pid, tid) -> thread name, from the metadata events."""
    processes, threads = {}, {}
    for e in trace.get("traceEvents", []):
        if e.get("ph") != "M":
            continue
        if e.get("name") == "process_name":
            processes[e.get("pid")] = e.get("args", {}).get("name", "")
        elif e.get("name") == "thread_name":
            threads[(e.get("pid"), e.get("tid"))] = e.get("args", {}).get("name", "")
    return processes, threads


def device_events(trace: dict) -> tuple[dict, str, list[str]]:
    """The complete events that are device work, grouped by device:
    ``({device: [event, ...]}, source, warnings)``.

    GPU: events on the ``Stream ...`` threads of processes named ``/device:GPU:N``. No GPU
    process (CPU run): host events carrying an ``hlo_op`` argument (the XLA CPU runtime's op
    events), grouped by their ``device_ordinal``."""
    processes, threads = _names(trace)
    complete = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"
                and "dur" in e and "ts" in e]
    warnings: list[str] = []
    gpu_pids = {pid for pid, name in processes.items() if "/device:gpu" in name.lower()}
    if gpu_pids:
        def is_stream(key):
            return threads.get(key, "").lower().startswith("stream")

        stream_pids = {pid for pid, _ in filter(is_stream, threads) if pid in gpu_pids}
        for pid in sorted(gpu_pids - stream_pids, key=str):
            warnings.append(f"{processes[pid]}: no 'Stream' threads; used every thread not "
                            f"named like {_NON_STREAM_LINES}")

        def keep(e) -> bool:
            key = (e.get("pid"), e.get("tid"))
            if e.get("pid") in stream_pids:
                return is_stream(key)
            return not threads.get(key, "").lower().startswith(_NON_STREAM_LINES)

        grouped = defaultdict(list)
        for e in complete:
            if e.get("pid") in gpu_pids and keep(e):
                grouped[processes[e["pid"]]].append(e)
        return dict(grouped), "gpu", warnings

    grouped = defaultdict(list)
    for e in complete:
        args = e.get("args") or {}
        if "hlo_op" in args and not e.get("name", "").startswith("end: "):
            grouped[f"cpu:{args.get('device_ordinal', '0')}"].append(e)
    warnings.append("no GPU process in the trace: XLA CPU op events summarised instead "
                    "(a validation run, not a kernel profile)")
    return dict(grouped), "cpu", warnings


def leaf_events(events: list[dict]) -> list[dict]:
    """Drops events that enclose another event on the same thread (CPU ``while``/``call``
    thunks around their body ops), so no time is counted twice. Not applied to GPU stream
    kernels, which never nest (but may overlap their neighbours)."""
    by_thread = defaultdict(list)
    for e in events:
        by_thread[(e.get("pid"), e.get("tid"))].append(e)
    leaves = []
    for thread_events in by_thread.values():
        thread_events.sort(key=lambda e: (e["ts"], -e["dur"]))
        for current, following in zip(thread_events, thread_events[1:] + [None], strict=True):
            # Only enclosing events go: a kernel may start before its predecessor ends
            # (programmatic dependent launch on Hopper) without containing it.
            if (following is None
                    or following["ts"] + following["dur"] > current["ts"] + current["dur"]):
                leaves.append(current)
    return leaves


def busy_time(events: list[dict]) -> float:
    """Length of the union of the events' intervals (time with at least one event running),
    in the trace's unit (microseconds)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted((e["ts"], e["ts"] + e["dur"]) for e in events):
        if start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def summarize_trace(trace: dict, steps: int, wall_s_per_step: float | None = None,
                    top: int = TOP_KERNELS, op_names: dict[str, str] | None = None) -> dict:
    """Per-step kernel statistics of ``trace`` (``steps`` steps), per device averaged over the
    devices found. ``wall_s_per_step``: the host-measured step time (else the device span:
    first kernel start to last kernel end). ``op_names`` (kernel name -> JAX op path,
    :func:`hlo_op_names`) adds ``phases`` (forward / backward / optimizer) and each top
    kernel's ``op``."""
    grouped, source, warnings = device_events(trace)
    if not grouped:
        raise ValueError("the trace has no device kernel events (GPU streams) and no XLA CPU "
                         "op events: nothing to summarise")
    per_device = {device: events if source == "gpu" else leaf_events(events)
                  for device, events in grouped.items()}
    n_dev = len(per_device)
    scale = 1.0 / (1e3 * steps * n_dev)  # summed microseconds -> ms per step per device
    kernel_us, kernel_calls = defaultdict(float), defaultdict(int)
    busy_us = span_us = 0.0
    for events in per_device.values():
        busy_us += busy_time(events)
        span_us += (max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events))
        for e in events:
            kernel_us[e["name"]] += e["dur"]
            kernel_calls[e["name"]] += 1
    kernel_ms = sum(kernel_us.values()) * scale
    busy_ms, span_ms = busy_us * scale, span_us * scale
    wall_ms = span_ms if wall_s_per_step is None else wall_s_per_step * 1e3

    categories = defaultdict(lambda: [0.0, 0])
    for name, us in kernel_us.items():
        entry = categories[categorize(name)]
        entry[0] += us * scale
        entry[1] += kernel_calls[name]

    def share(ms: float) -> float:
        return ms / kernel_ms if kernel_ms else 0.0

    ranked = sorted(kernel_us, key=kernel_us.get, reverse=True)
    summary = {
        "source": source, "devices": sorted(per_device), "steps": steps,
        "wall_ms_per_step": wall_ms, "wall_is_device_span": wall_s_per_step is None,
        "device_span_ms_per_step": span_ms, "busy_ms_per_step": busy_ms,
        "kernel_ms_per_step": kernel_ms, "idle_ms_per_step": wall_ms - busy_ms,
        "busy_share_of_wall": busy_ms / wall_ms if wall_ms else 0.0,
        "kernels_per_step": sum(kernel_calls.values()) / (steps * n_dev),
        "distinct_kernels": len(kernel_us),
        "categories": [
            {"category": c, "ms_per_step": ms, "share": share(ms),
             "kernels_per_step": calls / (steps * n_dev)}
            for c, (ms, calls) in sorted(categories.items(), key=lambda kv: -kv[1][0])],
        "top_kernels": [
            {"name": name, "category": categorize(name),
             "calls_per_step": kernel_calls[name] / (steps * n_dev),
             "ms_per_step": kernel_us[name] * scale, "share": share(kernel_us[name] * scale)}
            for name in ranked[:top]],
        "warnings": warnings,
    }
    if op_names is not None:
        phases = {phase: [0.0, 0] for phase in PHASES}
        for name, us in kernel_us.items():
            entry = phases[phase_of(op_names.get(name))]
            entry[0] += us * scale
            entry[1] += kernel_calls[name]
        summary["phases"] = [{"phase": phase, "ms_per_step": ms,
                              "kernels_per_step": calls / (steps * n_dev)}
                             for phase, (ms, calls) in phases.items() if calls]
        for kernel in summary["top_kernels"]:
            kernel["op"] = short_op(op_names.get(kernel["name"]))
    return summary


# ---- attribution to the program (optimized HLO dumped by XLA) ---------------------------
HLO_DIR = "hlo"
_INSTRUCTION = re.compile(r'^\s+%([\w.\-]+) = .*?op_name="([^"]*)"', re.M)
PHASES = ("forward", "backward", "optimizer / other", "not attributed (library kernels)")


def hlo_dump_flags(out_dir: str) -> str:
    """XLA flags that dump the train step's optimized HLO as text under ``out_dir/hlo``."""
    return (f"--xla_dump_to={os.path.join(out_dir, HLO_DIR)} --xla_dump_hlo_as_text "
            "--xla_dump_hlo_module_re=.*train_step.*")


def find_hlo(out_dir: str) -> str | None:
    """The largest ``*train_step*after_optimizations.txt`` under ``out_dir/hlo`` (the step
    itself; smaller modules are helpers), or None when nothing was dumped (XLA was already
    initialised without the dump flags)."""
    paths = [p for p in glob.glob(os.path.join(out_dir, HLO_DIR, "*after_optimizations.txt"))
             if "train_step" in os.path.basename(p)]
    return max(paths, key=os.path.getsize) if paths else None


def hlo_op_names(text: str) -> dict[str, str]:
    """Kernel name -> the JAX op path of the HLO instruction it runs. Fusion kernels are named
    after their instruction with ``.`` replaced by ``_`` (``input_reduce_fusion.16`` runs as
    ``input_reduce_fusion_16``); library kernels (cuBLAS, cuDNN, Pallas) are not matched."""
    names = {}
    for instruction, op_name in _INSTRUCTION.findall(text):
        names[instruction] = op_name
        names[instruction.replace(".", "_")] = op_name
    return names


def phase_of(op_name: str | None) -> str:
    if op_name is None:
        return PHASES[3]
    if "transpose(jvp(" in op_name:
        return PHASES[1]
    if "jvp(" in op_name:
        return PHASES[0]
    return PHASES[2]


def short_op(op_name: str | None) -> str:
    """``jit(train_step)/transpose(jvp(BertForPreTraining))/bert/encoder/layer_11/mul`` ->
    ``bwd bert/encoder/layer_11/mul``."""
    if op_name is None:
        return ""
    phase = {PHASES[0]: "fwd ", PHASES[1]: "bwd "}.get(phase_of(op_name), "")
    path = [part for part in op_name.split("/") if not part.startswith(("jit(", "jvp(",
                                                                         "transpose("))]
    return phase + "/".join(path)


# ---- report ------------------------------------------------------------------------------
def _cell(name: str, width: int = 90) -> str:
    name = name.replace("|", "\\|").replace("\n", " ")
    return name if len(name) <= width else name[:width - 1] + "…"


def render_markdown(summary: dict) -> str:
    s = summary
    run = s.get("run", {})
    title = " ".join(f"{k}={run[k]}" for k in ("task", "model", "seq_len", "batch_size")
                     if k in run)
    lines = [f"# Step profile: {title}".rstrip(), ""]
    if "device" in run:
        lines.append(f"Device: {run['device']} ({s['source']} trace, {len(s['devices'])} "
                     f"device(s)); jax {run.get('jax', '?')}; {s['steps']} profiled step(s) "
                     f"after {run.get('warmup', '?')} warm-up.")
    if s.get("trace_file"):
        lines.append(f"Trace: `{s['trace_file']}` (open in ui.perfetto.dev).")
    for warning in s["warnings"]:
        lines.append(f"Note: {warning}.")
    wall_label = "device span (no host timing)" if s["wall_is_device_span"] else "wall, profiled"
    lines += ["", "| per step (per device) | ms | share of wall |", "|---|---:|---:|"]
    rows = [(wall_label, s["wall_ms_per_step"])]
    if s.get("wall_ms_per_step_unprofiled") is not None:
        rows.append(("wall, unprofiled", s["wall_ms_per_step_unprofiled"]))
    rows += [("device span (first kernel start to last end)", s["device_span_ms_per_step"]),
             ("busy (union of kernel intervals)", s["busy_ms_per_step"]),
             ("kernel time (sum)", s["kernel_ms_per_step"]),
             ("idle gap (wall − busy)", s["idle_ms_per_step"])]
    wall = s["wall_ms_per_step"]
    for label, ms in rows:
        lines.append(f"| {label} | {ms:.3f} | {100 * ms / wall if wall else 0:.1f}% |")
    lines += ["", f"Kernels per step: {s['kernels_per_step']:.0f} "
                  f"({s['distinct_kernels']} distinct names).", "",
              "| category | ms/step | share of kernel time | kernels/step |",
              "|---|---:|---:|---:|"]
    for c in s["categories"]:
        lines.append(f"| {c['category']} | {c['ms_per_step']:.3f} | {100 * c['share']:.1f}% "
                     f"| {c['kernels_per_step']:.0f} |")
    if s.get("phases"):
        lines += ["", "| phase (from the optimized HLO's op names) | ms/step | kernels/step |",
                  "|---|---:|---:|"]
        for p in s["phases"]:
            lines.append(f"| {p['phase']} | {p['ms_per_step']:.3f} | "
                         f"{p['kernels_per_step']:.0f} |")
    lines += ["", f"Top {len(s['top_kernels'])} kernels:", "",
              "| # | kernel | category | calls/step | ms/step | share | op (one instruction) |",
              "|---:|---|---|---:|---:|---:|---|"]
    for rank, k in enumerate(s["top_kernels"], 1):
        lines.append(f"| {rank} | {_cell(k['name'])} | {k['category']} | "
                     f"{k['calls_per_step']:g} | {k['ms_per_step']:.3f} | "
                     f"{100 * k['share']:.1f}% | {_cell(k.get('op', ''), 70)} |")
    return "\n".join(lines) + "\n"


def write_summary(summary: dict, out_dir: str) -> str:
    with open(os.path.join(out_dir, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    text = render_markdown(summary)
    with open(os.path.join(out_dir, "summary.md"), "w", encoding="utf-8") as f:
        f.write(text)
    return text


# ---- entry point -------------------------------------------------------------------------
def main(argv=None) -> dict:
    args, bench_argv = parse_args(argv)
    out_dir = os.path.abspath(args.out)
    os.makedirs(out_dir, exist_ok=True)
    # Read when XLA starts (the benchmark imports jax later); ignored if it already has.
    os.environ["XLA_FLAGS"] = " ".join(
        v for v in (os.environ.get("XLA_FLAGS", ""), hlo_dump_flags(out_dir)) if v)
    bench = _bench_module(args.task)
    bench_argv = bench_argv + ["--steps", str(args.steps), "--warmup", str(args.warmup),
                               "--repeats", "1",
                               "--out", os.path.join(out_dir, "step.jsonl")]
    bench_args = bench.parse_args(bench_argv)  # validates the passed-through options
    timing: dict = {}

    def time_steps(step, state, batches, rng, steps, repeats, warmup):
        del repeats
        timing.update(profile_steps(step, state, batches, rng, warmup=warmup, steps=steps,
                                    out_dir=out_dir))
        raise _StepProfiled

    with mock.patch.object(bench, "time_steps", time_steps):
        try:
            bench.main(bench_argv)
        except _StepProfiled:
            pass
    if not timing:
        raise RuntimeError(f"{bench.__name__}.main finished without calling time_steps: "
                           "the profile suite needs updating to the benchmark's structure")

    trace_file = find_trace(out_dir)
    shutil.copy(trace_file, os.path.join(out_dir, "trace.json.gz"))  # a shallow copy to fetch
    hlo_file, op_names = find_hlo(out_dir), None
    if hlo_file is not None:
        with open(hlo_file, encoding="utf-8") as f:
            op_names = hlo_op_names(f.read())
        shutil.copy(hlo_file, os.path.join(out_dir, "train_step.hlo.txt"))
    summary = summarize_trace(load_trace(trace_file), args.steps, timing["wall_s_per_step"],
                              op_names=op_names)
    if hlo_file is None:
        summary["warnings"].append("no optimized HLO dumped (XLA started before "
                                   "profile_step set its dump flags): no op attribution")
    else:
        summary["hlo_file"] = "train_step.hlo.txt"
    summary["wall_ms_per_step_unprofiled"] = timing["wall_s_per_step_unprofiled"] * 1e3
    summary["trace_file"] = os.path.relpath(trace_file, out_dir)
    summary["run"] = {**environment(), "task": args.task, "warmup": args.warmup,
                      **{k: v for k, v in vars(bench_args).items()
                         if k not in ("out", "steps", "warmup", "repeats", "peak_size")}}
    print(write_summary(summary, out_dir), end="", flush=True)
    return summary


if __name__ == "__main__":
    main()
