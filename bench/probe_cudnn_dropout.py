"""Probe: cuDNN's fused attention with its own dropout, its speed next to the flash kernel,
and what its masks are.

JAX's cuDNN API takes the dropout seed as a compile-time integer and XLA advances each
compiled call's Philox offset by a fixed step per execution, so the masks cannot be drawn
from a JAX key. This probe measures, on the device, what that means (thirteenth session,
docs/performance.md; the same function ran in the model as ``dropout_attention_impl='cudnn'``
at commit c7cc0ff and was removed: slower than the flash kernel, and its masks repeat
shifted from one step to the next):

* ``masks``: the kept fraction; that the forward's mask is the one the backward uses (the
  output and the three gradients against an einsum reference with the recovered mask, plain
  and under ``jax.checkpoint``); how the mask changes from one execution to the next
  (agreement with the previous execution's mask, also shifted along both axes, to catch
  offset windows that overlap), from seed to seed, and between rows and heads. The mask is
  recovered exactly: calls with the same seed in one execution share it, so ``s / d`` calls
  whose values are one-hot columns return the dropped, rescaled probabilities themselves.
* ``speed``: forward + backward and forward alone of cuDNN with dropout, cuDNN without
  dropout and the flash kernel with and without dropout, at BERT's shapes.

  python bench/probe_cudnn_dropout.py --out probe.jsonl     # GPU (sets the flag below)
  python bench/probe_cudnn_dropout.py --emulate --mask-shapes 2x64x2x16 --shapes "" \\
      --out /tmp/p.jsonl          # CPU: the analysis on the flash reference's hash masks
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_attention import rel_err, timed_record, value_and_grad_of  # noqa: E402
from bench.common import write_result  # noqa: E402

# XLA (jax 0.11.2) aborts when it records cuDNN's dropout graph into a CUDA graph
# ("Check failed: local_device_ordinal.has_value()"): command buffers without CUDNN.
COMMAND_BUFFER_FLAG = "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL"
SEED, OTHER_SEED = 7, 8  # the mask checks' two compile-time seeds


def cudnn_dropout_attention(query, key, value, kv_lengths, *, dropout_rate: float, seed: int):
    """cuDNN's fused attention with dropout inside the kernel (GPU, half precision), padding
    as key lengths. The mask is a function of (``seed``, how many times this compiled call
    has run in the process, the element's position), not of a JAX key."""
    import jax.numpy as jnp
    from jax._src.cudnn.fused_attention_stablehlo import MaskType
    from jax._src.cudnn.fused_attention_stablehlo import (
        dot_product_attention as cudnn_attention,
    )

    batch, q_len = query.shape[:2]
    return cudnn_attention(
        query, key, value, q_seqlen=jnp.full((batch,), q_len, jnp.int32),
        kv_seqlen=kv_lengths.astype(jnp.int32), scale=float(query.shape[-1]) ** -0.5,
        mask_type=MaskType.PADDING, seed=int(seed), dropout_rate=float(dropout_rate))


def attention_for(seed: int, rate: float, lengths, emulate: bool):
    """(q, k, v) -> context with dropout ``rate``: cuDNN's kernel with ``seed``, or (emulate,
    for CPU tests) the flash reference with a mask fixed by ``seed``."""
    import jax

    from bert_jax.kernels import flash

    if emulate:
        def attn(q, k, v):
            salt = flash.salt_from_rng(jax.random.key(seed), q.shape[0], q.shape[2])
            return flash.reference_attention(q, k, v, lengths, salt=salt, dropout_rate=rate)
        return attn
    return functools.partial(cudnn_dropout_attention, kv_lengths=lengths, dropout_rate=rate,
                             seed=seed)


def recover(attn, q, k, v, cot, remat: bool):
    """One execution: the rescaled, dropped probabilities [b, q, h, k] (from one-hot values),
    and the output and gradients of another call with the same seed."""
    import jax
    import jax.numpy as jnp

    b, s, h, d = q.shape
    blocks = []
    for i in range(s // d):
        onehot = jnp.zeros((s, d), q.dtype).at[i * d + jnp.arange(d), jnp.arange(d)].set(1)
        blocks.append(attn(q, k, jnp.broadcast_to(onehot[None, :, None, :], (b, s, h, d))))
    probs = jnp.concatenate(blocks, axis=-1)
    fn = jax.checkpoint(attn) if remat else attn
    out, vjp = jax.vjp(fn, q, k, v)
    return probs, out, vjp(cot)


def reference(q, k, v, lengths, keep, rate, cot):
    """The einsum attention with the given keep mask [b, q, h, k], float32: (out, grads)."""
    import jax
    import jax.numpy as jnp

    def fn(q, k, v):
        scores = jnp.einsum("bqhd,bkhd->bqhk", q, k) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
        valid = jnp.arange(k.shape[1])[None, None, None, :] < lengths[:, None, None, None]
        probs = jax.nn.softmax(jnp.where(valid, scores, -jnp.inf), axis=-1)
        return jnp.einsum("bqhk,bkhd->bqhd", jnp.where(keep, probs / (1 - rate), 0.0), v)

    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    out, vjp = jax.vjp(fn, *f32)
    return out, vjp(cot.astype(jnp.float32))


def agreement(a, b, valid) -> float:
    import numpy as np

    return float(np.mean((a == b)[valid]))


def best_shift(now, before, valid, max_shift: int) -> dict:
    """The highest agreement of ``now`` with ``before`` rolled along the query or key axis
    (1..max_shift either way): ~0.82 when the masks are independent (rate 0.1), ~1 when one
    is a shifted copy of the other."""
    import numpy as np

    best = {"agreement": 0.0, "axis": None, "shift": 0}
    for axis in (1, 3):
        for shift in [*range(1, max_shift + 1), *range(-max_shift, 0)]:
            rolled = np.roll(before, shift, axis=axis)
            value = agreement(now, rolled, valid)
            if value > best["agreement"]:
                best = {"agreement": value, "axis": "query" if axis == 1 else "key",
                        "shift": shift}
    return best


def mask_report(shape: str, rate: float, emulate: bool, executions: int, out_path: str):
    """The mask checks at one shape (``s`` a multiple of ``d``); one record per execution."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    b, s, h, d = (int(x) for x in shape.split("x"))
    dtype = jnp.float32 if emulate else jnp.bfloat16
    ks = jax.random.split(jax.random.key(1), 4)
    q, k, v = (jax.random.normal(kk, (b, s, h, d), dtype) for kk in ks[:3])
    cot = jax.random.normal(ks[3], q.shape, dtype)
    lengths = jnp.full((b,), s, jnp.int32).at[0].set(s // 2 + 3)
    valid = np.broadcast_to((np.arange(s)[None, :] < np.asarray(lengths)[:, None])
                            [:, None, None, :], (b, s, h, s))
    base = {"probe": "cudnn_dropout_masks", "shape": shape, "rate": rate,
            "device": jax.devices()[0].device_kind, "emulated": emulate}
    # SEED runs every execution (the step-to-step comparison); OTHER_SEED only the first
    runs = {}
    for seed in (SEED, OTHER_SEED):
        for remat in (False, True):
            runs[seed, remat] = jax.jit(functools.partial(
                recover, attention_for(seed, rate, lengths, emulate), remat=remat))
    previous = None
    for execution in range(executions):
        for (seed, remat), run in runs.items():
            if seed == OTHER_SEED and execution > 0:
                continue
            probs, out, grads = run(q, k, v, cot)
            keep = np.asarray(probs.astype(jnp.float32)) != 0
            ref_out, ref_grads = reference(q, k, v, lengths, keep, rate, cot)
            record = {**base, "seed": seed, "remat": remat, "execution": execution,
                      "kept_fraction": float(np.mean(keep[valid])),
                      "padding_zero": bool(not np.any(keep[~valid])),
                      "out_rel_err": rel_err(out, ref_out),
                      "dq_dk_dv_rel_err": [rel_err(g, r) for g, r in zip(
                          grads, ref_grads, strict=True)],
                      "rows_agree": agreement(keep[1], keep[2 % b], valid[1] & valid[2 % b]),
                      "heads_agree": agreement(keep[..., 0, :], keep[..., h - 1, :],
                                               valid[..., 0, :])}
            if seed == SEED and not remat:
                if previous is not None:
                    record["previous_agree"] = agreement(keep, previous, valid)
                    record["previous_best_shift"] = best_shift(keep, previous, valid, 8)
                if execution == 0:
                    first = keep
                record["first_agree"] = agreement(keep, first, valid)
                previous = keep
            if seed == OTHER_SEED:
                record["first_seed_agree"] = agreement(keep, first, valid)
            write_result(out_path, record)


def speed(shape: str, rate: float, out_path: str) -> None:
    """Forward + backward (and forward alone) per call, every implementation at one shape."""
    import jax
    import jax.numpy as jnp

    from bert_jax.kernels import flash
    from bert_jax.modeling.attention import fused_attention

    b, s, h, d = (int(x) for x in shape.split("x"))
    ks = jax.random.split(jax.random.key(0), 5)
    q, k, v = (jax.random.normal(kk, (b, s, h, d), jnp.bfloat16) for kk in ks[:3])
    cot = jax.random.normal(ks[3], q.shape, jnp.bfloat16)
    lengths = jnp.full((b,), s, jnp.int32).at[0].set(s // 2 + 3)
    salt = flash.salt_from_rng(ks[4], b, h)
    impls = {
        "cudnn_dropout": lambda q, k, v: cudnn_dropout_attention(
            q, k, v, lengths, dropout_rate=rate, seed=SEED),
        "cudnn_no_dropout": lambda q, k, v: fused_attention(q, k, v, lengths, "cudnn"),
        "flash_dropout": lambda q, k, v: flash.flash_attention(
            q, k, v, lengths, salt=salt, dropout_rate=rate),
        "flash_no_dropout": lambda q, k, v: flash.flash_attention(q, k, v, lengths),
    }
    base = {"probe": "cudnn_dropout_speed", "shape": shape, "rate": rate,
            "device": jax.devices()[0].device_kind}
    for name, fn in impls.items():
        write_result(out_path, timed_record({**base, "impl": name}, (q, k, v),
                                            fwd_bwd=value_and_grad_of(fn, cot),
                                            fwd=jax.jit(fn)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="32x512x16x64,256x128x12x64,256x128x16x64",
                    help="speed: comma list of batch x seq x heads x head_dim ('' for none)")
    ap.add_argument("--mask-shapes", default="4x256x4x64,2x512x16x64",
                    help="mask checks (seq a multiple of head_dim; '' for none)")
    ap.add_argument("--rate", type=float, default=0.1)
    ap.add_argument("--executions", type=int, default=3)
    ap.add_argument("--emulate", action="store_true",
                    help="the flash reference's hash masks instead of cuDNN (CPU tests)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if not args.emulate and COMMAND_BUFFER_FLAG not in os.environ.get("XLA_FLAGS", ""):
        # before the backend starts (the first device use below)
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {COMMAND_BUFFER_FLAG}"

    for shape in filter(None, args.mask_shapes.split(",")):
        try:
            mask_report(shape, args.rate, args.emulate, args.executions, args.out)
        except Exception as e:  # noqa: BLE001 (report and go on)
            write_result(args.out, {"probe": "cudnn_dropout_masks", "shape": shape,
                                    "error": f"{type(e).__name__}: {e}"[:600]})
    for shape in filter(None, args.shapes.split(",")):
        speed(shape, args.rate, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
