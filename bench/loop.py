"""The real loop's throughput: ``bert-jax pretrain`` (``train_and_evaluate``) fed from
pre-materialized batches, read back from its ``metrics.jsonl``, optionally next to the step
benchmark in the same process (the loop should run within 5% of the step).

Writes full-length random batches (ids in [5, vocab), as ``bench step pretrain`` uses) in the
``bert-jax materialize-batches`` format (numpy only), runs the loop on them for ``--steps``
steps with evaluation off and checkpointing only at the end, and takes the median
``seq_per_sec`` of the logged intervals after the first (which starts right after
compilation). ``--compare-step`` then runs ``bench step pretrain`` with the same options.
Records go to OUT/step.jsonl.

  python -m bench step loop --model base --seq-len 128 --batch-size 256 --compare-step
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

from bench.common import REPO, environment, masked_positions, results_file, write_result
from bench.levers import (
    apply_process_levers,
    kernel_lever_fields,
    kernel_lever_record,
    model_choice_fields,
    model_choice_record,
    model_path,
)
from bench.pretrain import (
    add_common_arguments,
    matmul_peak_tflops,
    peak_memory_gib,
    random_pretraining_batch,
)

EXPERIMENTS = os.path.join(REPO, "experiments", "pretrain.py")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench step loop",
                                 description=__doc__.split("\n\n")[0])
    add_common_arguments(ap, batch_size=256)
    ap.set_defaults(steps=120)  # logged intervals of 20 steps, the first one dropped
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--source", default="materialized", choices=["materialized", "synthetic"],
                    help="materialized: pre-built full-length batches; synthetic: the loop's "
                         "on-the-fly random batches (variable lengths)")
    ap.add_argument("--compare-step", action="store_true",
                    help="also run the pretraining step benchmark with the same options in "
                         "this process")
    ap.add_argument("--workdir", default="",
                    help="loop workdir (default: a temporary directory, removed afterwards)")
    args = ap.parse_args(argv)
    if args.no_donate:
        ap.error("--no-donate: the loop always donates its state")
    if args.steps < 3 * args.log_every:
        ap.error(f"--steps {args.steps} must be at least 3 x --log-every {args.log_every} "
                 "(the first logged interval is dropped)")
    return args


def write_materialized(directory: str, steps: int, batch: int, seq_len: int,
                       predictions: int, vocab: int) -> None:
    """``steps`` random global batches in the ``MaterializedBatches`` format."""
    import numpy as np

    from bert_jax.data.materialize import _KEYS_AND_DTYPES, MANIFEST_JSON, storage_dtypes

    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(0)
    on_disk = storage_dtypes(vocab, seq_len)
    rows = [random_pretraining_batch(rng, batch, seq_len, predictions, vocab)
            for _ in range(steps)]
    keys = {}
    for key, dtype in _KEYS_AND_DTYPES:
        stacked = np.stack([r[key] for r in rows]).astype(on_disk[key])  # [steps, batch, ...]
        np.save(os.path.join(directory, f"{key}.npy"), stacked)
        keys[key] = {"dtype": dtype, "storage_dtype": on_disk[key], "shape": list(stacked.shape)}
    manifest = {"steps": steps, "batch_size": batch, "seq_len": seq_len,
                "max_predictions": predictions, "seed": 0, "mode": "random", "keys": keys}
    with open(os.path.join(directory, MANIFEST_JSON), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)


def loop_overrides(args, data_dir: str, peak: float) -> list[str]:
    """``--config.key=value`` arguments for ``bert-jax pretrain`` matching these options."""
    mesh = {"dp": "data", "fsdp": "fsdp"}[args.mesh]
    other = "fsdp" if mesh == "data" else "data"
    values = {
        "model.preset": args.model, "model.dtype": "bfloat16", "model.param_dtype": "float32",
        "model.kernels.attention_impl": args.attention,
        "model.attention_probs_dropout_prob": args.attention_dropout,
        "model.kernels.dropout_attention_impl": args.dropout_impl,
        **{f"model.{model_path(field)}": value
           for field, value in {**model_choice_fields(args), **kernel_lever_fields(args)}.items()},
        "model.scan_layers": args.scan, "model.remat_policy": args.remat,
        "model.vocab_size": args.vocab_size, "model.vocab_pad_multiple": args.vocab_pad,
        **({"model.num_hidden_layers": args.layers} if args.layers else {}),
        f"parallel.mesh.{mesh}": -1, f"parallel.mesh.{other}": 1,
        "data.source": args.source, "data.max_seq_length": args.seq_len,
        "data.max_predictions_per_seq": masked_positions(args.seq_len),
        "global_batch_size": args.batch_size, "num_train_steps": args.steps,
        "optimizer.warmup_steps": 10, "optimizer.decay_steps": 100_000,
        "log_every": args.log_every, "eval_steps": 0,
        "checkpoint.every_steps": 10 * args.steps, "progress_bar": False,
        "peak_tflops": peak,
    }
    if args.source == "materialized":
        values["data.directory"] = data_dir
    return [f"--config.{k}={v}" for k, v in values.items()]


def steady_state(workdir: str) -> dict:
    """Median and spread of ``seq_per_sec`` over the logged train intervals after the first."""
    from bert_jax.runs.metrics import read_metrics

    train = [r for r in read_metrics(workdir) if "seq_per_sec" in r]
    used = train[1:]
    rates = [r["seq_per_sec"] for r in used]
    return {"loop_seq_per_s": statistics.median(rates),
            "loop_seq_per_s_intervals": rates,
            "loop_mfu": statistics.median(r["mfu"] for r in used) if "mfu" in used[0] else None,
            "loop_final_loss": train[-1]["loss"], "loop_skipped_steps": train[-1].get(
                "skipped_steps")}


def main(argv=None) -> dict:
    args = parse_args(argv)
    args.out = results_file(args.out, "step")
    apply_process_levers(args)
    from bert_jax.training.config import load_config
    from bert_jax.training.loop import train_and_evaluate

    tmp = tempfile.mkdtemp(prefix="bench_loop_")
    try:
        data_dir = os.path.join(tmp, "data")
        if args.source == "materialized":
            write_materialized(data_dir, args.steps, args.batch_size, args.seq_len,
                               masked_positions(args.seq_len), args.vocab_size)
        peak = matmul_peak_tflops(args.peak_size)
        variant = "bert_large_phase1" if args.model == "large" else "bert_base_phase1"
        config = load_config(f"{EXPERIMENTS}:{variant}", loop_overrides(args, data_dir, peak))
        workdir = args.workdir or os.path.join(tmp, "workdir")
        train_and_evaluate(config, workdir)
        record = {**environment(), "task": "pretrain_loop", "model": args.model,
                  "seq_len": args.seq_len, "batch_size": args.batch_size,
                  "source": args.source, "steps": args.steps, "log_every": args.log_every,
                  "attention": args.attention, "attention_dropout": args.attention_dropout,
                  "dropout_impl": args.dropout_impl, **model_choice_record(args),
                  **kernel_lever_record(args),
                  "scan": args.scan, "remat": args.remat,
                  "vocab_pad": args.vocab_pad, "xla_flag_preset": args.xla_flags,
                  "mesh": args.mesh, "tag": args.tag, "matmul_peak_tflops": peak,
                  **steady_state(workdir),
                  "loop_peak_memory_gib": peak_memory_gib()}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.compare_step:
        from bench import pretrain as bench_pretrain

        step_argv = [a for a in (argv if argv is not None else sys.argv[1:])
                     if a != "--compare-step"]
        step_argv = _drop_loop_options(step_argv) + ["--out", os.devnull]
        step = bench_pretrain.main(step_argv)
        record.update(step_seq_per_s=step["seq_per_s"],
                      loop_over_step=record["loop_seq_per_s"] / step["seq_per_s"])
    write_result(args.out, record)
    return record


def _drop_loop_options(argv: list[str]) -> list[str]:
    """argv minus the options the step benchmark does not take (and their values)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in ("--log-every", "--source", "--workdir", "--out", "--steps"):
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


if __name__ == "__main__":
    main()
