"""Attention alone, forward + backward, on one device: the flash kernel with in-kernel dropout
(``bert_jax/kernels/flash.py``) against the explicit einsum path with dropout and cuDNN's
fused attention without dropout, at BERT's shapes; plus a correctness check of the kernel
against the jax.numpy reference on the device (same mask).

  python bench/bench_attention.py --out attention.jsonl                  # GPU: default shapes
  python bench/bench_attention.py --shapes 2x64x2x16 --tune none --out /tmp/a.jsonl   # CPU

Each shape runs every implementation and each ``--tune`` block setting of the flash kernel;
times are medians of 5 repeats of 10 calls of a jitted grad, per layer.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import median_time, write_result  # noqa: E402

# block_q, block_k, block_q_bwd, block_k_bwd, num_warps, num_stages, backward
TUNINGS = {
    "none": [],
    "small": [(128, 128, 64, 64, 4, 2, "split"), (64, 128, 64, 64, 4, 2, "split"),
              (128, 64, 64, 64, 4, 2, "split"), (128, 128, 128, 128, 8, 2, "split"),
              (64, 64, 32, 64, 4, 2, "split"), (128, 128, 64, 128, 4, 2, "split"),
              (128, 128, 32, 64, 4, 2, "fused"), (128, 128, 64, 64, 8, 2, "fused"),
              (128, 128, 16, 64, 4, 2, "fused"), (64, 128, 32, 64, 4, 3, "fused")],
    # short sequences (the fused backward): pipeline stages and blocks, the default first
    "short": [(64, 128, 16, 64, 4, 2, "fused"), (64, 128, 16, 64, 4, 3, "fused"),
              (64, 64, 16, 64, 4, 3, "fused"), (64, 128, 32, 64, 4, 3, "fused"),
              (128, 128, 16, 64, 4, 3, "fused"), (64, 64, 16, 64, 4, 2, "fused")],
    # the split backward at length 512 (the default first)
    "long": [(64, 128, 64, 64, 4, 2, "split"), (128, 128, 64, 64, 8, 2, "split"),
             (128, 64, 64, 64, 4, 2, "split"), (64, 64, 64, 64, 4, 3, "split"),
             (64, 128, 32, 64, 4, 2, "split"), (64, 128, 64, 128, 4, 2, "split"),
             (64, 128, 128, 64, 4, 2, "split"), (64, 128, 128, 128, 8, 2, "split"),
             (64, 128, 32, 128, 4, 2, "split"), (64, 128, 64, 64, 4, 3, "split"),
             (128, 128, 128, 128, 8, 3, "split"), (64, 128, 64, 64, 8, 2, "split")],
}
# forward kernel alone (block_q, block_k, num_warps, num_stages), the current default first
FORWARD_TUNINGS = [(64, 64, 4, 3), (128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3),
                   (128, 64, 4, 2), (128, 64, 4, 4), (64, 128, 4, 3), (128, 32, 4, 3),
                   (64, 32, 4, 3), (128, 128, 4, 3), (128, 64, 8, 2), (64, 64, 4, 2),
                   (128, 128, 8, 2), (32, 64, 4, 3)]

# the split backward (length 512): the dK/dV kernel (block_q_bwd step, block_k_bwd tile, warps,
# stages) with the dQ kernel at its default, then the dQ kernel (block_q tile, block_k step,
# warps, stages) with the dK/dV kernel at its default; the defaults first
DKDV_TUNINGS = [(64, 64, 4, 3), (32, 64, 4, 3), (128, 64, 4, 3), (64, 128, 4, 3),
                (64, 128, 8, 3), (32, 128, 4, 3), (64, 32, 4, 3), (128, 128, 8, 3),
                (64, 64, 4, 2), (64, 64, 4, 4), (32, 64, 4, 4), (128, 64, 8, 3),
                (16, 64, 4, 3), (32, 32, 4, 3)]
DQ_TUNINGS = [(64, 64, 4, 3), (64, 32, 4, 3), (128, 64, 4, 3), (128, 64, 8, 3),
              (64, 128, 4, 3), (128, 32, 4, 3), (32, 64, 4, 3), (128, 128, 8, 3),
              (64, 64, 4, 2), (64, 64, 4, 4), (128, 64, 4, 2), (32, 32, 4, 3),
              (64, 16, 4, 3), (128, 32, 8, 3)]


def timed(fn, *args, repeats=5, inner=10):
    """Seconds per call: median over ``repeats`` of ``inner`` calls ended by one sync."""
    import jax

    jax.block_until_ready(fn(*args))

    def run():
        for _ in range(inner):
            out = fn(*args)
        jax.block_until_ready(out)

    return median_time(run, repeats)[0] / inner


def timed_record(record: dict, inputs, **fns) -> dict:
    """``record`` plus ``{name}_ms`` for each jitted ``fns[name]`` timed on ``inputs``, or
    plus the error that stopped one (reported in the record; the sweep goes on)."""
    try:
        return {**record, **{f"{name}_ms": 1e3 * timed(fn, *inputs) for name, fn in fns.items()}}
    except Exception as e:  # noqa: BLE001 (report and go on)
        return {**record, "error": f"{type(e).__name__}: {e}"[:600]}


def rel_err(a, r) -> float:
    """max |a - r| / max |r| in float32."""
    import numpy as np

    a, r = np.asarray(a, np.float32), np.asarray(r, np.float32)
    return float(np.max(np.abs(a - r)) / (np.max(np.abs(r)) + 1e-6))


def value_and_grad_of(attn, cot):
    """Jitted (loss, (dq, dk, dv)) of ``sum(attn(q, k, v) * cot)`` in float32: one forward and
    one backward of the attention ``attn``."""
    import jax
    import jax.numpy as jnp

    def loss(q, k, v):
        return jnp.sum(attn(q, k, v).astype(jnp.float32) * cot.astype(jnp.float32))
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def run_shape(shape: str, args) -> None:
    """Correctness check, the implementations and the kernel tunings at one shape; each
    record is appended to ``args.out`` as soon as it is measured."""
    import jax
    import jax.numpy as jnp

    from bert_jax.kernels import flash
    from bert_jax.modeling.attention import explicit_attention, fused_attention

    on_gpu = jax.default_backend() == "gpu"
    dtype = jnp.bfloat16 if on_gpu else jnp.float32
    b, s, h, d = (int(x) for x in shape.split("x"))
    ks = jax.random.split(jax.random.key(0), 5)
    q, k, v = (jax.random.normal(kk, (b, s, h, d), dtype) for kk in ks[:3])
    lengths = jnp.full((b,), s, jnp.int32).at[0].set(s // 2 + 3)
    cot = jax.random.normal(ks[3], q.shape, dtype)
    salt = flash.salt_from_rng(ks[4], b, h)

    grad_of = functools.partial(value_and_grad_of, cot=cot)

    # correctness on the device: the kernel vs the reference with the same mask
    ref = grad_of(lambda q, k, v: flash.reference_attention(
        q, k, v, lengths, salt=salt, dropout_rate=args.rate))(q, k, v)
    mine = grad_of(lambda q, k, v: flash.flash_attention(
        q, k, v, lengths, salt=salt, dropout_rate=args.rate))(q, k, v)
    errors = [rel_err(a, r) for a, r in zip(mine[1], ref[1], strict=True)]
    base = {"shape": shape, "device": jax.devices()[0].device_kind, "rate": args.rate}
    write_result(args.out, {**base, "check": "flash_vs_reference_grad_rel_err",
                            "dq_dk_dv": errors})

    impls = {
        "explicit_dropout": lambda q, k, v: explicit_attention(
            q, k, v, lengths, dropout_rng=ks[4], dropout_rate=args.rate,
            deterministic=False)[0],
        "flash_dropout": lambda q, k, v: flash.flash_attention(
            q, k, v, lengths, salt=salt, dropout_rate=args.rate),
        "flash_dropout_flat_hash": lambda q, k, v: flash.flash_attention(
            q, k, v, lengths, salt=salt, dropout_rate=args.rate, mask_hash="flat"),
        "flash_no_dropout": lambda q, k, v: flash.flash_attention(q, k, v, lengths),
        "fused_no_dropout": lambda q, k, v: fused_attention(q, k, v, lengths, "auto"),
    }
    for name, fn in impls.items():
        if args.impls != "all" and name not in args.impls.split(","):
            continue
        write_result(args.out, timed_record({**base, "impl": name}, (q, k, v),
                                            fwd_bwd=grad_of(fn)))
    if args.tune == "fwd":
        forward_sweep(q, k, v, lengths, salt, base, args)
    if args.tune == "bwd":
        backward_sweep(grad_of, q, k, v, lengths, salt, base, args)
    for tune in TUNINGS.get(args.tune, []):
        if tune[-1] == "fused" and s > 256:
            continue

        def fn(q, k, v, tune=tune):
            bq, bk, bqb, bkb, warps, stages, backward = tune
            return flash.flash_attention(q, k, v, lengths, salt=salt, dropout_rate=args.rate,
                                         block_q=bq, block_k=bk, block_q_bwd=bqb,
                                         block_k_bwd=bkb, num_warps=warps,
                                         num_stages=stages, backward=backward)
        write_result(args.out, timed_record(
            {**base, "impl": "flash_dropout", "tune": list(tune)}, (q, k, v),
            fwd_bwd=grad_of(fn), fwd=jax.jit(fn)))


def forward_sweep(q, k, v, lengths, salt, base, args) -> None:
    """The forward kernel alone (with dropout, packed off) at each of FORWARD_TUNINGS."""
    import dataclasses

    import jax

    from bert_jax.kernels import flash

    b, s, h, d = q.shape
    settings, bias, salt = flash._prepare(
        b, s, s, h, d, lengths, salt, args.rate, blocks=(None, None, None, 64), num_warps=4,
        num_stages=3, backward="auto", interpret=None, mask_hash="rowcol", bias_grads=False,
        packed=False)
    for bq, bk, warps, stages in FORWARD_TUNINGS:
        tuned = dataclasses.replace(settings, block_q=flash.fit_block(bq, s),
                                    block_k=flash.fit_block(bk, s), num_warps=warps,
                                    num_stages=stages)
        fwd = jax.jit(lambda q, k, v, tuned=tuned: flash._forward((q, k, v), bias, salt,
                                                                  tuned))
        write_result(args.out, timed_record(
            {**base, "impl": "flash_dropout_forward", "tune_fwd": [bq, bk, warps, stages]},
            (q, k, v), fwd=fwd))


def backward_sweep(grad_of, q, k, v, lengths, salt, base, args) -> None:
    """The split backward's two kernels, one at a time (DKDV_TUNINGS, DQ_TUNINGS); warps and
    stages of the dK/dV kernel apply to the forward too, so ``fwd_ms`` is recorded with each."""
    import jax

    from bert_jax.kernels import flash

    runs = [("dkdv", t, None) for t in DKDV_TUNINGS] + [("dq", None, t) for t in DQ_TUNINGS]
    for kernel, dkdv, dq in runs:
        bqb, bkb, warps, stages = dkdv or (64, 64, 4, 3)

        def fn(q, k, v, bqb=bqb, bkb=bkb, warps=warps, stages=stages, dq=dq):
            return flash.flash_attention(q, k, v, lengths, salt=salt, dropout_rate=args.rate,
                                         block_q_bwd=bqb, block_k_bwd=bkb, num_warps=warps,
                                         num_stages=stages, backward="split", dq_kernel=dq)
        write_result(args.out, timed_record(
            {**base, "impl": "flash_dropout_split", "kernel": kernel,
             "tune_bwd": list(dkdv or dq)}, (q, k, v), fwd_bwd=grad_of(fn), fwd=jax.jit(fn)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="256x128x12x64,32x512x16x64,256x128x16x64",
                    help="comma list of batch x seq x heads x head_dim")
    ap.add_argument("--rate", type=float, default=0.1)
    ap.add_argument("--tune", default="small", choices=sorted([*TUNINGS, "fwd", "bwd"]),
                    help="block settings to sweep (fwd: the forward kernel alone; bwd: the "
                    "split backward's kernels one at a time)")
    ap.add_argument("--impls", default="all",
                    help="comma list of the implementations to time (all: every one)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    for shape in args.shapes.split(","):
        run_shape(shape, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
