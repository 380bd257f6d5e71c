"""Probe: the MLP's bias + erf GELU fused into its GEMMs (a Pallas Triton GEMM with epilogues),
against what the step runs today (cuBLAS through XLA, then ``fused_gelu``'s kernel pair).

The last untried lever of issue 6 with more than a percent in it (``docs/performance.md``,
"Proposed engine changes"): the GELU's forward and backward passes read and write
[tokens, intermediate] arrays that a GEMM epilogue would keep in registers.

* forward today: ``y = x @ W1`` (cuBLAS, bf16 out), then ``gelu(y + b)`` (reads y, writes the
  activation). Fused: one GEMM whose epilogue adds the bias and writes the pre-activation
  (the backward needs it) and the activation: one [tokens, intermediate] pass fewer.
* backward today: ``g = dY @ W2^T`` (cuBLAS), then ``dx = g * gelu'(y + b)`` plus the bias
  gradient's column sums (reads g and y, writes dx). Fused: the GEMM's epilogue reads the
  pre-activation and writes dx and per-program column sums: two passes fewer.

Per layer that is 3 x tokens x intermediate x 2 bytes less traffic (0.6 GB at Base/128, batch
256): ~2 ms of a ~48 ms Base/128 step on an H100 if the Pallas GEMM ran at cuBLAS's speed. The
probe measures whether it does: the plain GEMMs (cuBLAS, the Pallas GEMM over a few tile
settings, and JAX's stock Hopper GEMM, ``hopper_matmul_mgpu``, for what a warpgroup kernel
reaches), then each path's forward and backward, and reports ``fused_saving_ms`` per layer
(today's forward + backward minus the best fused forward + backward; positive: fusing pays).

  python bench/probe_gemm_gelu.py --out probe.jsonl                  # on a GPU
  python bench/probe_gemm_gelu.py --out probe.jsonl --check          # CPU: interpret mode,
                                                                     # small shapes, values only
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_attention import rel_err, timed_record  # noqa: E402
from bench.common import write_result  # noqa: E402

# tokens x hidden x intermediate: Base/128 and Large/128 at batch 256, Large/512 at batch 32.
SHAPES = "32768x768x3072,32768x1024x4096,16384x1024x4096"
# (block_m, block_n, block_k, num_warps, num_stages): Triton's usual Hopper GEMM tiles.
TILES = ((128, 256, 64, 8, 3), (128, 128, 64, 4, 4), (128, 128, 64, 8, 3),
         (256, 128, 64, 8, 3), (128, 256, 32, 8, 4), (64, 256, 64, 4, 4))
CHECK_TILES = ((32, 32, 16, 4, 1),)


def _gemm_kernel(x_ref, w_ref, *refs, block_k: int, trans_w: bool, epilogue: str):
    """One [block_m, block_n] output tile: the float32 product over K in ``block_k`` steps,
    then the epilogue. ``refs``: inputs after x and w, then outputs, by epilogue:

    * ``none``: (out,), ``out = x @ w``;
    * ``bias_gelu``: (b, pre, act), ``pre = bf16(x @ w + b)``, ``act = gelu(pre)``;
    * ``gelu_grad``: (pre, dx, sums), ``dx = (x @ w) * gelu'(pre)``, ``sums`` the float32
      column sums of dx over this tile's rows (one row of partial sums per row block).
    """
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl

    from bert_jax.kernels.flash import _dot
    from bert_jax.kernels.fused_gelu import _INV_SQRT_2PI, _cdf_and_gauss, _gelu

    k = x_ref.shape[1]

    def step(i, acc):
        ks = pl.ds(i * block_k, block_k)
        x = x_ref[:, ks]
        w = w_ref[:, ks] if trans_w else w_ref[ks, :]
        return acc + _dot(x, w, trans_b=trans_w)

    block_m = x_ref.shape[0]
    block_n = w_ref.shape[0] if trans_w else w_ref.shape[1]
    acc = lax.fori_loop(0, k // block_k, step, jnp.zeros((block_m, block_n), jnp.float32))
    if epilogue == "none":
        (out_ref,) = refs
        out_ref[...] = acc.astype(out_ref.dtype)
    elif epilogue == "bias_gelu":
        b_ref, pre_ref, act_ref = refs
        pre = (acc + b_ref[...].astype(jnp.float32)[None, :]).astype(pre_ref.dtype)
        pre_ref[...] = pre
        act_ref[...] = _gelu(pre.astype(jnp.float32)).astype(act_ref.dtype)
    else:
        pre_ref, dx_ref, sums_ref = refs
        x = pre_ref[...].astype(jnp.float32)
        cdf, gauss = _cdf_and_gauss(x)
        dx = acc * (cdf + x * (_INV_SQRT_2PI * gauss))
        dx_ref[...] = dx.astype(dx_ref.dtype)
        sums_ref[...] = jnp.sum(dx, axis=0)[None, :]


def pallas_gemm(x, w, *extra, tile, epilogue: str = "none", trans_w: bool = False,
                interpret: bool = False):
    """``x [M, K] @ w`` (``w`` [K, N], or [N, K] with ``trans_w``) with ``epilogue``'s extra
    inputs (``b`` [N] for bias_gelu, ``pre`` [M, N] for gelu_grad) and outputs."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    block_m, block_n, block_k, warps, stages = tile
    m, k = x.shape
    n = w.shape[0] if trans_w else w.shape[1]
    # Grid (column tiles, row blocks): the column tiles of one row block launch one after
    # another, so the x panel they share stays in L2 (w, a few MB, stays there anyway).
    grid = (n // block_n, m // block_m)
    x_spec = pl.BlockSpec((block_m, k), lambda j, i: (i, 0))
    w_spec = (pl.BlockSpec((block_n, k), lambda j, i: (j, 0)) if trans_w
              else pl.BlockSpec((k, block_n), lambda j, i: (0, j)))
    tile_spec = pl.BlockSpec((block_m, block_n), lambda j, i: (i, j))
    mn = jax.ShapeDtypeStruct((m, n), x.dtype)
    if epilogue == "none":
        extra_specs, out_specs, out_shape = [], tile_spec, mn
    elif epilogue == "bias_gelu":
        extra_specs = [pl.BlockSpec((block_n,), lambda j, i: (j,))]
        out_specs, out_shape = [tile_spec, tile_spec], [mn, mn]
    else:
        extra_specs = [tile_spec]
        out_specs = [tile_spec, pl.BlockSpec((1, block_n), lambda j, i: (i, j))]
        out_shape = [mn, jax.ShapeDtypeStruct((m // block_m, n), jnp.float32)]
    params = {}
    if not interpret:
        from jax.experimental.pallas import triton as plgpu

        params = {"compiler_params": plgpu.CompilerParams(num_warps=warps, num_stages=stages)}
    return pl.pallas_call(
        functools.partial(_gemm_kernel, block_k=block_k, trans_w=trans_w, epilogue=epilogue),
        grid=grid, in_specs=[x_spec, w_spec, *extra_specs], out_specs=out_specs,
        out_shape=out_shape, interpret=interpret, name=f"probe_gemm_{epilogue}", **params,
    )(x, w, *extra)


def today_forward(x, w1, b):
    """The step's forward today: cuBLAS (through XLA) then the fused bias + GELU kernel."""
    import jax.numpy as jnp

    from bert_jax.kernels.fused_gelu import bias_gelu

    y = jnp.dot(x, w1, preferred_element_type=jnp.float32).astype(x.dtype)
    return bias_gelu(y, b)


def today_backward(dy, w2, y, b):
    """The step's backward today: ``g = dy @ w2^T`` then the fused kernel's backward (dx and
    the bias gradient)."""
    import jax
    import jax.numpy as jnp

    from bert_jax.kernels.fused_gelu import bias_gelu

    g = jnp.dot(dy, w2.T, preferred_element_type=jnp.float32).astype(dy.dtype)
    return jax.vjp(bias_gelu, y, b)[1](g)


def fused_forward(x, w1, b, *, tile, interpret=False):
    return pallas_gemm(x, w1, b, tile=tile, epilogue="bias_gelu", interpret=interpret)


def fused_backward(dy, w2, pre, *, tile, interpret=False):
    """dx and the bias gradient from the dgrad GEMM's epilogue (w2 [intermediate, hidden]:
    the product is ``dy @ w2^T``)."""
    import jax.numpy as jnp

    dx, sums = pallas_gemm(dy, w2, pre, tile=tile, epilogue="gelu_grad", trans_w=True,
                           interpret=interpret)
    return dx, jnp.sum(sums, axis=0)


def probe_shape(shape: str, tiles, out_path: str, *, interpret: bool, mgpu: bool) -> None:
    import jax
    import jax.numpy as jnp

    m, h, n = (int(v) for v in shape.split("x"))
    ks = jax.random.split(jax.random.key(0), 5)
    x = jax.random.normal(ks[0], (m, h), jnp.bfloat16)
    w1 = (jax.random.normal(ks[1], (h, n), jnp.float32) * h ** -0.5).astype(jnp.bfloat16)
    b = (jax.random.normal(ks[2], (n,), jnp.float32) * 0.1).astype(jnp.bfloat16)
    w2 = (jax.random.normal(ks[3], (n, h), jnp.float32) * n ** -0.5).astype(jnp.bfloat16)
    dy = jax.random.normal(ks[4], (m, h), jnp.bfloat16)
    base = {"probe": "gemm_gelu", "shape": shape, "device": jax.devices()[0].device_kind}
    flops = 2 * m * h * n

    ref_act = jax.jit(today_forward)(x, w1, b)
    y = jnp.dot(x, w1, preferred_element_type=jnp.float32).astype(x.dtype)
    ref_dx, ref_db = jax.jit(today_backward)(dy, w2, y, b)
    pre = (y.astype(jnp.float32) + b.astype(jnp.float32)).astype(jnp.bfloat16)

    def emit(rec):
        for key in [k for k in rec if k.endswith("_ms") and k.startswith("gemm")]:
            rec[key.replace("_ms", "_tflops")] = flops / (rec[key] * 1e-3) / 1e12
        write_result(out_path, rec)
        return rec

    today = emit(timed_record(
        {**base, "impl": "today"}, (x, w1, b, dy, w2, y),
        gemm=jax.jit(lambda x, w1, b, dy, w2, y: jnp.dot(x, w1)),
        gemm_dgrad=jax.jit(lambda x, w1, b, dy, w2, y: jnp.dot(dy, w2.T)),
        fwd=jax.jit(lambda x, w1, b, dy, w2, y: today_forward(x, w1, b)),
        bwd=jax.jit(lambda x, w1, b, dy, w2, y: today_backward(dy, w2, y, b))))
    best = {}
    for tile in tiles:
        if m % tile[0] or n % tile[1] or h % tile[2]:
            continue
        rec = {**base, "impl": "pallas", "tile": list(tile)}
        try:
            act = fused_forward(x, w1, b, tile=tile, interpret=interpret)[1]
            dx, db = fused_backward(dy, w2, pre, tile=tile, interpret=interpret)
            rec.update(act_rel_err=rel_err(act, ref_act), dx_rel_err=rel_err(dx, ref_dx),
                       db_rel_err=rel_err(db, ref_db))
        except Exception as e:  # noqa: BLE001 (report and go on)
            emit({**rec, "error": f"{type(e).__name__}: {e}"[:600]})
            continue
        if interpret:
            emit(rec)
            continue
        rec = emit(timed_record(
            rec, (x, w1, b, dy, w2, pre),
            gemm=jax.jit(lambda x, w1, b, dy, w2, p, t=tile: pallas_gemm(x, w1, tile=t)),
            gemm_dgrad=jax.jit(lambda x, w1, b, dy, w2, p, t=tile: pallas_gemm(
                dy, w2, tile=t, trans_w=True)),
            fwd=jax.jit(lambda x, w1, b, dy, w2, p, t=tile: fused_forward(x, w1, b, tile=t)),
            bwd=jax.jit(lambda x, w1, b, dy, w2, p, t=tile: fused_backward(dy, w2, p, tile=t))))
        for key in ("fwd_ms", "bwd_ms"):
            if key in rec and rec[key] < best.get(key, (float("inf"),))[0]:
                best[key] = (rec[key], tile)
    if mgpu and not interpret:
        probe_mgpu(base, x, w1, flops, emit)
    if "fwd_ms" in best and "bwd_ms" in best and "fwd_ms" in today:
        emit({**base, "impl": "summary", "today_fwd_bwd_ms": today["fwd_ms"] + today["bwd_ms"],
              "fused_fwd_bwd_ms": best["fwd_ms"][0] + best["bwd_ms"][0],
              "fused_saving_ms": today["fwd_ms"] + today["bwd_ms"]
              - best["fwd_ms"][0] - best["bwd_ms"][0],
              "best_fwd_tile": list(best["fwd_ms"][1]), "best_bwd_tile": list(best["bwd_ms"][1])})


def probe_mgpu(base, x, w1, flops, emit) -> None:
    """JAX's stock Hopper GEMM (warpgroup matmuls, TMA, persistent), plain, a few tilings."""
    import jax

    try:
        from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm
    except Exception as e:  # noqa: BLE001
        emit({**base, "impl": "mgpu", "error": f"{type(e).__name__}: {e}"[:600]})
        return
    for tm, tn, steps, width in ((128, 128, 4, 8), (128, 256, 4, 8), (256, 128, 4, 8),
                                 (128, 128, 4, 16)):
        rec = {**base, "impl": "mgpu", "tile": [tm, tn, 64, steps, width]}
        try:
            cfg = hm.TuningConfig(tile_m=tm, tile_n=tn, tile_k=64, max_concurrent_steps=steps,
                                  grid_tile_width=width)
            fn = jax.jit(lambda x, w, cfg=cfg: hm.matmul(x, w, None, cfg))
            rec["gemm_rel_err"] = rel_err(fn(x, w1), x @ w1)
        except Exception as e:  # noqa: BLE001
            emit({**rec, "error": f"{type(e).__name__}: {e}"[:600]})
            continue
        emit(timed_record(rec, (x, w1), gemm=fn))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--out", required=True)
    ap.add_argument("--check", action="store_true",
                    help="interpret mode on small shapes: values against today's path only")
    ap.add_argument("--no-mgpu", action="store_true")
    args = ap.parse_args(argv)
    shapes = "256x64x128" if args.check else args.shapes
    for shape in shapes.split(","):
        probe_shape(shape, CHECK_TILES if args.check else TILES, args.out,
                    interpret=args.check, mgpu=not args.no_mgpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
