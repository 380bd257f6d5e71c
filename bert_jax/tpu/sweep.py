"""A bounded sweep of ``bert-jax compile`` over BERT sizes, sequence lengths, TPU slices and
parallelism / remat settings, written as JSON lines and a Markdown table (docs/tpu.md).

    python -m bert_jax.tpu.sweep --out DIR [--set paper|lamb] [--only SUBSTRING] [--list]

Each row is one compile of the pretraining step (the loop's own step, abstract state) for one
slice. ``max batch/chip`` extrapolates linearly from that compile: the temporaries beyond one
float32 copy of the parameters (the gradients) are taken to grow with the batch, the state not
at all. Everything here is a compiler estimate (``bert_jax/tpu/compile.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from bert_jax import fileio, storage

FSDP = ("--config.parallel.mesh.data=1", "--config.parallel.mesh.fsdp=-1")
SCAN = ("--config.model.scan_layers=true",)


@dataclasses.dataclass(frozen=True)
class Row:
    label: str
    variant: str
    topology: str
    num_slices: int = 1
    overrides: tuple[str, ...] = ()
    # extrapolate: FLOPs and bytes from 1- and 2-layer unrolled compiles (the time columns);
    # scanned: one compile (rows that are about memory and fit)
    layer_costs: str = "auto"

    def command(self) -> str:
        slices = f" --num-slices {self.num_slices}" if self.num_slices > 1 else ""
        costs = " --layer-costs scanned" if self.layer_costs == "scanned" else ""
        return (f"bert-jax compile --config experiments/pretrain.py:{self.variant} "
                f"--topology {self.topology}{slices}{costs} {' '.join(self.overrides)}").strip()


def _batch(n: int) -> str:
    return f"--config.global_batch_size={n}"


# The paper's schedules: phase 1 (seq 128, 900k steps of 256) and phase 2 (seq 512, 100k of
# 256) for Base and Large on one slice each; DP vs FSDP (and tensor), remat, multislice, on
# v4, v5e, v5p and v6e slices. Layers are scanned (``model.scan_layers``: one layer compiled
# instead of 12 or 24, the same step); rows about memory compile once (``layer_costs``).
ROWS: tuple[Row, ...] = (
    Row("Base/128 DP", "bert_base_phase1", "v4-32", overrides=SCAN),
    Row("Base/512 DP", "bert_base_phase2", "v4-32", overrides=SCAN),
    Row("Large/128 DP", "bert_large_phase1", "v5p-128"),
    Row("Large/512 DP", "bert_large_phase2", "v5p-128"),
    Row("Large/128 DP", "bert_large_phase1", "v6e-64"),
    Row("Large/128 DP, 2 slices", "bert_large_phase1", "v5e-128", num_slices=2),
    Row("Large/128 DP, 80/chip", "bert_large_phase1", "v5e-256",
        overrides=(_batch(20480),), layer_costs="scanned"),
    Row("Large/128 FSDP, 80/chip", "bert_large_phase1", "v5e-256",
        overrides=(*FSDP, _batch(20480)), layer_costs="scanned"),
    Row("Large/512 FSDP", "bert_large_phase2", "v5e-64", overrides=FSDP,
        layer_costs="scanned"),
    Row("Large/512 FSDP, remat=dots", "bert_large_phase2", "v5e-64",
        overrides=(*FSDP, "--config.model.remat_policy=dots"), layer_costs="scanned"),
    Row("Large/512 FSDP 16 x tensor 4", "bert_large_phase2", "v5e-64",
        overrides=(*FSDP, "--config.parallel.mesh.tensor=4")),
)

# The large-batch LAMB recipes (experiments/pretrain.py ``bert_*_lamb_phase*``: You et al.'s
# 65,536 x 128 and 32,768 x 512) at the batch pods run: each row finds its micro-batch by
# compiling (``microbatches=0``) and extrapolates FLOPs and bytes from unrolled probes.
LAMB_ROWS: tuple[Row, ...] = (
    Row("Large/128 LAMB DP", "bert_large_lamb_phase1", "v5p-128"),
    Row("Large/512 LAMB DP", "bert_large_lamb_phase2", "v5p-128"),
    Row("Large/128 LAMB FSDP", "bert_large_lamb_phase1", "v5p-128", overrides=FSDP),
    Row("Large/512 LAMB FSDP", "bert_large_lamb_phase2", "v5p-128", overrides=FSDP),
    Row("Large/128 LAMB DP", "bert_large_lamb_phase1", "v4-64"),
    Row("Large/512 LAMB DP", "bert_large_lamb_phase2", "v4-64"),
    Row("Large/128 LAMB FSDP", "bert_large_lamb_phase1", "v4-64", overrides=FSDP),
    Row("Large/512 LAMB FSDP", "bert_large_lamb_phase2", "v4-64", overrides=FSDP),
    Row("Large/128 LAMB DP, 2 slices", "bert_large_lamb_phase1", "v5p-128", num_slices=2),
    Row("Base/128 LAMB DP", "bert_base_lamb_phase1", "v4-32"),
    Row("Base/512 LAMB DP", "bert_base_lamb_phase2", "v4-32"),
    Row("Large/128 LAMB FSDP", "bert_large_lamb_phase1", "v5e-256", overrides=FSDP),
    Row("Large/512 LAMB FSDP", "bert_large_lamb_phase2", "v5e-256", overrides=FSDP),
    Row("Large/128 LAMB DP", "bert_large_lamb_phase1", "v6e-256"),
    Row("Large/128 LAMB DP", "bert_large_lamb_phase1", "v6e-64"),
    Row("Large/128 LAMB DP", "bert_large_lamb_phase1", "v5p-256"),
    Row("Large/128 LAMB DP, 2 slices", "bert_large_lamb_phase1", "v6e-256", num_slices=2),
)
SETS = {"paper": ROWS, "lamb": LAMB_ROWS}


def max_batch_per_chip(e) -> float:
    """Sequences per chip that would fill HBM, extrapolated linearly from one compile."""
    fixed = e.argument_bytes + e.output_bytes + e.code_bytes + e.params_bytes
    per_sequence = max(e.total_bytes - fixed, 1) / e.batch_per_chip
    return max(0.0, (e.hbm_bytes - fixed) / per_sequence)


def run_row(row: Row) -> dict:
    from bert_jax.errors import BertJaxError
    from bert_jax.tpu.compile import CompileFailed, compile_pretraining
    from bert_jax.tpu.topologies import parse_slice
    from bert_jax.training.config import load_config

    record = {"label": row.label, "variant": row.variant, "topology": row.topology,
              "num_slices": row.num_slices, "overrides": list(row.overrides),
              "layer_costs": row.layer_costs,
              "command": row.command()}
    start, cpu_start = time.perf_counter(), time.process_time()
    try:
        config = load_config(f"experiments/pretrain.py:{row.variant}", row.overrides)
        estimate = compile_pretraining(config, parse_slice(row.topology, row.num_slices),
                                       layer_costs=row.layer_costs)
    except CompileFailed as e:
        record.update(compiled=False, fits=False, error=str(e))
    except BertJaxError as e:
        record.update(compiled=False, fits=None, error=str(e))
    else:
        record.update(compiled=True, **estimate.to_dict(),
                      max_batch_per_chip=max_batch_per_chip(estimate))
    record["seconds"] = time.perf_counter() - start
    record["cpu_seconds"] = time.process_time() - cpu_start  # all of the process's threads
    return record


def _derived(record: dict) -> dict:
    """The record's derived numbers (fit, speed, MFU) recomputed from its raw compile fields,
    so that tables follow the current roofline."""
    from bert_jax.tpu.compile import Estimate

    names = {f.name for f in dataclasses.fields(Estimate)}
    estimate = Estimate(**{k: v for k, v in record.items() if k in names})
    return {**record, **estimate.to_dict(), "max_batch_per_chip": max_batch_per_chip(estimate)}


def mfu_factors(record: dict) -> dict[str, float]:
    """What holds a row's predicted MFU below 100%, as factors whose product is 1 / MFU:
    ``flops``, the compiled FLOPs over the model's (attention softmax, padding, the rest
    beyond the model count); ``hbm``, the roofline step over its compute time (above 1 when
    HBM traffic bounds the step). ``links`` is the synchronous collectives' link time over
    the roofline step: not in the roofline, it would lower MFU by 1 / (1 + links)."""
    r = _derived(record)
    model = r["model_flops_per_sequence"] * r["batch_per_chip"]
    links = r["collective_seconds"]
    return {"flops": r["compiled_flops"] * r["loop_scale"] / model,
            "hbm": r["step_seconds"] / r["compute_seconds"],
            "links": (links["ici_exposed"] + links["dcn_exposed"]) / r["step_seconds"]}


def _bound_text(record: dict) -> str:
    f = mfu_factors(record)
    bound = f"HBM x{f['hbm']:.2f}" if f["hbm"] > 1.0 else "compute"
    return f"{bound}, FLOPs x{f['flops']:.2f}, sync links +{f['links']:.1%}"


def _collectives_text(record: dict) -> str:
    """Link bytes per chip per step by kind, and whether XLA made them asynchronous."""
    kinds: dict[tuple[str, bool], float] = {}
    for c in record.get("collectives", ()):
        key = (c["kind"], c["asynchronous"])
        kinds[key] = kinds.get(key, 0.0) + c["link_bytes"]
    return "; ".join(f"{kind} {volume / 1e9:.2f} {'async' if asynchronous else 'sync'}"
                     for (kind, asynchronous), volume in sorted(kinds.items())) or "none"


def lamb_markdown(records: list[dict]) -> str:
    """The large-batch table: micro-batch and accumulation found by compiling, speed, what
    bounds the step (and by how much), HBM traffic, the collectives by kind and their link
    time."""
    out = ["| configuration | slice | mesh | micro-batch/chip x steps | memory/chip (GiB) | "
           "seq/s | MFU | bounded by (1/MFU = HBM x FLOPs) | HBM GB/step | "
           "collectives GB/step on links | ICI, DCN ms (sync) | schedule (h, chip-h) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        slices = f" x{r['num_slices']}" if r["num_slices"] > 1 else ""
        name = r.get("slice") or r["topology"]
        if not r.get("compiled"):
            out.append(f"| {r['label']} | {name}{slices} | | | | | | | | | | "
                       f"{r.get('error', '')[:100].replace('|', '/')} |")
            continue
        r = _derived(r)
        mesh = "x".join(f"{k}{v}" for k, v in r["mesh"].items() if v > 1) or "1"
        links = r["collective_seconds"]
        out.append(
            f"| {r['label']} | {name}{slices} | {mesh} | {r['micro_batch_per_chip']:g} x "
            f"{r['microbatches']} | {r['total_bytes'] / 2**30:.1f} / "
            f"{r['hbm_bytes'] / 2**30:.0f} | {r['sequences_per_second']:,.0f} | "
            f"{r['mfu']:.0%} | {_bound_text(r)} | "
            f"{r['hbm_bytes_accessed'] / 1e9:,.0f} | {_collectives_text(r)} | "
            f"{links['ici'] * 1e3:.1f} ({links['ici_exposed'] * 1e3:.1f}), "
            f"{links['dcn'] * 1e3:.1f} ({links['dcn_exposed'] * 1e3:.1f}) | "
            f"{r['schedule_hours']:,.2f}, {r['chip_hours']:,.0f} |")
    return "\n".join(out)


def markdown(records: list[dict]) -> str:
    head = ("| configuration | slice | mesh | batch/chip | memory/chip (GiB) | fits | "
            "max batch/chip | seq/s | MFU | schedule (h, chip-h) |\n"
            "|---|---|---|---|---|---|---|---|---|---|")
    out = [head]
    for r in records:
        r = _derived(r) if r.get("compiled") else r
        slices = f" x{r['num_slices']}" if r["num_slices"] > 1 else ""
        name = r.get("slice") or r["topology"]
        if not r.get("compiled"):
            error = r.get("error", "")
            error = error[max(error.find("RESOURCE_EXHAUSTED"), 0):].replace("|", "/")
            out.append(f"| {r['label']} | {name}{slices} | | | | "
                       f"{'no' if r.get('fits') is False else '?'} | | | | "
                       f"{error[:100]} |")
            continue
        mesh = "x".join(f"{k}{v}" for k, v in r["mesh"].items() if v > 1) or "1"
        # a row compiled once with scanned layers has no trustworthy byte count: fit only
        timed = r.get("layer_costs", "extrapolate") != "scanned"
        speed = (f"{r['sequences_per_second']:,.0f} | {r['mfu']:.0%} | "
                 f"{r['schedule_hours']:,.1f}, {r['chip_hours']:,.0f}") if timed else \
            "(fit only) | | "
        out.append(
            f"| {r['label']} | {name}{slices} | {mesh} | {r['batch_per_chip']:g} | "
            f"{r['total_bytes'] / 2**30:.1f} / {r['hbm_bytes'] / 2**30:.0f} | "
            f"{'yes' if r['fits'] else 'no'} | {r['max_batch_per_chip']:.0f} | {speed} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="directory for sweep.jsonl and sweep.md (required to run)")
    ap.add_argument("--set", choices=sorted(SETS), default="paper",
                    help="paper: the paper's batch 256 (docs/tpu.md's first table); lamb: the "
                         "large-batch LAMB recipes")
    ap.add_argument("--only", default="", help="rows whose label or topology contains this")
    ap.add_argument("--list", action="store_true", help="print the rows' commands and stop")
    ap.add_argument("--table", nargs="+", metavar="JSONL",
                    help="print the Markdown table of earlier sweep.jsonl files and stop")
    args = ap.parse_args(argv)
    if args.table:
        records = []
        for path in args.table:
            records += [json.loads(line) for line in storage.read_text(path).splitlines()
                        if line.strip()]
        print((lamb_markdown if args.set == "lamb" else markdown)(records))
        return 0
    rows = [r for r in SETS[args.set] if args.only in r.label or args.only in r.topology]
    if args.list:
        print("\n".join(r.command() for r in rows))
        return 0
    if not args.out:
        ap.error("--out is required to run the sweep")
    from bert_jax.tpu.topologies import prepare_environment

    prepare_environment()
    storage.makedirs(args.out)
    path = storage.join(args.out, "sweep.jsonl")
    done = {}
    if storage.exists(path):  # rows already compiled (an interrupted sweep) are kept
        done = {r["command"]: r for r in map(
            json.loads, filter(str.strip, storage.read_text(path).splitlines()))}
    records = [done[r.command()] for r in rows if r.command() in done]
    kept = list(done.values())
    for row in rows:
        if row.command() in done:
            continue
        print(f"[{len(records) + 1}/{len(rows)}] {row.command()}", flush=True)
        record = run_row(row)
        records.append(record)
        kept.append(record)  # each finished row is saved at once (one rewrite)
        fileio.atomic_write(path, "".join(json.dumps(r, sort_keys=True) + "\n"
                                          for r in kept))
        print(f"  {'fits' if record.get('fits') else 'does not fit'}"
              f"{'' if record.get('compiled') else ' (not compiled)'}, "
              f"{record['seconds']:.0f} s", flush=True)
    order = {r.command(): i for i, r in enumerate(rows)}
    records.sort(key=lambda r: order.get(r["command"], len(order)))
    table = (lamb_markdown if args.set == "lamb" else markdown)(records)
    fileio.atomic_write(storage.join(args.out, "sweep.md"), table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
