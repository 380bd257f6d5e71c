"""Markdown tables from the benchmark JSON lines: bert-jax vs transformers (ratio, MFU, memory),
the lever sweep (change vs the sweep's baseline), the loop vs the step, and scaling.

  python -m bench summary bench_out            # every *.jsonl in the folder
  python -m bench summary bench/tables/pretrain_step_h200.jsonl

Records are matched on (task, model, seq_len, batch_size); the last record of a kind wins.
Tags written by bench/run_gpu.sh: ``core`` (headline runs), ``lever:<name>`` (the sweep,
``lever:baseline`` its reference), ``scaling_*`` (per-run records of ``bench scaling run``).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

# performance goals: (task, model, seq_len) -> (min ratio vs transformers, min MFU)
TARGETS = {("pretrain", "base", 128): (1.5, 0.55), ("pretrain", "large", 128): (1.5, 0.60),
           ("pretrain", "large", 512): (1.5, 0.60), ("classify", "base", 128): (1.5, None)}


def load(paths: list[str]) -> list[dict]:
    """The records of JSON-lines files; a folder stands for its ``*.jsonl`` files."""
    files = []
    for path in paths:
        files += sorted(glob.glob(os.path.join(path, "*.jsonl"))) if os.path.isdir(path) \
            else [path]
    records = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    records.append(json.loads(line))
    return records


def _key(r: dict) -> tuple:
    return (r.get("task"), r.get("model"), r.get("seq_len"), r.get("batch_size"))


def _run_kind(r: dict) -> tuple:
    """(tag, workload): peer runs carry no tag (their error records carry ``peer``); plain
    Flax runs carry ``plain``."""
    tag = "peer" if r.get("framework") == "transformers" else r.get("tag")
    return (tag, *_key(r))


def _fmt(value, spec: str = ",.0f") -> str:
    return "—" if value is None else format(value, spec)


def _pct(value) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def _runs(records: list[dict], framework: str, tag: str | None = None) -> dict[tuple, dict]:
    """Completed runs of ``framework`` (with ``tag`` when given) by workload; the last wins."""
    return {_key(r): r for r in records if r.get("framework") == framework
            and (tag is None or r.get("tag") == tag) and "seq_per_s" in r}


def _pairs(ours: dict[tuple, dict], other: dict[tuple, dict]):
    """(workload, bert-jax run, other run, seq/s ratio) for every workload either side ran."""
    for key in sorted(set(ours) | set(other), key=lambda k: tuple(str(x) for x in k)):
        a, b = ours.get(key), other.get(key)
        yield key, a, b, (a["seq_per_s"] / b["seq_per_s"] if a and b else None)


def _pair_cells(key: tuple, a: dict | None, b: dict | None) -> str:
    """The workload, then seq/s, MFU and peak GiB of each side (a missing side as dashes)."""
    return f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | " + " | ".join(
        f"{_fmt(r and r['seq_per_s'])} | {_pct(r and r['mfu'])} | "
        f"{_fmt(r and r.get('peak_memory_gib'), '.1f')}" for r in (a, b))


def core_table(records: list[dict]) -> list[str]:
    lines = ["| task | model | seq | batch | bert-jax seq/s | MFU | peak GiB | transformers "
             "seq/s | MFU | peak GiB | ratio | target |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, a, b, ratio in _pairs(_runs(records, "bert-jax", "core"),
                                   _runs(records, "transformers")):
        target = TARGETS.get(key[:3])
        met = ""
        if target and ratio is not None:
            ok = ratio >= target[0] and (target[1] is None or a["mfu"] >= target[1])
            met = ("met" if ok else "missed") + f" (≥{target[0]}x" + (
                f", ≥{target[1]:.0%} MFU)" if target[1] else ")")
        lines.append(f"{_pair_cells(key, a, b)} | {_fmt(ratio, '.2f')} | {met} |")
    return lines


def plain_table(records: list[dict]) -> list[str]:
    """bert-jax's core runs against the plain Flax step of ``bench peers flax`` (bert-jax
    should be clearly faster than it) in the same records."""
    plain = _runs(records, "plain-flax", "plain")
    if not plain:
        return []
    lines = ["| task | model | seq | batch | bert-jax seq/s | MFU | peak GiB | plain-Flax "
             "seq/s | MFU | peak GiB | plain dropout | bert-jax / plain |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, a, b, ratio in _pairs(_runs(records, "bert-jax", "core"), plain):
        dropout = "—" if b is None else f"hidden {b.get('hidden_dropout_rate', 0):g}, attention 0"
        lines.append(f"{_pair_cells(key, a, b)} | {dropout} | {_fmt(ratio, '.2f')} |")
    return lines


def _achieved_tflops(r: dict) -> float | None:
    """Model TFLOP/s per device of a record (MFU x its own measured peak)."""
    if r.get("mfu") is None or not r.get("matmul_peak_tflops"):
        return None
    return r["mfu"] * r["matmul_peak_tflops"]


def common_peak_lines(records: list[dict]) -> list[str]:
    """MFU of the core pairs against one peak: the highest matmul rate measured by any run of
    the same device in these records. Each process's own peak moves by up to ~15% from run
    to run on one card, and MFU with it; this column holds every run to the same (the most
    demanding) ceiling, so MFUs compare across runs and frameworks."""
    top: dict[str, float] = {}
    for r in records:
        if r.get("matmul_peak_tflops") and r.get("device"):
            top[r["device"]] = max(top.get(r["device"], 0.0), r["matmul_peak_tflops"])
    rows = []
    for r in records:
        achieved = _achieved_tflops(r)
        if achieved is None or r.get("device") not in top or "seq_per_s" not in r:
            continue
        if not (r.get("framework") in ("transformers", "plain-flax")
                or (r.get("framework") == "bert-jax" and r.get("tag") == "core")):
            continue
        rows.append(f"| {r['framework']} | {r.get('task')} | {r.get('model')} | "
                    f"{r.get('seq_len')} | {r.get('batch_size')} | {achieved:,.0f} | "
                    f"{_pct(r['mfu'])} ({r['matmul_peak_tflops']:.0f}) | "
                    f"{_pct(achieved / top[r['device']])} ({top[r['device']]:.0f}) |")
    if not rows:
        return []
    return ["| framework | task | model | seq | batch | TFLOP/s | MFU (own peak) | "
            "MFU (top peak of the records) |", "|---|---|---|---|---|---|---|---|", *rows]


def lever_table(records: list[dict]) -> list[str]:
    levers = [r for r in records if str(r.get("tag", "")).startswith("lever:")]
    # A lever is compared with the baseline of the same workload (any batch: "batch_512").
    baselines = {_key(r)[:3]: r for r in levers
                 if r["tag"] == "lever:baseline" and "seq_per_s" in r}
    lines = ["| model | seq | batch | lever | seq/s | vs baseline | MFU | peak GiB |",
             "|---|---|---|---|---|---|---|---|"]
    for r in levers:
        base = baselines.get(_key(r)[:3])
        name = r["tag"][len("lever:"):]
        if "seq_per_s" not in r:
            lines.append(f"| {r.get('model')} | {r.get('seq_len')} | {r.get('batch_size')} | "
                         f"{name} | failed: {r.get('error', '?')} | | | |")
            continue
        change = (r["seq_per_s"] / base["seq_per_s"] - 1) if base else None
        lines.append(f"| {r['model']} | {r['seq_len']} | {r['batch_size']} | {name} | "
                     f"{r['seq_per_s']:,.0f} | "
                     f"{'—' if change is None else f'{100 * change:+.1f}%'} | "
                     f"{_pct(r['mfu'])} | {_fmt(r.get('peak_memory_gib'), '.1f')} |")
    return lines


def loop_table(records: list[dict]) -> list[str]:
    lines = ["| model | seq | batch | source | loop seq/s | step seq/s | loop/step |",
             "|---|---|---|---|---|---|---|"]
    for r in records:
        if r.get("task") == "pretrain_loop":
            lines.append(f"| {r['model']} | {r['seq_len']} | {r['batch_size']} | "
                         f"{r['source']} | {r['loop_seq_per_s']:,.0f} | "
                         f"{_fmt(r.get('step_seq_per_s'))} | "
                         f"{_fmt(r.get('loop_over_step'), '.3f')} |")
    return lines


def scaling_tables(records: list[dict]) -> list[str]:
    lines = []
    # (a skipped or failed scaling run leaves an error record: the "Failed runs" list has it)
    for s in (r for r in records if r.get("task") == "scaling_summary" and "dp" in r):
        extra = " ".join(s.get("extra_args") or []) or "default flags"
        lines += [f"Scaling: {s['model']}/{s['seq_len']}, {s['per_device_batch']} sequences "
                  f"per device, {s.get('device')}, {extra}", "",
                  "| devices | DP seq/s | DP efficiency | FSDP seq/s | FSDP cost | "
                  "state GiB/device FSDP (DP) | peak GiB FSDP (DP) |",
                  "|---|---|---|---|---|---|---|"]
        for n, d in sorted(s["dp"].items(), key=lambda kv: int(kv[0])):
            f = s["fsdp"].get(n) or s["fsdp"].get(str(n)) or {}
            lines.append(
                f"| {n} | {d['seq_per_s']:,.0f} | {_pct(d['efficiency'])} | "
                f"{_fmt(f.get('seq_per_s'))} | {_pct(f.get('throughput_cost'))} | "
                f"{_fmt(f.get('state_gib_per_device'), '.2f')} "
                f"({_fmt(f.get('dp_state_gib_per_device'), '.2f')}) | "
                f"{_fmt(f.get('peak_memory_gib'), '.1f')} "
                f"({_fmt(f.get('dp_peak_memory_gib'), '.1f')}) |")
        if s.get("failed"):
            lines.append(f"\nFailed runs: {', '.join(s['failed'])}")
        lines.append("")
    return lines


def other_table(records: list[dict]) -> list[str]:
    """Every completed run the tables above leave out (A/B runs tagged ``name:variant`` with
    ``--tag``), in record order."""
    rows = [r for r in records if "seq_per_s" in r and (
        r.get("framework") == "bert-jax" or (r.get("framework") == "plain-flax"
                                             and r.get("tag") != "plain"))
            and r.get("tag") != "core" and not str(r.get("tag", "")).startswith(
                ("lever:", "scaling")) and r.get("task") != "pretrain_loop"]
    lines = ["| tag | task | model | seq | batch | seq/s | MFU | peak GiB |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.get('tag')} | {r.get('task')} | {r.get('model')} | "
                     f"{r.get('seq_len')} | {r.get('batch_size')} | {r['seq_per_s']:,.0f} | "
                     f"{_pct(r.get('mfu'))} | {_fmt(r.get('peak_memory_gib'), '.1f')} |")
    return lines if rows else []


def render(records: list[dict]) -> str:
    devices = sorted({r["device"] for r in records if r.get("device")})
    peaks = [r["matmul_peak_tflops"] for r in records if r.get("matmul_peak_tflops")]
    out = [f"Device(s): {', '.join(devices) or 'unknown'}"]
    if peaks:
        out.append(f"Measured bf16 matmul peak: {min(peaks):.0f}–{max(peaks):.0f} TFLOP/s "
                   f"over {len(peaks)} runs (MFU uses each run's own)")
    out += ["", "## bert-jax vs transformers", ""] + core_table(records)
    plain = plain_table(records)
    if plain:
        out += ["", "## bert-jax vs the plain Flax step (`python -m bench peers flax`)", ""] + plain
    common = common_peak_lines(records)
    if common:
        out += ["", "MFU against one ceiling per device: the highest matmul peak any run here "
                "measured", ""] + common
    if any(str(r.get("tag", "")).startswith("lever:") for r in records):
        out += ["", "## Levers", ""] + lever_table(records)
    others = other_table(records)
    if others:
        out += ["", "## Other runs (by tag)", ""] + others
    if any(r.get("task") == "pretrain_loop" for r in records):
        out += ["", "## Loop vs step", ""] + loop_table(records)
    if any(r.get("task") == "scaling_summary" for r in records):
        out += ["", "## Scaling", ""] + scaling_tables(records)
    # a failed or skipped run that another record of the same kind completed is not listed
    done = {_run_kind(r) for r in records if "seq_per_s" in r}
    failed = [r for r in records if "error" in r and not str(r.get("tag", "")).startswith(
        ("lever:", "scaling_")) and _run_kind(r) not in done]
    if failed:
        out += ["", "## Failed runs", ""] + [_failed_line(r) for r in failed]
    return "\n".join(out) + "\n"


def _failed_line(r: dict) -> str:
    """One failed run: the command bench/run_gpu.sh recorded, or the run's workload."""
    if "command" in r:
        return f"- python -m bench {' '.join(r['command'])}: {r['error']}"
    return f"- {r.get('tag') or r.get('task')} {r.get('model')}/{r.get('seq_len')}: {r['error']}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench summary",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", help="JSON-lines result files or folders of them")
    args = ap.parse_args(argv)
    sys.stdout.write(render(load(args.paths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
