"""Where does a pretraining step's time go? Times forward, forward+backward (with and
without dropout) and the full train step for one model on one device, in one process.

  python bench/diag_step.py --model base --seq-len 128 --batch-size 256
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="base")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--attention", default="auto")
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()

    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import optax

    from bench.common import masked_positions
    from bert_jax.config import get_preset
    from bert_jax.modeling import BertForPreTraining

    cfg = get_preset(args.model, dtype="bfloat16", attention_impl=args.attention)
    b, s, p = args.batch_size, args.seq_len, masked_positions(args.seq_len)
    k = jax.random.split(jax.random.key(0), 4)
    batch = dict(input_ids=jax.random.randint(k[0], (b, s), 5, cfg.vocab_size),
                 input_mask=jnp.ones((b, s), jnp.int32),
                 segment_ids=(jnp.arange(s)[None] >= s // 2).astype(jnp.int32).repeat(b, 0),
                 positions=jax.random.randint(k[1], (b, p), 1, s - 1),
                 labels=jax.random.randint(k[2], (b, p), 5, cfg.vocab_size))

    def loss(params, batch, rng, attn_dropout=True):
        model = BertForPreTraining(cfg if attn_dropout else cfg.replace(
            attention_probs_dropout_prob=0.0))
        out = model.apply({"params": params}, batch["input_ids"], batch["input_mask"],
                          batch["segment_ids"], batch["positions"], deterministic=rng is None,
                          rngs=None if rng is None else {"dropout": rng})
        return optax.softmax_cross_entropy_with_integer_labels(
            out["mlm_logits"], batch["labels"]).mean() + out["nsp_logits"].mean()

    params = nn.unbox(BertForPreTraining(cfg).init(k[3], batch["input_ids"])["params"])
    tx = optax.adamw(1e-4)
    opt = tx.init(params)

    def step(params, opt, batch, rng):
        g = jax.grad(loss)(params, batch, rng)
        u, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, u), opt

    cases = {
        "forward (deterministic)": (jax.jit(lambda p, b: loss(p, b, None)), (params, batch)),
        "fwd+bwd (no dropout)": (jax.jit(jax.grad(lambda p, b: loss(p, b, None))),
                                 (params, batch)),
        "fwd+bwd (hidden dropout only)": (jax.jit(jax.grad(
            lambda p, b, r: loss(p, b, r, attn_dropout=False))), (params, batch, k[0])),
        "fwd+bwd (all dropout)": (jax.jit(jax.grad(loss)), (params, batch, k[0])),
        "adamw step (all dropout)": (jax.jit(step), (params, opt, batch, k[0])),
    }
    for name, (fn, fargs) in cases.items():
        jax.block_until_ready(fn(*fargs))
        t0 = time.perf_counter()
        for _ in range(args.steps):
            out = fn(*fargs)
        jax.block_until_ready(out)
        dt = (time.perf_counter() - t0) / args.steps
        print(f"{name:32s} {dt * 1e3:8.2f} ms  {b / dt:9.0f} seq/s", flush=True)


if __name__ == "__main__":
    main()
