"""Which projection formulations get XLA's cuBLAS bias epilogue on the GPU (and their time).

For each formulation of ``x @ W + b`` (bfloat16 activations, float32 parameters cast to
bfloat16, as the encoder's q/k/v projection), prints whether the optimized HLO's cuBLAS-Lt
calls carry ``epilogue: BIAS`` or leave the add as a separate fusion, and the forward and
forward+backward times. Writes JSON lines to --out.

    python bench/probe_bias_epilogue.py --out results.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
import time

import jax
import jax.numpy as jnp


def cases(hidden: int, heads: int):
    d = hidden // heads

    def packed(x, w, b):  # one [H, 3H] GEMM, [3H] bias
        y = x @ w.reshape(hidden, 3 * hidden).astype(x.dtype)
        return y + b.reshape(3 * hidden).astype(x.dtype)

    def packed_f32bias(x, w, b):  # bias added in float32, result cast
        y = jnp.dot(x, w.reshape(hidden, 3 * hidden).astype(x.dtype),
                    preferred_element_type=jnp.float32)
        return (y + b.reshape(3 * hidden)).astype(x.dtype)

    def packed_5d(x, w, b):  # packed, then viewed as [tokens, 3, heads, d]
        return packed(x, w, b).reshape(x.shape[0], 3, heads, d)

    def split(x, w, b):  # three GEMMs on slices (the encoder's split projection)
        outs = []
        for i in range(3):
            wi = w[:, i].reshape(hidden, hidden).astype(x.dtype)
            outs.append(x @ wi + b[i].reshape(hidden).astype(x.dtype))
        return outs

    return {"packed": packed, "packed_f32bias": packed_f32bias, "packed_5d": packed_5d,
            "split": split}


def timed(fn, *args, steps=20):
    out = fn(*args)
    jax.block_until_ready(out)
    start = time.perf_counter()
    for _ in range(steps):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / steps * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--out", default=None)
    parser.add_argument("--hlo-dir", default=None, help="write each case's optimized HLO here")
    args = parser.parse_args()
    h = args.hidden
    keys = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(keys[0], (args.tokens, h), jnp.bfloat16)
    w = jax.random.normal(keys[1], (h, 3, args.heads, h // args.heads), jnp.float32) * 0.02
    b = jax.random.normal(keys[2], (3, args.heads, h // args.heads), jnp.float32)
    records = []
    for name, fn in cases(h, args.heads).items():
        def loss(x, w, b, fn=fn):
            return sum(jnp.sum(jnp.square(o.astype(jnp.float32)))
                       for o in jax.tree.leaves(fn(x, w, b)))

        fwd = jax.jit(fn)
        bwd = jax.jit(jax.grad(loss, (0, 1, 2)))
        text = fwd.lower(x, w, b).compile().as_text()
        epilogues = re.findall(r'"epilogue":"([A-Z_]+)"', text)
        adds = len(re.findall(r"= \S+ fusion\(.*op_name=\"[^\"]*/add\"", text))
        if args.hlo_dir:
            import pathlib

            pathlib.Path(args.hlo_dir).mkdir(parents=True, exist_ok=True)
            pathlib.Path(args.hlo_dir, f"{name}.hlo.txt").write_text(text)
        record = {"case": name, "device": jax.devices()[0].device_kind,
                  "epilogues": epilogues, "separate_add_fusions": adds,
                  "forward_ms": round(timed(fwd, x, w, b), 4),
                  "grad_ms": round(timed(bwd, x, w, b), 4)}
        records.append(record)
        print(json.dumps(record), flush=True)
    if args.out:
        with open(args.out, "a") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
