"""The MLM decoder and its softmax cross-entropy alone: ``fused_xent.reference`` (the decoder
matmul, then XLA's passes over the float32 logits, as the pretraining loss computes them
without the kernels) against ``fused_xent.decode_cross_entropy`` (the same matmuls, the passes
over the logits as Pallas kernels) at every tile (block_rows, block_cols, num_warps) and
backward ``sum_blocks`` of a sweep. One JSON line per (shape, variant, pass): microseconds per
call of the forward (``fwd``: loss values) or of the loss with its three gradients (``grad``),
and the largest difference from XLA's result. Both variants run the same matmuls, so the
difference in time is the passes'.

  python bench/bench_xent.py --out xent.jsonl [--shapes 256x20x768,32x80x1024]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_pretrain import environment  # noqa: E402
from bench.common import (  # noqa: E402
    add_kernel_timing_arguments,
    parse_tile,
    tile_name,
    timed_against_reference,
)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="256x20x768,32x80x1024",
                    help="comma list of BATCHxPREDICTIONSxEMBED (Base/128 at batch 256, "
                         "Large/512 at batch 32: 20 and 80 predictions per sequence)")
    ap.add_argument("--vocab", type=int, default=30592, help="padded vocabulary")
    ap.add_argument("--blocks", default="default,8:128:4,32:128:4,16:128:8,64:128:8,16:64:2",
                    help="comma list of ROWS:COLS:WARPS[:STAGES] kernel tiles (STAGES: the "
                         "backward loop's software pipelining, default "
                         "fused_xent.BACKWARD_STAGES), or 'default' (fused_xent.blocks_for's)")
    ap.add_argument("--sum-blocks", default="0,4",
                    help="row blocks per backward program (0: fused_xent.blocks_for's)")
    add_kernel_timing_arguments(ap, "xent.jsonl")
    return ap.parse_args(argv)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    import jax
    import jax.numpy as jnp

    from bert_jax.kernels import fused_xent
    from bert_jax.modeling import heads

    interpret = jax.default_backend() != "gpu"
    records = []
    for spec in args.shapes.split(","):
        batch, predictions, embed = (int(v) for v in spec.split("x"))
        k = jax.random.split(jax.random.key(0), 5)
        lead = (batch, predictions)
        h = jax.random.normal(k[0], (*lead, embed), jnp.bfloat16)
        table = (0.05 * jax.random.normal(k[1], (args.vocab, embed))).astype(jnp.bfloat16)
        bias = heads.masked_bias(0.1 * jax.random.normal(k[2], (args.vocab,)),
                                 args.vocab - 70)
        ids = jax.random.randint(k[3], lead, 0, args.vocab - 70)
        weights = jax.random.uniform(k[4], lead)
        inputs = (h, table, bias, ids, weights)

        runs = [("xla", fused_xent.reference)]
        for block in args.blocks.split(","):
            tile = parse_tile(block)
            rows, cols, warps, stages = tile
            for sums in (int(v) for v in args.sum_blocks.split(",")):
                def fused(h, table, bias, ids, rows=rows, cols=cols, warps=warps, sums=sums,
                          stages=stages):
                    return fused_xent.decode_cross_entropy(
                        h, table, bias, ids, block_rows=rows, block_cols=cols,
                        num_warps=warps, sum_blocks=sums or None, num_stages=stages or None,
                        interpret=interpret)

                runs.append((f"{tile_name(tile)}_k{sums or 'auto'}", fused))

        want = {}
        for name, fn in runs:
            for direction in ("fwd", "grad"):
                if direction == "fwd":
                    jitted = jax.jit(lambda h, t, b, i, w, fn=fn: fn(h, t, b, i)[0])
                else:
                    def loss(h, t, b, i, w, fn=fn):
                        return jnp.sum(fn(h, t, b, i)[0] * w)

                    jitted = jax.jit(jax.value_and_grad(loss, (0, 1, 2)))
                record = timed_against_reference(
                    jitted, inputs, args, {**environment(), "task": "mlm_xent", "shape": spec,
                                           "vocab": args.vocab, "variant": name,
                                           "pass": direction}, want, direction, name == "xla")
                records.append(record)
                if "us" in record:
                    print(f"{spec:>14} {name:>26} {direction:>4} {record['us']:8.1f} us  "
                          f"diff {record['max_diff_vs_xla']:.3g}", flush=True)
    return records


if __name__ == "__main__":
    main()
