"""The end of a BERT sublayer alone: ``LayerNorm(residual + dropout(y + b))``, forward and
backward, as XLA compiles it (``layer_norm_impl=two_stage``: add_bias + hash_dropout +
TwoStageLayerNorm) against the fused Pallas kernel (``bert_jax/kernels/fused_norm.py``) at
every (block_rows, num_warps) of a sweep. One JSON line per (shape, variant): microseconds per
forward + backward, and the bytes the fused kernels must move at least (residual, y, the
output and the output gradient read or written once each way) over that time.

  python bench/bench_norm.py --out norm.jsonl [--shapes 256x128x768,32x512x1024]
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_pretrain import environment  # noqa: E402
from bench.common import (  # noqa: E402
    add_kernel_timing_arguments,
    first_call,
    microseconds_per_call,
    write_result,
)  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="256x128x768,32x128x768,32x512x1024,256x128x1024",
                    help="comma list of BATCHxSEQxHIDDEN")
    ap.add_argument("--block-rows", default="4,8,16,32")
    ap.add_argument("--num-warps", default="2,4,8")
    ap.add_argument("--hold", default="16:4,8:4,8:8",
                    help="ROWS:WARPS settings also run with the backward holding rows in "
                         "registers (recompute=False)")
    ap.add_argument("--summed", default="16:8:2,16:8:4,16:8:8,8:4:4,4:2:4,4:2:4:hold",
                    help="ROWS:WARPS:K[:hold] settings also run with K row blocks per backward "
                         "program (fused_norm sum_blocks: fewer parameter-gradient partials)")
    ap.add_argument("--rate", type=float, default=0.1)
    add_kernel_timing_arguments(ap, "norm.jsonl")
    return ap.parse_args(argv)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    import jax
    import jax.numpy as jnp

    from bert_jax.kernels import fused_norm
    from bert_jax.kernels.dropout import hash_dropout, salt_from_rng
    from bert_jax.modeling.ops import add_bias, layer_norm_two_stage

    interpret = jax.default_backend() != "gpu"
    records = []
    for spec in args.shapes.split(","):
        batch, seq, hidden = (int(v) for v in spec.split("x"))
        k = jax.random.split(jax.random.key(0), 7)
        shape = (batch, seq, hidden)
        r = jax.random.normal(k[0], shape, jnp.bfloat16)
        y = jax.random.normal(k[1], shape, jnp.bfloat16)
        g = jax.random.normal(k[2], shape, jnp.bfloat16)
        b, gamma, beta = (jax.random.normal(k[i], (hidden,)) for i in (3, 4, 5))
        salt = salt_from_rng(k[6])

        def xla(r, y, b, gamma, beta, salt=salt):
            h = hash_dropout(add_bias(y, b.astype(jnp.bfloat16)), salt, args.rate, "rowcol")
            return layer_norm_two_stage(r + h, gamma, beta, 1e-12, jnp.dtype(jnp.bfloat16))

        variants = [("xla", xla)]
        settings = [(rows, warps, True, 1) for rows, warps in itertools.product(
            (int(v) for v in args.block_rows.split(",")),
            (int(v) for v in args.num_warps.split(",")))]
        settings += [(int(v.split(":")[0]), int(v.split(":")[1]), False, 1)
                     for v in args.hold.split(",") if v]
        settings += [(*(int(p) for p in v.split(":")[:2]), v.split(":")[3:] != ["hold"],
                      int(v.split(":")[2])) for v in args.summed.split(",") if v]
        for rows, warps, recompute, sums in settings:
            name = (f"fused_r{rows}_w{warps}" + ("" if recompute else "_hold")
                    + (f"_k{sums}" if sums > 1 else ""))
            variants.append((name, lambda r, y, b, gamma, beta, rows=rows, warps=warps,
                             recompute=recompute, sums=sums, salt=salt:
                             fused_norm.residual_dropout_layer_norm(
                                 r, y, b.astype(jnp.bfloat16), gamma, beta, salt=salt,
                                 rate=args.rate, block_rows=rows, num_warps=warps,
                                 recompute=recompute, sum_blocks=sums, interpret=interpret)))
        for name, fn in variants:
            def step(r, y, b, gamma, beta, fn=fn, cotangent=g):
                out, pullback = jax.vjp(fn, r, y, b, gamma, beta)
                return out, pullback(cotangent)

            jitted = jax.jit(step)
            _, failed = first_call(jitted, (r, y, b, gamma, beta), args.out,
                                   {"task": "norm", "shape": spec, "variant": name})
            if failed:
                records.append(failed)
                continue
            us = microseconds_per_call(jitted, (r, y, b, gamma, beta), args.iters, args.repeats)
            # at least: read r, y, write out (fwd); read g, r, y, write dr, dy (bwd); bf16
            moved = 8 * batch * seq * hidden * 2
            record = {**environment(), "task": "norm", "shape": spec, "variant": name,
                      "rate": args.rate, "us_fwd_bwd": us, "min_bytes": moved,
                      "gb_per_s": moved / (us * 1e-6) / 1e9}
            print(f"{spec:>14} {name:>16} {us:9.1f} us  {record['gb_per_s']:7.0f} GB/s",
                  flush=True)
            write_result(args.out, record)
            records.append(record)
    return records


if __name__ == "__main__":
    main()
