"""The MLP's epilogue alone: ``gelu_erf(y + b)``, forward and backward, as XLA compiles it
(``ops.add_bias_activate``) against the Pallas kernel pair (``bert_jax/kernels/fused_gelu.py``)
at every tile (block_rows, block_cols, num_warps) and backward ``sum_blocks`` of a sweep. One
JSON line per (shape, variant, pass): microseconds per call and the bytes the pass must move
at least (bf16: forward reads y and writes the output; backward reads g and y and writes dx)
over that time, plus the largest difference from XLA's result.

  python bench/bench_gelu.py --out gelu.jsonl [--shapes 256x128x3072,32x512x4096]
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
    ap.add_argument("--shapes", default="256x128x3072,32x512x4096",
                    help="comma list of BATCHxSEQxWIDTH")
    ap.add_argument("--blocks",
                    default="default,2:512:2,4:512:2,2:1024:4,4:1024:4:2,8:512:4:2,8:1024:8:2",
                    help="comma list of ROWS:COLS:WARPS[:STAGES] kernel tiles (STAGES: "
                         "the backward loop's software pipelining), or 'default' "
                         "(fused_gelu.blocks_for's)")
    ap.add_argument("--sum-blocks", default="0,4,8",
                    help="row blocks per backward program (0: fused_gelu.blocks_for's)")
    add_kernel_timing_arguments(ap, "gelu.jsonl")
    return ap.parse_args(argv)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    import jax
    import jax.numpy as jnp

    from bert_jax.kernels import fused_gelu
    from bert_jax.modeling.ops import add_bias_activate

    interpret = jax.default_backend() != "gpu"
    records = []
    for spec in args.shapes.split(","):
        batch, seq, width = (int(v) for v in spec.split("x"))
        k = jax.random.split(jax.random.key(0), 3)
        shape = (batch, seq, width)
        y = jax.random.normal(k[0], shape, jnp.bfloat16)
        g = jax.random.normal(k[1], shape, jnp.bfloat16)
        b = jax.random.normal(k[2], (width,), jnp.bfloat16)
        elems = batch * seq * width

        def xla(y, b):
            return add_bias_activate(y, b, "gelu")

        runs = [("xla", "fwd", xla), ("xla", "bwd", xla)]
        for block in args.blocks.split(","):
            tile = parse_tile(block)
            rows, cols, warps, stages = tile
            for sums in (int(v) for v in args.sum_blocks.split(",")):
                def fused(y, b, rows=rows, cols=cols, warps=warps, sums=sums, stages=stages):
                    return fused_gelu.bias_gelu(y, b, block_rows=rows, block_cols=cols,
                                                num_warps=warps, sum_blocks=sums or None,
                                                # a tile without STAGES: no pipelining
                                                num_stages=None if rows is None else stages or 1,
                                                interpret=interpret)

                name = tile_name(tile)
                if sums == int(args.sum_blocks.split(",")[0]):
                    runs.append((name, "fwd", fused))  # the forward has no sum_blocks
                runs.append((f"{name}_k{sums or 'auto'}", "bwd", fused))

        want = {}
        for name, direction, fn in runs:
            if direction == "fwd":
                jitted = jax.jit(fn)
                inputs = (y, b)
                moved = 2 * elems * 2
            else:
                jitted = jax.jit(lambda y, b, g, fn=fn: jax.vjp(fn, y, b)[1](g))
                inputs = (y, b, g)
                moved = 3 * elems * 2
            record = timed_against_reference(
                jitted, inputs, args, {**environment(), "task": "gelu", "shape": spec,
                                       "variant": name, "pass": direction}, want, direction,
                name == "xla", lambda us, moved=moved: {
                    "min_bytes": moved, "gb_per_s": moved / (us * 1e-6) / 1e9})
            records.append(record)
            if "us" in record:
                print(f"{spec:>14} {name:>20} {direction} {record['us']:8.1f} us  "
                      f"{record['gb_per_s']:6.0f} GB/s  diff {record['max_diff_vs_xla']:.3g}",
                      flush=True)
    return records


if __name__ == "__main__":
    main()
