"""Which collectives the compiled pretraining step runs: every all-gather, all-reduce and
reduce-scatter of the optimized HLO, grouped by dtype, shape and the JAX op that asked for it.

Compiles (never runs) the benchmark's own train step, so it works on any backend and, with
simulated devices, on a laptop; also prints XLA's per-device estimate of FLOPs, bytes
accessed and temporaries:

  XLA_FLAGS=--xla_force_host_platform_device_count=4 \\
    python -m bench scaling collectives --model base --layers 1 --batch-size 128 --mesh fsdp

With ``--mesh dp`` the census shows each gradient's all-reduces: one per parameter under
``--grad-reduce explicit`` (the default there), the word embeddings twice (lookup and MLM
decoder) and the q/k/v kernel in three parts under ``--grad-reduce partitioner``.

``--hlo FILE`` reads an optimized HLO dump instead (``XLA_FLAGS=--xla_dump_to=DIR``; the
``*after_optimizations.txt`` file, gzipped or not) and adds the schedule: for each async
collective of the entry computation, how much work XLA placed between its start and its done,
which is what overlaps it (on the GPU, DP's gradient all-reduces each overlap one
weight-gradient GEMM at the end of the backward pass):

  python -m bench scaling collectives --hlo DIR/module_*.jit_train_step.*gpu_after_optimizations.txt

Under FSDP the expected picture is parameter-shaped all-gathers (kernels, LayerNorm vectors,
the word table) and gradient reductions; an all-gather whose shape starts with
[batch, seq] means activations are gathered over the batch (a sharding bug: the exit status
is then 1). On CPUs bf16 collectives show as f32 (XLA's CPU backend widens them); run on the
GPU for dtypes. Records go to OUT/collectives.jsonl.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys

from bench.common import results_file
from bench.pretrain import add_common_arguments, add_param_gather_argument

COLLECTIVE = re.compile(
    r"= (\(?[^=]*?) (all-gather|all-reduce|reduce-scatter)(?:-start)?\((.*)$")
ARRAY = re.compile(r"([a-z]+[0-9]*)\[([0-9,]*)\]")
OP_NAME = re.compile(r'op_name="([^"]*)"')


def census(hlo_text: str) -> list[dict]:
    """One record per (collective, dtype, shape, op) with its count, from optimized HLO."""
    counts: collections.Counter = collections.Counter()
    for line in hlo_text.splitlines():
        # tuple shapes carry /*index=5*/ comments, whose "=" the pattern would stop at
        match = COLLECTIVE.search(re.sub(r"/\*.*?\*/", "", line))
        if not match:
            continue
        result, kind, rest = match.groups()
        op = OP_NAME.search(rest)
        op_name = re.sub(r"^jit\([^)]*\)/", "", op.group(1)) if op else ""
        for dtype, dims in ARRAY.findall(result):
            counts[(kind, dtype, dims, op_name)] += 1
    return [{"collective": k, "dtype": d, "shape": [int(x) for x in s.split(",") if x],
             "op": o, "count": n} for (k, d, s, o), n in sorted(counts.items())]


DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4,
               "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8}
INSTRUCTION = re.compile(r"^\s*(?:ROOT )?(%?[\w.-]+) = (.*?) ([\w-]+)\((.*)$")
KIND = re.compile(r"all-reduce|all-gather|reduce-scatter|collective-permute|all-to-all")
MATMUL = re.compile(r'custom_call_target="__cublas|custom_call_target="__cudnn|'
                    r"calls=%?gemm_fusion|calls=%?triton_gemm")


def _entry_lines(hlo_text: str) -> list[str]:
    """The instructions of the ENTRY computation, in schedule order (a scheduled module
    lists them in the order they run)."""
    match = re.search(r"\nENTRY [^\n]*\{\n(.*?)\n\}", hlo_text, re.S)
    if not match:
        raise ValueError("no ENTRY computation in the HLO text")
    return match.group(1).split("\n")


def _bytes(shape_text: str) -> int:
    total = 0
    for dtype, dims in ARRAY.findall(shape_text):
        n = 1
        for d in (x for x in dims.split(",") if x):
            n *= int(d)
        total += n * DTYPE_BYTES.get(dtype, 4)
    return total


def overlap(hlo_text: str) -> dict:
    """The async collectives of a scheduled module's entry computation: for each, its
    position, its bytes (the done's result), and the instructions and matmuls (cuBLAS and
    cuDNN calls, GEMM fusions) scheduled between its start and its done; plus the
    instruction count, so positions read as a fraction of the step."""
    lines = _entry_lines(hlo_text)
    starts, records = {}, []
    for i, line in enumerate(lines):
        match = INSTRUCTION.match(line)
        if not match:
            continue
        name, result, op, operands = match.groups()
        if op.endswith("-start"):  # all-reduce-start(...), or async-start(...) named for it
            kind = KIND.search(name if op == "async-start" else op)
            if kind:
                starts[name.lstrip("%")] = (i, kind.group(0))
        elif op.endswith("-done"):
            source = re.match(r"%?([\w.-]+)", operands)
            if source and source.group(1) in starts:
                begin, collective = starts.pop(source.group(1))
                window = lines[begin + 1:i]
                records.append({"collective": collective, "start": begin, "done": i,
                                "bytes": _bytes(result),
                                "between": len(window),
                                "matmuls_between": sum(bool(MATMUL.search(w)) for w in window)})
    return {"instructions": len(lines), "collectives": records}


def overlap_summary(report: dict) -> dict:
    """The totals that say whether the collectives can hide: bytes whose window holds at
    most one matmul, and where the first start sits in the schedule."""
    recs = report["collectives"]
    total = sum(r["bytes"] for r in recs)
    thin = sum(r["bytes"] for r in recs if r["matmuls_between"] <= 1)
    first = min((r["start"] for r in recs), default=None)
    return {"collectives": len(recs), "gib": total / 2 ** 30,
            "fraction_with_at_most_one_matmul": thin / total if total else None,
            "first_start_at": first / report["instructions"] if first is not None else None}


def batch_activations(records: list[dict], batch: int, seq: int) -> list[dict]:
    """All-gathers of [batch, seq, ...] arrays wider than one value per token."""
    return [r for r in records if r["collective"] == "all-gather"
            and r["shape"][:2] == [batch, seq] and r["shape"][2:] not in ([], [1])]


def per_device_cost(compiled) -> dict:
    """FLOPs, bytes accessed and temporaries of one device's program, from XLA's own
    analyses of the compiled step (estimates, not measurements)."""
    cost = compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
    memory = compiled.memory_analysis()
    return {"gflop": round(cost.get("flops", 0.0) / 1e9, 1),
            "gb_accessed": round(cost.get("bytes accessed", 0.0) / 1e9, 2),
            "temp_mib": round(memory.temp_size_in_bytes / 2 ** 20) if memory else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench scaling collectives",
                                 description=__doc__.splitlines()[0])
    add_common_arguments(ap, batch_size=128)
    add_param_gather_argument(ap)
    ap.add_argument("--hlo", default=None,
                    help="an optimized HLO dump (.txt or .txt.gz) to read instead of compiling")
    args = ap.parse_args(argv)
    args.out = results_file(args.out, "collectives")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    if args.hlo:
        return report_dump(args.hlo, args.out)
    import jax
    import numpy as np

    from bench.common import masked_positions
    from bench.pretrain import (
        experiment_config,
        random_pretraining_batch,
        select_mesh,
    )
    from bert_jax.training.config import model_config
    from bert_jax.training.setup import build_training

    config = experiment_config(args)  # --layers and --vocab-size included
    training = build_training(config, model_config(config),
                              select_mesh(config, args.devices))
    preds = masked_positions(args.seq_len)
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in random_pretraining_batch(
        np.random.default_rng(0), args.batch_size, args.seq_len, preds, args.vocab_size).items()}
    compiled = training.train_step.lower(training.abstract_state, batch,
                                         jax.random.PRNGKey(1)).compile()
    records = census(compiled.as_text())
    cost = per_device_cost(compiled)
    print(f"mesh {dict(training.mesh.shape)}, {jax.devices()[0].platform}; per device: "
          f"{cost['gflop']} GFLOP, {cost['gb_accessed']} GB accessed, "
          f"{cost['temp_mib']} MiB temporaries (XLA's cost and memory analysis)")
    print("| collective | dtype | shape | count | op |\n|---|---|---|---|---|")
    for r in records:
        print(f"| {r['collective']} | {r['dtype']} | {r['shape']} | {r['count']} | {r['op']} |")
    gathered = batch_activations(records, args.batch_size, args.seq_len)
    print(f"\nactivations all-gathered over the batch: {len(gathered)}")
    with open(args.out, "a", encoding="utf-8") as f:
        f.write(json.dumps({"tool": "collectives", "mesh": dict(training.mesh.shape),
                            "model": args.model, "layers": args.layers,
                            "batch_size": args.batch_size, "seq_len": args.seq_len,
                            "param_gather": args.param_gather,
                            "grad_reduce": args.grad_reduce, "per_device": cost,
                            "collectives": records,
                            "batch_activation_gathers": len(gathered)}) + "\n")
    return 1 if gathered else 0


def report_dump(path: str, out: str) -> int:
    """``--hlo``: the census and the overlap schedule of a dumped optimized module."""
    import gzip

    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        text = f.read()
    records, report = census(text), overlap(text)
    summary = overlap_summary(report)
    print(f"{path}: {report['instructions']} instructions in the entry computation")
    print("| # | collective | MiB | start | done | instructions between | matmuls between |")
    print("|---|---|---|---|---|---|---|")
    for k, r in enumerate(report["collectives"]):
        print(f"| {k} | {r['collective']} | {r['bytes'] / 2 ** 20:.1f} | {r['start']} | "
              f"{r['done']} | {r['between']} | {r['matmuls_between']} |")
    print(json.dumps(summary))
    with open(out, "a", encoding="utf-8") as f:
        f.write(json.dumps({"tool": "collectives", "hlo": os.path.basename(path),
                            "collectives": records, "overlap": report,
                            "overlap_summary": summary}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
