"""Probe: JAX's stock Hopper attention (Pallas Mosaic GPU, warpgroup matmuls,
``jax.experimental.pallas.ops.gpu.attention_mgpu``), forward + backward, at BERT's shapes,
next to cuDNN's fused attention (no dropout) and the flash kernel (with and without dropout).

The stock kernel has neither padding masks nor dropout, so it cannot train BERT as it is; the
probe answers whether a warpgroup-matmul kernel is fast enough at these shapes for a BERT
variant of it (masking + the dropout hash) to be worth building.

  python bench/probe_mgpu_attention.py --out probe.jsonl
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_attention import timed, value_and_grad_of  # noqa: E402
from bench.common import write_result  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="32x512x16x64,256x128x12x64")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    for shape in args.shapes.split(","):
        probe_shape(shape, args.out)
    return 0


def probe_shape(shape: str, out_path: str) -> None:
    """Times every implementation at one shape; one record each, appended to ``out_path``."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu import attention_mgpu as mg

    from bert_jax.kernels import flash
    from bert_jax.modeling.attention import fused_attention

    b, s, h, d = (int(x) for x in shape.split("x"))
    ks = jax.random.split(jax.random.key(0), 5)
    inputs = [jax.random.normal(kk, (b, s, h, d), jnp.bfloat16) for kk in ks[:3]]
    half = [x.astype(jnp.float16) for x in inputs]  # the stock kernel's backward is f16 only
    cot = jax.random.normal(ks[3], inputs[0].shape, jnp.bfloat16)
    full = jnp.full((b,), s, jnp.int32)
    salt = flash.salt_from_rng(ks[4], b, h)

    impls = {
        "cudnn_no_dropout": lambda q, k, v: fused_attention(q, k, v, full, "auto"),
        "flash_no_dropout": lambda q, k, v: flash.flash_attention(q, k, v, full),
        "flash_dropout": lambda q, k, v: flash.flash_attention(
            q, k, v, full, salt=salt, dropout_rate=0.1),
    }
    for bq, bkv, steps, bwd in ((64, 64, 2, 64), (64, 128, 2, 64), (128, 128, 2, 64),
                                (64, 64, 2, 128), (64, 128, 4, 64), (64, 64, 2, 32)):
        if bkv > s or bq * 2 > s:
            continue
        cfg = mg.TuningConfig(block_q=bq, block_kv=bkv, max_concurrent_steps=steps,
                              block_q_dkv=bwd, block_kv_dkv=bwd, block_q_dq=bwd,
                              block_kv_dq=bwd)
        impls[f"mgpu_{bq}_{bkv}_{steps}_{bwd}"] = (
            lambda q, k, v, cfg=cfg: mg.attention(q, k, v, cfg))
    ref = None
    for name, fn in impls.items():
        q, k, v = half if name.startswith("mgpu") else inputs
        base = {"shape": shape, "device": jax.devices()[0].device_kind, "impl": name}
        try:
            g = value_and_grad_of(fn, cot)
            out = g(q, k, v)
            if ref is None:
                ref = out
            err = max(float(jnp.max(jnp.abs(a.astype(jnp.float32) - r.astype(jnp.float32))))
                      for a, r in zip(out[1], ref[1], strict=True))
            fwd = jax.jit(fn)
            rec = {**base, "fwd_bwd_ms": 1e3 * timed(g, q, k, v),
                   "fwd_ms": 1e3 * timed(fwd, q, k, v), "max_abs_grad_diff_vs_first": err}
        except Exception as e:  # noqa: BLE001 (report and go on)
            rec = {**base, "error": f"{type(e).__name__}: {e}"[:600]}
        write_result(out_path, rec)  # (also printed)


if __name__ == "__main__":
    sys.exit(main())
