"""bert-jax fine-tuning step throughput: sequence classification (BertForSequenceClassification,
2 labels) with AdamW (``make_optimizer``: no decay on LayerNorm/bias, global-norm clipping),
bf16 compute, fp32 parameters, jitted with shardings and the state donated.

The step is the fine-tuning engine's (``bert_jax.finetuning.trainer.make_train_step``, kind
``classification``). FLOPs per sequence are the pretraining formula without the MLM head
(p = 0), as for the peer (``python -m bench peers transformers --task classify``). Records go
to OUT/step.jsonl.

  python -m bench step finetune --model base --seq-len 128 --batch-size 32 --out bench_out
"""

from __future__ import annotations

import argparse

from bench.common import environment, results_file, train_flops_per_sequence, write_result
from bench.levers import (
    apply_process_levers,
    kernel_lever_fields,
    kernel_lever_record,
    model_choice_fields,
    model_choice_record,
    model_fields,
)
from bench.pretrain import (
    add_common_arguments,
    bytes_on_device,
    matmul_peak_tflops,
    peak_memory_gib,
    time_steps,
)

NUM_LABELS = 2


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench step finetune",
                                 description=__doc__.split("\n\n")[0])
    add_common_arguments(ap, batch_size=32)
    return ap.parse_args(argv)


def model_config(args):
    from bert_jax.config import get_preset

    layers = {"num_hidden_layers": int(args.layers)} if args.layers else {}
    fields = model_fields({"attention_impl": args.attention,
                           "dropout_attention_impl": args.dropout_impl,
                           **model_choice_fields(args), **kernel_lever_fields(args)})
    return get_preset(args.model, **layers, dtype="bfloat16", param_dtype="float32",
                      attention_probs_dropout_prob=float(args.attention_dropout),
                      hidden_dropout_prob=float(args.hidden_dropout_rate), **fields,
                      scan_layers=bool(args.scan), remat_policy=args.remat,
                      vocab_size=int(args.vocab_size), vocab_pad_multiple=int(args.vocab_pad))


def random_classification_batch(rng, batch: int, seq_len: int, vocab: int):
    """Full-length rows of random ids in [5, vocab), two segments, random labels."""
    import numpy as np

    segments = (np.arange(seq_len)[None, :] >= seq_len // 2).astype(np.int32)
    return {"input_ids": rng.integers(5, vocab, (batch, seq_len)).astype(np.int32),
            "input_mask": np.ones((batch, seq_len), np.int32),
            "segment_ids": np.repeat(segments, batch, axis=0),
            "label_ids": rng.integers(0, NUM_LABELS, (batch,)).astype(np.int32),
            "example_weight": np.ones((batch,), np.float32)}


def main(argv=None) -> dict:
    args = parse_args(argv)
    args.out = results_file(args.out, "step")
    apply_process_levers(args)
    import jax
    import jax.numpy as jnp
    import ml_collections
    import numpy as np

    from bert_jax import parallel
    from bert_jax.finetuning.trainer import make_train_step
    from bert_jax.modeling.heads import BertForSequenceClassification
    from bert_jax.runs.optimizers import make_optimizer
    from bert_jax.runs.state import TrainState

    cfg = model_config(args)
    devices = jax.devices()[:args.devices] if args.devices else jax.devices()
    mesh = parallel.create_mesh({"data": -1} if args.mesh == "dp" else {"fsdp": -1},
                                devices=devices)
    rules = parallel.DEFAULT_RULES
    model = BertForSequenceClassification(cfg, NUM_LABELS)
    tx, _ = make_optimizer(ml_collections.ConfigDict({
        "name": "adamw", "learning_rate": 2e-5, "warmup_steps": 100, "decay": "linear",
        "decay_steps": 10_000, "end_learning_rate": 0.0, "power": 1.0, "b1": 0.9,
        "b2": 0.999, "eps": 1e-6, "weight_decay": 0.01, "clip_norm": 1.0}))

    def init_fn(rng):
        ids = jnp.zeros((1, args.seq_len), jnp.int32)
        params = model.init({"params": rng}, ids, jnp.ones_like(ids), ids)["params"]
        return TrainState.create(params, tx.init(params))

    _, state_shardings = parallel.abstract_and_shardings(init_fn, mesh, rules,
                                                         jax.random.PRNGKey(0))
    state = parallel.sharded_init(init_fn, state_shardings, jax.random.PRNGKey(0))
    replicated = parallel.replicated(mesh)
    step = jax.jit(make_train_step(model, tx, "classification"),
                   out_shardings=(state_shardings, replicated),
                   donate_argnums=() if args.no_donate else 0)
    host_rng = np.random.default_rng(0)
    batches = [parallel.global_batch(random_classification_batch(
        host_rng, args.batch_size, args.seq_len, cfg.vocab_size), mesh, rules)
        for _ in range(2)]
    rng = jax.device_put(jax.random.PRNGKey(1), replicated)
    device0 = mesh.devices.flat[0]
    state_bytes = {"param_bytes_per_device": bytes_on_device(state.params, device0),
                   "opt_state_bytes_per_device": bytes_on_device(state.opt_state, device0)}
    state, metrics, first, median, times = time_steps(step, state, batches, rng, args.steps,
                                                      args.repeats, args.warmup)
    metrics = jax.device_get(metrics)
    loss = float(metrics["loss_sum"] / max(float(metrics["count"]), 1.0))
    peak_mem = peak_memory_gib()
    peak = matmul_peak_tflops(args.peak_size)
    n_dev = mesh.devices.size
    seq_per_s = args.batch_size * args.steps / median
    flops = train_flops_per_sequence(cfg.num_hidden_layers, cfg.hidden_size, args.seq_len,
                                     cfg.vocab_size, predictions=0)
    record = {
        **environment(), "task": "classify", "model": args.model,
        "layers": cfg.num_hidden_layers, "seq_len": args.seq_len,
        "batch_size": args.batch_size, "devices": n_dev, "attention": args.attention,
        "attention_dropout": args.attention_dropout,
        "hidden_dropout_rate": args.hidden_dropout_rate, "dropout_impl": args.dropout_impl,
        **model_choice_record(args), **kernel_lever_record(args), "scan": args.scan,
        "remat": args.remat,
        "vocab_size": cfg.vocab_size, "vocab_pad": args.vocab_pad,
        "xla_flag_preset": args.xla_flags, "donate": not args.no_donate, "mesh": args.mesh,
        "tag": args.tag, "compile_and_first_step_s": first,
        "step_time_s": median / args.steps, "seq_per_s": seq_per_s,
        "tokens_per_s": seq_per_s * args.seq_len, "flops_per_seq": flops,
        "tflops": seq_per_s * flops / 1e12, "tflops_per_device": seq_per_s * flops / 1e12 / n_dev,
        "matmul_peak_tflops": peak, "mfu": seq_per_s * flops / 1e12 / n_dev / peak,
        "peak_memory_gib": peak_mem, **state_bytes, "loss": loss, "repeat_times_s": times,
    }
    if not np.isfinite(loss):
        record["warning"] = "non-finite loss: the timing is not a valid step"
    write_result(args.out, record)
    return record


if __name__ == "__main__":
    main()
