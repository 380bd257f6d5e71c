"""bert-jax pretraining step throughput, MFU and peak memory, through the real engine.

The step is the loop's own: ``bert_jax.training.setup.build_training`` (BertForPreTraining,
``make_optimizer`` AdamW, ``TrainState``, ``make_train_step`` jitted with the state's
shardings and ``donate_argnums=0``), bf16 compute with fp32 parameters, the MLM head on the
gathered masked positions only. Inputs are random token ids (never zeros), full-length rows.
Warm-up (compilation) first, then ``--repeats`` runs of ``--steps`` steps, each ended by
``block_until_ready`` on the last step's metrics; the median run gives the numbers. MFU is
against a bf16 matmul peak measured in the same process.

  python -m bench step pretrain --model large --seq-len 512 --batch-size 32 --out bench_out

Levers (each at the engine's default unless given): --attention, --attention-dropout,
--dropout-impl, the model choices (--layer-norm, --qkv, ...), the kernel levers
(--fused-gelu, --fused-mlm-loss, --norm-blocks, ...), --scan, --remat, --vocab-pad,
--microbatches, --xla-flags, --no-donate, --skip cond, --mesh fsdp. Records go to
OUT/step.jsonl. --layers and --vocab-size change the preset's depth and vocabulary (default:
BERT's 30,522). CPU validation: --model tiny --steps 2 --repeats 1.
"""

from __future__ import annotations

import argparse
import time

from bench.common import (
    VOCAB,
    add_out_argument,
    environment,
    masked_positions,
    median_time,
    results_file,
    train_flops_per_sequence,
    write_result,
)
from bench.levers import (
    XLA_FLAG_PRESETS,
    add_kernel_lever_arguments,
    add_model_choice_arguments,
    apply_process_levers,
    kernel_lever_fields,
    kernel_lever_record,
    model_choice_fields,
    model_choice_record,
)


def add_common_arguments(ap: argparse.ArgumentParser, batch_size: int) -> None:
    """Options shared by the bert-jax benchmarks (model, shapes, timing, numerics levers)."""
    ap.add_argument("--model", default="base",
                    choices=["tiny", "mini", "small", "medium", "base", "large"])
    ap.add_argument("--layers", type=int, default=0,
                    help="num_hidden_layers (0: the preset's): one layer of a large model, "
                         "say, where the whole model does not fit")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=batch_size,
                    help="global batch (sequences per optimizer step)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps (first compiles)")
    ap.add_argument("--attention", default="auto", choices=["auto", "xla", "cudnn"],
                    help="fused attention backend (used when attention dropout is off)")
    ap.add_argument("--attention-dropout", type=float, default=0.1,
                    help="attention_probs_dropout_prob (BERT: 0.1; 0 lets the fused kernel run)")
    ap.add_argument("--hidden-dropout-rate", type=float, default=0.1,
                    help="hidden_dropout_prob (BERT: 0.1); 0 with --attention-dropout 0: the "
                         "dropout-free comparison with plain Flax")
    ap.add_argument("--dropout-impl", default="auto",
                    choices=["auto", "explicit", "flash"],
                    help="attention with dropout: model.kernels.dropout_attention_impl (auto = "
                         "the flash kernel on GPU, explicit = einsum path)")
    add_model_choice_arguments(ap)
    add_kernel_lever_arguments(ap)
    ap.add_argument("--scan", action="store_true", help="scan over layers")
    ap.add_argument("--remat", default="none",
                    choices=["none", "full", "dots", "dots_no_batch", "offload_dots"])
    ap.add_argument("--vocab-size", type=int, default=VOCAB,
                    help="vocabulary size (default: BERT's uncased WordPiece, 30,522)")
    ap.add_argument("--vocab-pad", type=int, default=128, help="vocab_pad_multiple")
    ap.add_argument("--xla-flags", default="none", choices=sorted(XLA_FLAG_PRESETS))
    ap.add_argument("--no-donate", action="store_true", help="do not donate the state")
    ap.add_argument("--mesh", default="dp", choices=["dp", "fsdp"],
                    help="dp: data=-1 (replicated params); fsdp: fsdp=-1")
    ap.add_argument("--devices", type=int, default=0, help="use the first N devices (0: all)")
    ap.add_argument("--peak-size", type=int, default=0,
                    help="matmul size for the measured peak (0: 8192 on GPU/TPU, 1024 on CPU)")
    ap.add_argument("--tag", default="", help="free-form label stored in the record")
    add_out_argument(ap)


def add_param_gather_argument(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--param-gather", default="param_dtype",
                    choices=["param_dtype", "compute_dtype"],
                    help="parallel.param_gather: FSDP all-gathers of matmul kernels in float32 "
                         "(as stored) or cast to bf16 where they live")
    ap.add_argument("--grad-reduce", default="partitioner",
                    choices=["auto", "partitioner", "explicit"],
                    help="parallel.grad_reduce: gradients summed over the batch shards by one "
                         "psum after the backward pass (explicit; auto: on data-parallel "
                         "meshes) or by XLA's partitioner per contribution")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench step pretrain",
                                 description=__doc__.split("\n\n")[0])
    add_common_arguments(ap, batch_size=256)
    add_param_gather_argument(ap)
    ap.add_argument("--microbatches", type=int, default=1)
    ap.add_argument("--skip", default="where", choices=["where", "cond"],
                    help="non-finite skip: engine's jnp.where over all leaves, or lax.cond")
    ap.add_argument("--check-update", action="store_true",
                    help="check_update: also skip a step whose new state would be non-finite "
                         "(one more pass over parameters, gradients and moments)")
    ap.add_argument("--fp8", action="store_true",
                    help="model.fp8: the encoder layers' matmuls in FP8 (delayed scaling)")
    ap.add_argument("--fp8-gelu-quantize", default="on", choices=["on", "off"],
                    help="model.kernels.fp8_gelu_quantize: under --fp8, the GELU kernels "
                         "write the MLP activation and its gradient in float8 (off: XLA "
                         "quantizes them)")
    ap.add_argument("--fp8-gelu-transpose", default="on", choices=["on", "off"],
                    help="model.kernels.fp8_gelu_transpose: the GELU kernels also write "
                         "those float8 tensors transposed for the weight gradients (off: XLA "
                         "transposes)")
    ap.add_argument("--fp8-cast-kernel", default="on", choices=["on", "off"],
                    help="model.kernels.fp8_cast_kernel: the FP8 matmuls' inputs and gradients "
                         "quantized, with transposed copies, by one Pallas kernel (off: XLA)")
    return ap.parse_args(argv)


# ---- measurement helpers (shared by the other bert-jax benchmarks) -------------------------
def matmul_peak_tflops(size: int = 0, iters: int = 20, repeats: int = 5) -> float:
    """Median bf16 ``size``^3 matmul rate of device 0 in TFLOP/s, random inputs."""
    import jax
    import jax.numpy as jnp

    n = size or (1024 if jax.default_backend() == "cpu" else 8192)
    device = jax.local_devices()[0]
    ka, kb = jax.random.split(jax.random.PRNGKey(1))
    a = jax.device_put(jax.random.normal(ka, (n, n), jnp.bfloat16), device)
    b = jax.device_put(jax.random.normal(kb, (n, n), jnp.bfloat16), device)
    matmul = jax.jit(lambda x, y: x @ y)
    matmul(a, b).block_until_ready()

    def run():
        out = None
        for _ in range(iters):
            out = matmul(a, b)
        out.block_until_ready()

    t, _ = median_time(run, repeats)
    return 2 * n ** 3 * iters / t / 1e12


def peak_memory_gib() -> float | None:
    """Largest ``peak_bytes_in_use`` over this process's devices (None where unsupported)."""
    import jax

    peaks = []
    for device in jax.local_devices():
        stats = device.memory_stats() or {}
        if "peak_bytes_in_use" in stats:
            peaks.append(stats["peak_bytes_in_use"])
    return max(peaks) / 2 ** 30 if peaks else None


def bytes_on_device(tree, device) -> int:
    """Bytes of ``tree``'s shards that live on ``device``."""
    import jax

    total = 0
    for leaf in jax.tree.leaves(tree):
        for shard in leaf.addressable_shards:
            if shard.device == device:
                total += shard.data.nbytes
    return total


def time_steps(step, state, batches, rng, steps: int, repeats: int, warmup: int):
    """Runs ``warmup`` then ``repeats`` x ``steps`` steps (state threaded through, batches
    cycled); returns (state, last metrics, compile+first step seconds, median seconds per
    run, all run times)."""
    import jax

    t0 = time.perf_counter()
    state, metrics = step(state, batches[0], rng)
    jax.block_until_ready(metrics)
    first = time.perf_counter() - t0
    for i in range(1, warmup):
        state, metrics = step(state, batches[i % len(batches)], rng)
    jax.block_until_ready(metrics)
    box = {"state": state, "metrics": metrics}

    def run():
        s = box["state"]
        m = None
        for i in range(steps):
            s, m = step(s, batches[i % len(batches)], rng)
        jax.block_until_ready(m)
        box["state"], box["metrics"] = s, m

    median, times = median_time(run, repeats)
    return box["state"], box["metrics"], first, median, times


# ---- pretraining ------------------------------------------------------------------------------
def experiment_config(args: argparse.Namespace):
    """The experiment ConfigDict the loop would get for these benchmark options."""
    from bert_jax.config import KERNEL_FIELDS
    from bert_jax.training.config import base_config

    c = base_config()
    c.model.preset = args.model
    if args.layers:
        c.model.num_hidden_layers = int(args.layers)
    c.model.dtype = "bfloat16"
    c.model.param_dtype = "float32"
    c.model.kernels.attention_impl = args.attention
    c.model.attention_probs_dropout_prob = float(args.attention_dropout)
    c.model.hidden_dropout_prob = float(args.hidden_dropout_rate)
    c.model.kernels.dropout_attention_impl = args.dropout_impl
    for field, value in {**model_choice_fields(args), **kernel_lever_fields(args)}.items():
        section = c.model.kernels if field in KERNEL_FIELDS else c.model
        section[field] = value
    c.model.scan_layers = bool(args.scan)
    c.model.remat_policy = args.remat
    c.model.vocab_size = int(args.vocab_size)
    c.model.vocab_pad_multiple = int(args.vocab_pad)
    c.model.fp8 = bool(getattr(args, "fp8", False))
    c.model.kernels.fp8_gelu_quantize = getattr(args, "fp8_gelu_quantize", "on") == "on"
    c.model.kernels.fp8_gelu_transpose = getattr(args, "fp8_gelu_transpose", "on") == "on"
    c.model.kernels.fp8_cast_kernel = getattr(args, "fp8_cast_kernel", "on") == "on"
    c.data.source = "synthetic"
    c.data.max_seq_length = args.seq_len
    c.data.max_predictions_per_seq = masked_positions(args.seq_len)
    c.global_batch_size = args.batch_size
    c.microbatches = getattr(args, "microbatches", 1)
    c.check_update = bool(getattr(args, "check_update", False))
    c.num_train_steps = 100_000
    c.optimizer.warmup_steps = 1_000
    c.parallel.mesh = ({"data": -1, "fsdp": 1, "tensor": 1} if args.mesh == "dp"
                       else {"data": 1, "fsdp": -1, "tensor": 1})
    c.parallel.param_gather = getattr(args, "param_gather", "param_dtype")
    c.parallel.grad_reduce = getattr(args, "grad_reduce", "partitioner")
    return c


def random_pretraining_batch(rng, batch: int, seq_len: int, predictions: int, vocab: int):
    """Full-length rows of random ids in [5, vocab), two segments, ``predictions`` distinct
    masked positions per row (never [CLS] or the last token)."""
    import numpy as np

    positions = np.sort(np.argsort(rng.random((batch, seq_len - 2)), axis=1)[:, :predictions]
                        + 1, axis=1).astype(np.int32)
    segments = (np.arange(seq_len)[None, :] >= seq_len // 2).astype(np.int32)
    return {
        "input_ids": rng.integers(5, vocab, (batch, seq_len)).astype(np.int32),
        "input_mask": np.ones((batch, seq_len), np.int32),
        "segment_ids": np.repeat(segments, batch, axis=0),
        "masked_lm_positions": positions,
        "masked_lm_ids": rng.integers(5, vocab, (batch, predictions)).astype(np.int32),
        "masked_lm_weights": np.ones((batch, predictions), np.float32),
        "next_sentence_labels": rng.integers(0, 2, (batch,)).astype(np.int32),
    }


def select_mesh(config, devices: int):
    import jax

    from bert_jax import parallel

    chosen = jax.devices()[:devices] if devices else jax.devices()
    return parallel.create_mesh(config.parallel.mesh, config.parallel.dcn_mesh, chosen)


def build_step(args, training):
    """The loop's jitted step, or the same step with a lever (no donation / cond skip)."""
    import jax

    from bert_jax import parallel
    from bert_jax.training.steps import make_train_step

    if not args.no_donate and args.skip == "where":
        return training.train_step
    mesh, rules = training.mesh, training.rules
    fn = parallel.traced_in_mesh(make_train_step(
        training.model, training.tx, training.schedule, microbatches=args.microbatches,
        pair_head=training.model.pair_head, skip=args.skip, check_update=args.check_update,
        microbatch_sharding=lambda ndim: parallel.logical_sharding(
            mesh, rules, None, "batch", *([None] * (ndim - 1))),
        param_cast=training.param_cast, reduce_grads=training.reduce_grads), mesh, rules)
    replicated = parallel.replicated(training.mesh)
    return jax.jit(fn, in_shardings=(training.state_shardings, training.batch_shardings,
                                     replicated),
                   out_shardings=(training.state_shardings, replicated),
                   donate_argnums=() if args.no_donate else 0)


def main(argv=None) -> dict:
    args = parse_args(argv)
    args.out = results_file(args.out, "step")
    apply_process_levers(args)
    import jax
    import numpy as np

    from bert_jax.training.config import model_config
    from bert_jax.training.setup import build_training

    config = experiment_config(args)
    model_cfg = model_config(config)
    mesh = select_mesh(config, args.devices)
    training = build_training(config, model_cfg, mesh)
    state = training.init_state(jax.random.PRNGKey(0))
    rng = jax.device_put(jax.random.PRNGKey(1), jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec()))
    host_rng = np.random.default_rng(0)
    p = masked_positions(args.seq_len)
    batches = [training.global_batch(random_pretraining_batch(
        host_rng, args.batch_size, args.seq_len, p, model_cfg.vocab_size)) for _ in range(2)]
    step = build_step(args, training)
    device0 = mesh.devices.flat[0]
    state_bytes = {"param_bytes_per_device": bytes_on_device(state.params, device0),
                   "opt_state_bytes_per_device": bytes_on_device(state.opt_state, device0),
                   "state_bytes_total": sum(x.nbytes for x in jax.tree.leaves(
                       (state.params, state.opt_state)))}
    state, metrics, first, median, times = time_steps(step, state, batches, rng, args.steps,
                                                      args.repeats, args.warmup)
    metrics = jax.device_get(metrics)
    skipped = int(jax.device_get(state.skipped_total))
    peak_mem = peak_memory_gib()
    peak = matmul_peak_tflops(args.peak_size)
    n_dev = mesh.devices.size
    seq_per_s = args.batch_size * args.steps / median
    flops = train_flops_per_sequence(model_cfg.num_hidden_layers, model_cfg.hidden_size,
                                     args.seq_len, model_cfg.vocab_size, p)
    record = {
        **environment(), "task": "pretrain", "model": args.model,
        "layers": model_cfg.num_hidden_layers, "seq_len": args.seq_len,
        "batch_size": args.batch_size, "predictions": p, "devices": n_dev,
        "attention": args.attention, "attention_dropout": args.attention_dropout,
        "hidden_dropout_rate": args.hidden_dropout_rate, "dropout_impl": args.dropout_impl,
        **model_choice_record(args), **kernel_lever_record(args), "scan": args.scan,
        "remat": args.remat, "vocab_size": model_cfg.vocab_size,
        "vocab_pad": args.vocab_pad, "microbatches": args.microbatches,
        "xla_flag_preset": args.xla_flags, "donate": not args.no_donate, "skip": args.skip,
        "mesh": args.mesh, "param_gather": args.param_gather, "fp8": args.fp8,
        "check_update": args.check_update,
        "fp8_gelu_quantize": args.fp8_gelu_quantize == "on",
        "fp8_gelu_transpose": args.fp8_gelu_transpose == "on",
        "fp8_cast_kernel": args.fp8_cast_kernel == "on",
        "grad_reduce": args.grad_reduce, "tag": args.tag,
        "compile_and_first_step_s": first, "step_time_s": median / args.steps,
        "seq_per_s": seq_per_s, "tokens_per_s": seq_per_s * args.seq_len,
        "flops_per_seq": flops, "tflops": seq_per_s * flops / 1e12,
        "tflops_per_device": seq_per_s * flops / 1e12 / n_dev,
        "matmul_peak_tflops": peak, "mfu": seq_per_s * flops / 1e12 / n_dev / peak,
        "peak_memory_gib": peak_mem, **state_bytes,
        "loss": float(metrics["loss"]), "skipped_steps": skipped, "repeat_times_s": times,
    }
    if not np.isfinite(record["loss"]) or skipped:
        record["warning"] = "non-finite loss or skipped steps: the timing is not a valid step"
    write_result(args.out, record)
    return record


if __name__ == "__main__":
    main()
