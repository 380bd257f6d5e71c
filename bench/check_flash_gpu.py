"""The flash kernel on the accelerator: packed vs separate query/key/value, and both against
the jax.numpy reference (the CPU tests run the kernels in interpret mode; this runs the
compiled Triton kernels).

For BERT-Base/128 and BERT-Large/512 shapes (bfloat16, dropout 0.1, projection biases, padded
keys), prints and appends to --out one JSON line per shape: the largest absolute difference
of the context and of each gradient between flash_attention_packed and flash_attention
(the same kernels on the same values: expected 0), and between the kernel and the float32
reference with the same mask (bfloat16 rounding).

    python bench/check_flash_gpu.py --out checks.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bert_jax.kernels import flash  # noqa: E402

SHAPES = {"base-128": (8, 128, 12, 64), "large-512": (2, 512, 16, 64),
          "tiny": (2, 32, 2, 16)}  # tiny: CPU smoke runs (interpret mode)


def check(name: str, batch: int, seq: int, heads: int, dim: int) -> dict:
    keys = jax.random.split(jax.random.key(0), 4)
    qkv = jax.random.normal(keys[0], (batch, seq, 3, heads, dim), jnp.bfloat16)
    bias = (jax.random.normal(keys[1], (3, heads, dim), jnp.float32) * 0.1).astype(jnp.bfloat16)
    cot = jax.random.normal(keys[2], (batch, seq, heads, dim), jnp.float32)
    lengths = jnp.array([seq, seq // 2 + 3] * batch)[:batch]
    salt = flash.salt_from_rng(keys[3], batch, heads)

    def packed(qkv, b):
        out = flash.flash_attention_packed(qkv, lengths, salt=salt, dropout_rate=0.1, qkv_bias=b)
        return jnp.sum(out.astype(jnp.float32) * cot), out

    def separate(qkv, b):
        out = flash.flash_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], lengths,
                                    salt=salt, dropout_rate=0.1, qkv_bias=tuple(b))
        return jnp.sum(out.astype(jnp.float32) * cot), out

    def reference(qkv, b):
        x = (qkv.astype(jnp.float32) + b.astype(jnp.float32)[None, None])
        out = flash.reference_attention(x[:, :, 0], x[:, :, 1], x[:, :, 2], lengths,
                                        salt=salt, dropout_rate=0.1)
        return jnp.sum(out * cot), out

    results = {}
    for label, fn in (("packed", packed), ("separate", separate), ("reference", reference)):
        grad = jax.jit(jax.value_and_grad(fn, (0, 1), has_aux=True))
        (_, out), (dqkv, db) = grad(qkv, bias)
        results[label] = (out.astype(jnp.float32), dqkv.astype(jnp.float32),
                          db.astype(jnp.float32))

    def diff(a, b):
        return {part: float(jnp.max(jnp.abs(x - y)))
                for part, x, y in zip(("context", "dqkv", "dbias"), a, b, strict=True)}

    scale = {part: float(jnp.max(jnp.abs(x))) for part, x in
             zip(("context", "dqkv", "dbias"), results["reference"], strict=True)}
    return {"shape": name, "device": jax.devices()[0].device_kind,
            "packed_vs_separate": diff(results["packed"], results["separate"]),
            "kernel_vs_reference": diff(results["packed"], results["reference"]),
            "reference_max_abs": scale}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="base-128,large-512")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    for name in args.shapes.split(","):
        record = check(name, *SHAPES[name])
        print(json.dumps(record), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
