"""What gradient accumulation costs: the pretraining step over k microbatches of m
sequences against k plain steps of m (the same sequences, the same FLOPs), on this
machine's devices (wall time) and in the compiled program (XLA's FLOPs and HBM bytes).

    python -m bench accumulation --out DIR [--preset tiny] [--layers 2] [--micro 16] [--k 4]

The accumulation step runs the forward and backward pass k times and the optimizer once;
k plain steps run the optimizer k times. The overhead is the accumulating step's time over
k plain steps' minus the k - 1 optimizer updates it saves: what the loop adds (the
gradient sums, the microbatch split).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def _step(preset: str, layers: int, batch: int, k: int, seq: int):
    import jax
    import jax.numpy as jnp
    import numpy as np

    from bert_jax import parallel
    from bert_jax.training.config import load_config, model_config
    from bert_jax.training.setup import build_training

    config = load_config("experiments/pretrain.py:tiny", [
        f"--config.model.preset={preset}", f"--config.model.num_hidden_layers={layers}",
        "--config.model.vocab_size=8192", f"--config.global_batch_size={batch}",
        f"--config.microbatches={k}", f"--config.data.max_seq_length={seq}",
        "--config.model.hidden_dropout_prob=0.0",
        "--config.model.attention_probs_dropout_prob=0.0"])
    mesh = parallel.create_mesh(config.parallel.mesh, config.parallel.dcn_mesh,
                                devices=jax.devices()[:1])
    training = build_training(config, model_config(config), mesh)
    state = training.init_state(jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    preds = config.data.max_predictions_per_seq
    local = {"input_ids": rng.integers(1, 8192, (batch, seq), dtype=np.int32),
             "input_mask": np.ones((batch, seq), np.int32),
             "segment_ids": np.zeros((batch, seq), np.int32),
             "masked_lm_positions": rng.integers(0, seq, (batch, preds), dtype=np.int32),
             "masked_lm_ids": rng.integers(1, 8192, (batch, preds), dtype=np.int32),
             "masked_lm_weights": np.ones((batch, preds), np.float32),
             "next_sentence_labels": rng.integers(0, 2, (batch,), dtype=np.int32)}
    data = training.global_batch(local)
    key = jnp.asarray(jax.random.PRNGKey(1))
    compiled = training.train_step.lower(state, data, key).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    return compiled, state, data, key, cost


def _time(compiled, state, data, key, steps: int, repeats: int) -> tuple[float, list]:
    import jax

    state, _ = compiled(state, data, key)  # warm
    jax.block_until_ready(state)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            state, metrics = compiled(state, data, key)
        jax.block_until_ready(metrics)
        times.append((time.perf_counter() - start) / steps)
    return statistics.median(times), times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--micro", type=int, default=16, help="sequences per microbatch (m)")
    ap.add_argument("--k", type=int, default=4, help="microbatches")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    import jax

    m, k = args.micro, args.k
    plain = _step(args.preset, args.layers, m, 1, args.seq)
    accumulated = _step(args.preset, args.layers, m * k, k, args.seq)
    t_plain, plain_times = _time(*plain[:4], args.steps, args.repeats)
    t_acc, acc_times = _time(*accumulated[:4], args.steps, args.repeats)
    cost_plain, cost_acc = plain[4], accumulated[4]
    record = {
        "backend": jax.default_backend(), "device": str(jax.devices()[0].device_kind),
        "jax": jax.__version__, "preset": args.preset, "layers": args.layers,
        "micro": m, "k": k, "seq": args.seq,
        "plain_step_s": t_plain, "accumulated_step_s": t_acc,
        "plain_times": plain_times, "accumulated_times": acc_times,
        # the accumulating step against k plain steps of the same microbatch
        "time_ratio_vs_k_plain": t_acc / (k * t_plain),
        "plain_flops": cost_plain.get("flops"), "plain_bytes": cost_plain.get(
            "bytes accessed"),
        # XLA counts the accumulation loop's body once: the body's cost is one microbatch
        "accumulated_flops_counted": cost_acc.get("flops"),
        "accumulated_bytes_counted": cost_acc.get("bytes accessed"),
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "accumulation.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
    print(json.dumps(record, indent=1, sort_keys=True))
    return 0
