"""The Pallas kernels of bert-jax alone, forward and backward, against what XLA compiles
without them, on one device. One harness, four kernels (``--kernel``):

* ``attention``: the flash kernel with in-kernel dropout (``bert_jax/kernels/flash.py``)
  against the explicit einsum path with dropout and cuDNN's fused attention without dropout,
  plus a correctness check of the kernel against the jax.numpy reference (same mask), and
  optional block sweeps (``--tune``). Shapes: BATCHxSEQxHEADSxHEAD_DIM.
* ``norm``: ``LayerNorm(residual + dropout(y + b))`` as XLA compiles it against the fused
  kernel (``fused_norm``) at every (block_rows, num_warps) of a sweep. Shapes:
  BATCHxSEQxHIDDEN.
* ``gelu``: the MLP epilogue ``gelu_erf(y + b)`` against ``fused_gelu``'s kernel pair at every
  tile of a sweep. Shapes: BATCHxSEQxWIDTH.
* ``xent``: the MLM decoder's softmax cross-entropy, XLA's passes over the float32 logits
  against ``fused_xent``'s kernels (the same matmuls). Shapes: BATCHxPREDICTIONSxEMBED.

  python -m bench kernels --kernel attention --out bench_out              # GPU: default shapes
  python -m bench kernels --kernel attention --shapes 2x64x2x16 --tune none   # CPU (interpret)
  python -m bench kernels --kernel norm --shapes 256x128x768,32x512x1024

One JSON line per (shape, variant[, pass]) in OUT/kernels.jsonl: microseconds (or ms) per
call, the bytes the kernel must move at least over that time where it is memory-bound, and
the largest difference from XLA's result.
"""

from __future__ import annotations

import argparse
import functools
import itertools

from bench.common import (
    add_out_argument,
    environment,
    first_call,
    median_time,
    microseconds_per_call,
    parse_tile,
    results_file,
    tile_name,
    timed_against_reference,
    write_result,
)

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
# forward kernel alone (block_q, block_k, num_warps, num_stages), the length-512 default first
FORWARD_TUNINGS = [(128, 64, 4, 3), (64, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3),
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
DQ_TUNINGS = [(128, 64, 4, 3), (64, 32, 4, 3), (64, 64, 4, 3), (128, 64, 8, 3),
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
                                                                  None, tuned))
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


def run_norm(spec: str, args) -> list[dict]:
    """The fused LayerNorm kernel against XLA's two-stage LayerNorm at one shape."""
    import jax
    import jax.numpy as jnp

    from bert_jax.kernels import fused_norm
    from bert_jax.kernels.dropout import hash_dropout, salt_from_rng
    from bert_jax.modeling.ops import add_bias, layer_norm_two_stage

    interpret = jax.default_backend() != "gpu"
    records = []
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
        print(f"{spec:>14} {name:>16} {us:9.1f} us  {record['gb_per_s']:7.0f} GB/s", flush=True)
        write_result(args.out, record)
        records.append(record)
    return records


def run_gelu(spec: str, args) -> list[dict]:
    """``fused_gelu.bias_gelu`` against XLA's ``add_bias_activate`` at one shape."""
    import jax
    import jax.numpy as jnp

    from bert_jax.kernels import fused_gelu
    from bert_jax.modeling.ops import add_bias_activate

    interpret = jax.default_backend() != "gpu"
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
    sum_blocks = [int(v) for v in args.sum_blocks.split(",")]
    for block in args.blocks.split(","):
        tile = parse_tile(block)
        rows, cols, warps, stages = tile
        for sums in sum_blocks:
            def fused(y, b, rows=rows, cols=cols, warps=warps, sums=sums, stages=stages):
                return fused_gelu.bias_gelu(y, b, block_rows=rows, block_cols=cols,
                                            num_warps=warps, sum_blocks=sums or None,
                                            # a tile without STAGES: no pipelining
                                            num_stages=None if rows is None else stages or 1,
                                            interpret=interpret)
            name = tile_name(tile)
            if sums == sum_blocks[0]:
                runs.append((name, "fwd", fused))  # the forward has no sum_blocks
            runs.append((f"{name}_k{sums or 'auto'}", "bwd", fused))
    want, records = {}, []
    for name, direction, fn in runs:
        if direction == "fwd":
            jitted, inputs, moved = jax.jit(fn), (y, b), 2 * elems * 2
        else:
            jitted = jax.jit(lambda y, b, g, fn=fn: jax.vjp(fn, y, b)[1](g))
            inputs, moved = (y, b, g), 3 * elems * 2
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


def run_xent(spec: str, args) -> list[dict]:
    """``fused_xent.decode_cross_entropy`` against ``fused_xent.reference`` at one shape."""
    import jax
    import jax.numpy as jnp

    from bert_jax.kernels import fused_xent
    from bert_jax.modeling import heads

    interpret = jax.default_backend() != "gpu"
    batch, predictions, embed = (int(v) for v in spec.split("x"))
    k = jax.random.split(jax.random.key(0), 5)
    lead = (batch, predictions)
    h = jax.random.normal(k[0], (*lead, embed), jnp.bfloat16)
    table = (0.05 * jax.random.normal(k[1], (args.vocab, embed))).astype(jnp.bfloat16)
    bias = heads.masked_bias(0.1 * jax.random.normal(k[2], (args.vocab,)), args.vocab - 70)
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
                    h, table, bias, ids, block_rows=rows, block_cols=cols, num_warps=warps,
                    sum_blocks=sums or None, num_stages=stages or None, interpret=interpret)
            runs.append((f"{tile_name(tile)}_k{sums or 'auto'}", fused))
    want, records = {}, []
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


def run_attention(spec: str, args) -> list[dict]:
    run_shape(spec, args)
    return []


# kernel -> (runner, default shapes, tile-sweep default of --blocks, of --sum-blocks)
KERNELS = {
    "attention": (run_attention, "256x128x12x64,32x512x16x64,256x128x16x64", None, None),
    "norm": (run_norm, "256x128x768,32x128x768,32x512x1024,256x128x1024", None, None),
    "gelu": (run_gelu, "256x128x3072,32x512x4096",
             "default,2:512:2,4:512:2,2:1024:4,4:1024:4:2,8:512:4:2,8:1024:8:2", "0,4,8"),
    "xent": (run_xent, "256x20x768,32x80x1024",
             "default,8:128:4,32:128:4,16:128:8,64:128:8,16:64:2", "0,4"),
}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench kernels",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernel", required=True, choices=sorted(KERNELS))
    ap.add_argument("--shapes", default="",
                    help="comma list of shapes (see above); default: BERT-Base/128 and "
                         "BERT-Large/512 shapes of the kernel")
    ap.add_argument("--rate", type=float, default=0.1, help="dropout rate (attention, norm)")
    ap.add_argument("--iters", type=int, default=20, help="calls per timed run")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs (the median counts)")
    add_out_argument(ap)
    att = ap.add_argument_group("attention")
    att.add_argument("--tune", default="small", choices=sorted([*TUNINGS, "fwd", "bwd"]),
                     help="block settings to sweep (fwd: the forward kernel alone; bwd: the "
                     "split backward's kernels one at a time)")
    att.add_argument("--impls", default="all",
                     help="comma list of the implementations to time (all: every one)")
    norm = ap.add_argument_group("norm")
    norm.add_argument("--block-rows", default="4,8,16,32")
    norm.add_argument("--num-warps", default="2,4,8")
    norm.add_argument("--hold", default="16:4,8:4,8:8",
                      help="ROWS:WARPS settings also run with the backward holding rows in "
                           "registers (recompute=False)")
    norm.add_argument("--summed", default="16:8:2,16:8:4,16:8:8,8:4:4,4:2:4,4:2:4:hold",
                      help="ROWS:WARPS:K[:hold] settings also run with K row blocks per "
                           "backward program (fewer parameter-gradient partials)")
    tiles = ap.add_argument_group("gelu and xent")
    tiles.add_argument("--blocks", default="",
                       help="comma list of ROWS:COLS:WARPS[:STAGES] kernel tiles, or "
                            "'default' (the kernel's blocks_for); default: a sweep")
    tiles.add_argument("--sum-blocks", default="",
                       help="row blocks per backward program (0: the kernel's blocks_for)")
    tiles.add_argument("--vocab", type=int, default=30592, help="padded vocabulary (xent)")
    args = ap.parse_args(argv)
    _, shapes, blocks, sums = KERNELS[args.kernel]
    args.shapes = args.shapes or shapes
    args.blocks = args.blocks or blocks or ""
    args.sum_blocks = args.sum_blocks or sums or ""
    args.out = results_file(args.out, "kernels")
    return args


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    runner = KERNELS[args.kernel][0]
    records = []
    for spec in args.shapes.split(","):
        records += runner(spec, args)
    return records
