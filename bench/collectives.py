"""Which collectives the compiled pretraining step runs: every all-gather, all-reduce and
reduce-scatter of the optimized HLO, grouped by dtype, shape and the JAX op that asked for it.

Compiles (never runs) the benchmark's own train step, so it works on any backend and, with
simulated devices, on a laptop; also prints XLA's per-device estimate of FLOPs, bytes
accessed and temporaries:

  XLA_FLAGS=--xla_force_host_platform_device_count=4 \\
    python bench/collectives.py --model base --layers 1 --batch-size 128 --mesh fsdp

Under FSDP the expected picture is parameter-shaped all-gathers (kernels, LayerNorm vectors,
the word table) and gradient reductions; an all-gather whose shape starts with
[batch, seq] means activations are gathered over the batch (the bug the fourth session
found: ``docs/performance.md``, scaling). On CPUs bf16 collectives show as f32 (XLA's CPU
backend widens them); run on the GPU for dtypes.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_pretrain import add_common_arguments, add_param_gather_argument  # noqa: E402

COLLECTIVE = re.compile(
    r"= (\(?[^=]*?) (all-gather|all-reduce|reduce-scatter)(?:-start)?\((.*)$")
ARRAY = re.compile(r"([a-z]+[0-9]*)\[([0-9,]*)\]")
OP_NAME = re.compile(r'op_name="([^"]*)"')


def census(hlo_text: str) -> list[dict]:
    """One record per (collective, dtype, shape, op) with its count, from optimized HLO."""
    counts: collections.Counter = collections.Counter()
    for line in hlo_text.splitlines():
        match = COLLECTIVE.search(line)
        if not match:
            continue
        result, kind, rest = match.groups()
        op = OP_NAME.search(rest)
        op_name = re.sub(r"^jit\([^)]*\)/", "", op.group(1)) if op else ""
        for dtype, dims in ARRAY.findall(result):
            counts[(kind, dtype, dims, op_name)] += 1
    return [{"collective": k, "dtype": d, "shape": [int(x) for x in s.split(",") if x],
             "op": o, "count": n} for (k, d, s, o), n in sorted(counts.items())]


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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(ap, batch_size=128)
    ap.add_argument("--layers", type=int, default=0, help="num_hidden_layers (0: preset's)")
    add_param_gather_argument(ap)
    args = ap.parse_args(argv)
    import jax
    import numpy as np

    from bench.bench_pretrain import (
        experiment_config,
        random_pretraining_batch,
        select_mesh,
    )
    from bench.common import masked_positions
    from bert_jax.training.config import model_config
    from bert_jax.training.setup import build_training

    config = experiment_config(args)
    if args.layers:
        config.model.num_hidden_layers = args.layers
    training = build_training(config, model_config(config, vocab_size=30522),
                              select_mesh(config, args.devices))
    preds = masked_positions(args.seq_len)
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in random_pretraining_batch(
        np.random.default_rng(0), args.batch_size, args.seq_len, preds, 30522).items()}
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
                            "param_gather": args.param_gather, "per_device": cost,
                            "collectives": records,
                            "batch_activation_gathers": len(gathered)}) + "\n")
    return 1 if gathered else 0


if __name__ == "__main__":
    sys.exit(main())
