"""FP8 matmuls (``model.fp8``): step throughput against bf16 and transformers, and MLM accuracy
at equal steps.

Throughput: for each shape, the pretraining step of ``bench step pretrain`` (the loop's own
jitted step, bf16 compute, fp32 master weights, random ids) with ``model.fp8`` off and on,
and Hugging Face transformers (``bench peers transformers``: bf16 autocast, SDPA,
torch.compile, fused AdamW) on the same workload. The transformers runs go first, each in
its own process, so that JAX's memory pool never shares the GPU with PyTorch's.

Parity: the small end-to-end pretraining of ``bench variants`` (its preset, batch, sequence
length, learning rate and warmup; MLM + NSP) on the prepared, materialized batches of one
(data, masking) pair, trained for the same steps in bf16 and with FP8, the last
``--eval-batches`` batches held out. Reported: the held-out MLM accuracy of each (the fp8
model evaluated with bf16 matmuls, and also through its FP8 forward pass with its scaling
state) and the difference in points (target: within 0.5).

  python -m bench fp8 --prepared .gpu/variants_prep --out bench_out/fp8            # one GPU
  python -m bench fp8 --parts parity --prepared .gpu/variants_prep --out bench_out/fp8
  python -m bench fp8 --shapes tiny/32:8 --no-peer --batches-dir DIR --vocab-size 100 \\
      --model tiny --layers 1 --parity-steps 4 --eval-batches 2 --steps 1 --repeats 1 \\
      --devices 1 --out /tmp/f                                                     # CPU

``--prepared`` is the folder ``python -m bench variants --prepare-only DIR`` writes
(``prepared.json`` + ``variants_prep.tar.xz``, no tensorflow needed to read it);
``--batches-dir`` a materialized batch folder (``bert-jax materialize-batches``) instead.
Records go to OUT/fp8.jsonl, the tables to OUT/fp8.md (one part alone: OUT/fp8_PART.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

from bench.common import REPO, add_out_argument, results_file, run_suite, write_result

EXPERIMENT = os.path.join(REPO, "experiments", "pretrain.py")
# shape name -> (preset, sequence length, global batch): the batches of docs/performance.md
SHAPES = {"base/128": ("base", 128, 256), "large/128": ("large", 128, 256),
          "large/512": ("large", 512, 32)}


def parse_shape(spec: str) -> tuple[str, int, int]:
    """``model/seq[:batch]`` (batch default: SHAPES', else 32) -> (preset, seq, batch)."""
    name, _, batch = spec.partition(":")
    try:
        model, seq = name.split("/")
        default = SHAPES.get(name, (model, int(seq), 32))[2]
        return model, int(seq), int(batch) if batch else default
    except ValueError:
        raise argparse.ArgumentTypeError(f"{spec!r}: expected MODEL/SEQ[:BATCH]") from None


def parse_args(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench fp8",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="throughput,parity",
                    help="comma-separated: throughput, parity")
    ap.add_argument("--shapes", default=",".join(SHAPES),
                    help="MODEL/SEQ[:BATCH],... for the throughput part")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-peer", action="store_true", help="skip transformers")
    ap.add_argument("--devices", type=int, default=0,
                    help="throughput: use the first N devices (0: all)")
    ap.add_argument("--peak-size", type=int, default=0,
                    help="matmul size of the measured bf16 peak (0: bench step pretrain's)")
    data = ap.add_mutually_exclusive_group()
    data.add_argument("--prepared", metavar="DIR",
                      help="bench variants --prepare-only folder (the parity data)")
    data.add_argument("--batches-dir", metavar="DIR",
                      help="a materialized batch folder (needs --vocab-size)")
    ap.add_argument("--combo", default="nsp_token",
                    help="--prepared: the (data, masking) pair to train on")
    ap.add_argument("--unpack-dir", help="--prepared: where the archive is unpacked")
    ap.add_argument("--vocab-size", type=int, help="--batches-dir: the tokenizer's vocabulary")
    ap.add_argument("--model", help="parity preset (default: the prepared one, else mini)")
    ap.add_argument("--layers", type=int, default=0,
                    help="encoder layers of every model, both parts (0: the presets')")
    ap.add_argument("--parity-steps", type=int, default=0,
                    help="training steps of each parity run (0: the prepared steps, at most "
                         "the batches not held out, cycled)")
    ap.add_argument("--eval-batches", type=int, default=24, help="held-out batches")
    ap.add_argument("--learning-rate", type=float, default=1e-3)
    ap.add_argument("--seeds", default="0",
                    help="comma-separated initialisation seeds: a bf16 and an FP8 run each "
                         "(two or more also give bf16's seed-to-seed spread)")
    ap.add_argument("--amax-history", type=int, default=0,
                    help="model.fp8_amax_history of the FP8 runs (0: the config's)")
    add_out_argument(ap)
    args = ap.parse_args(argv)
    args.parts = args.parts.split(",")
    if unknown := set(args.parts) - {"throughput", "parity"}:
        ap.error(f"--parts: unknown {sorted(unknown)}")
    args.shapes = [parse_shape(s) for s in args.shapes.split(",")]
    try:
        args.seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        ap.error(f"--seeds {args.seeds!r}: expected comma-separated integers")
    if "parity" in args.parts and not (args.prepared or args.batches_dir):
        ap.error("the parity part needs --prepared DIR or --batches-dir DIR")
    if args.batches_dir and not args.vocab_size:
        ap.error("--batches-dir needs --vocab-size")
    return args


def _log(message: str) -> None:
    print(f"[fp8] {message}", file=sys.stderr, flush=True)


# ---- throughput --------------------------------------------------------------------------
def peer_rates(args, out_dir: str) -> dict[tuple, dict]:
    """transformers' records per (model, seq, batch), each in its own process."""
    path = os.path.join(out_dir, "peers.jsonl")
    rates = {}
    for model, seq, batch in args.shapes:
        _log(f"transformers {model}/{seq} batch {batch}")
        before = os.path.getsize(path) if os.path.exists(path) else 0
        done = run_suite(["peers", "transformers", "--task", "pretrain", "--model", model,
                          "--seq-len", str(seq), "--batch-size", str(batch), "--steps",
                          str(args.steps), "--repeats", str(args.repeats), "--out", path])
        if done.returncode == 0 and os.path.exists(path) and os.path.getsize(path) > before:
            with open(path, encoding="utf-8") as f:
                rates[model, seq, batch] = [json.loads(line) for line in f][-1]
    return rates


def throughput(args, out_dir: str) -> list[dict]:
    from bench import pretrain

    peers = {} if args.no_peer else peer_rates(args, out_dir)
    step_file = os.path.join(out_dir, "step.jsonl")
    rows = []
    for model, seq, batch in args.shapes:
        row = {"part": "throughput", "model": model, "seq_len": seq, "batch_size": batch}
        for mode in ("bf16", "fp8"):
            _log(f"bert-jax {mode} {model}/{seq} batch {batch}")
            record = pretrain.main(["--model", model, "--seq-len", str(seq), "--batch-size",
                                    str(batch), "--steps", str(args.steps), "--repeats",
                                    str(args.repeats), "--warmup", str(args.warmup),
                                    "--peak-size", str(args.peak_size),
                                    "--devices", str(args.devices),
                                    "--layers", str(args.layers),
                                    "--tag", f"fp8-suite-{mode}", "--out", step_file,
                                    *(["--fp8"] if mode == "fp8" else [])])
            row[f"{mode}_seq_per_s"] = record["seq_per_s"]
            row[f"{mode}_mfu"] = record["mfu"]
            row[f"{mode}_peak_memory_gib"] = record["peak_memory_gib"]
            row[f"{mode}_loss"] = record["loss"]
            row.setdefault("layers", record["layers"])
            row.setdefault("device", record.get("device"))
            row.setdefault("versions", {k: record.get(k) for k in ("jax", "flax", "jaxlib")
                                        if k in record})
        row["fp8_over_bf16"] = row["fp8_seq_per_s"] / row["bf16_seq_per_s"]
        peer = peers.get((model, seq, batch))
        if peer is not None:
            row["transformers_seq_per_s"] = peer["seq_per_s"]
            row["transformers_version"] = peer["version"]
            row["torch_version"] = peer["torch"]
            row["fp8_over_transformers"] = row["fp8_seq_per_s"] / peer["seq_per_s"]
            row["bf16_over_transformers"] = row["bf16_seq_per_s"] / peer["seq_per_s"]
        rows.append(row)
    return rows


# ---- parity ------------------------------------------------------------------------------
def parity_data(args) -> tuple[str, int, str, str]:
    """(materialized batch folder, vocabulary size, preset, tokenizer folder or "")."""
    if args.batches_dir:
        return args.batches_dir, args.vocab_size, args.model or "mini", ""
    from bench import variants_prep

    prepared = variants_prep.read_prepared(args.prepared)
    if args.combo not in prepared["combos"]:
        sys.exit(f"--prepared {args.prepared}: no combination {args.combo!r} (has "
                 f"{', '.join(prepared['combos'])})")
    target = args.unpack_dir or os.path.join(
        tempfile.gettempdir(), f"bert_jax_variants_{prepared['archive_bytes']}")
    _log(f"unpack {args.prepared} to {target}")
    paths = variants_prep.unpack(args.prepared, target)
    if not args.parity_steps:
        args.parity_steps = prepared["steps"]
    return (paths[args.combo], prepared["vocab_size"], args.model or prepared["model"],
            paths["tokenizer"])


def parity_config(args, directory: str, manifest: dict, model: str, vocab: int, steps: int,
                  fp8: bool):
    """The pretraining config of one ``bench variants`` BERT run (MLM + NSP), fp8 on or off."""
    from types import SimpleNamespace

    import jax

    from bert_jax.training.config import load_config

    dtype = "bfloat16" if jax.default_backend() == "gpu" else "float32"
    settings = SimpleNamespace(model=model, seq_len=manifest["seq_len"], dtype=dtype,
                               shuffle_buffer=manifest.get("shuffle_buffer", 0) or 1,
                               batch_size=manifest["batch_size"],
                               learning_rate=args.learning_rate)
    return load_config(f"{EXPERIMENT}:tiny", [
        *_run_overrides(settings, steps, directory),
        "--config.objective=nsp", f"--config.model.vocab_size={vocab}",
        f"--config.model.fp8={'true' if fp8 else 'false'}",
        *([f"--config.model.num_hidden_layers={args.layers}"] if args.layers else []),
        *([f"--config.model.fp8_amax_history={args.amax_history}"]
          if fp8 and args.amax_history else [])])


def _run_overrides(settings, steps: int, data_dir: str) -> list[str]:
    """The overrides of the parity run: the prepared batches (materialized, repeated), the
    model's size and the schedule (10% warmup), checkpoints only at the end, no evaluation."""
    return [f"--config.model.preset={settings.model}",
            f"--config.model.max_position_embeddings={settings.seq_len}",
            f"--config.model.dtype={settings.dtype}",
            "--config.data.source=materialized", f"--config.data.directory={data_dir}",
            "--config.data.tokenizer=", "--config.data.repeat=true",
            f"--config.data.max_seq_length={settings.seq_len}",
            f"--config.data.max_predictions_per_seq={max(1, round(settings.seq_len * 0.15))}",
            f"--config.data.shuffle_buffer={settings.shuffle_buffer}",
            f"--config.global_batch_size={settings.batch_size}",
            f"--config.num_train_steps={steps}",
            f"--config.optimizer.learning_rate={settings.learning_rate}",
            f"--config.optimizer.warmup_steps={max(1, steps // 10)}",
            f"--config.checkpoint.every_steps={steps}", "--config.checkpoint.keep=1",
            f"--config.log_every={max(1, min(50, steps // 5))}", "--config.eval_steps=0",
            "--config.progress_bar=false"]


def parity_run(args, directory: str, vocab: int, model: str, fp8: bool, seed: int = 0
               ) -> dict:
    """Trains ``args.parity_steps`` steps on the batches before the held-out ones (cycled),
    then evaluates on the held-out ones; ``seed`` draws the initial parameters and the
    dropout masks (the batches are the same for every seed)."""
    import jax
    import numpy as np

    from bench.pretrain import select_mesh
    from bert_jax.data.materialize import MaterializedBatches
    from bert_jax.runs.state import split_fp8_state
    from bert_jax.training import config as config_lib
    from bert_jax.training.setup import build_training
    from bert_jax.training.steps import default_sums_fn, summarize

    reader = MaterializedBatches(directory)
    manifest, total = reader.manifest, len(reader)
    train_batches = total - args.eval_batches
    if train_batches < 1:
        sys.exit(f"{directory}: {total} batches, --eval-batches {args.eval_batches} leaves "
                 "none to train on")
    steps = args.parity_steps or train_batches
    config = parity_config(args, directory, manifest, model, vocab, steps, fp8)
    model_cfg = config_lib.model_config(config)
    mesh = select_mesh(config, 1)
    training = build_training(config, model_cfg, mesh)
    state = training.init_state(jax.random.PRNGKey(seed))
    rng = jax.random.fold_in(jax.random.PRNGKey(1), seed)
    losses, started = [], time.perf_counter()
    for step in range(steps):
        if step % train_batches == 0:
            reader = MaterializedBatches(directory)
        state, metrics = training.train_step(state, training.global_batch(next(reader)), rng)
        if step % 10 == 0 or step >= steps - 10:
            losses.append((step, float(metrics["loss"])))
    jax.block_until_ready(state)
    seconds = time.perf_counter() - started

    fp8_state = split_fp8_state(state.opt_state)[1]
    sums_fn = default_sums_fn(training.model, config_lib.pair_head(config))
    fp8_eval = jax.jit(lambda p, s, b: sums_fn(p, b, jax.random.PRNGKey(0), True,
                                               fp8_scales=s))
    held_out = MaterializedBatches(directory, start_step=train_batches)
    totals: dict[str, dict] = {"compute_dtype": {}, "fp8_forward": {}}
    for batch in held_out:
        batch = training.global_batch(batch)
        parts = {"compute_dtype": training.eval_step(state.params, batch)}
        if fp8_state is not None:
            parts["fp8_forward"] = fp8_eval(state.params, fp8_state["scale"], batch)
        for name, sums in parts.items():
            for key, value in jax.device_get(sums).items():
                totals[name][key] = totals[name].get(key, 0.0) + float(np.asarray(value))
    record = {"part": "parity", "mode": "fp8" if fp8 else "bf16", "seed": seed, "model": model,
              "layers": model_cfg.num_hidden_layers,
              "seq_len": manifest["seq_len"], "batch_size": manifest["batch_size"],
              "steps": steps, "train_batches": train_batches,
              "held_out_batches": args.eval_batches, "dtype": model_cfg.dtype,
              **({"amax_history": model_cfg.fp8_amax_history} if fp8 else {}),
              "train_seconds": round(seconds, 1), "first_loss": losses[0][1],
              "last_loss": statistics.fmean(v for s, v in losses if s >= steps - 10)}
    for name, sums in totals.items():
        if sums:
            metrics = summarize(sums)
            suffix = "" if name == "compute_dtype" else "_fp8_forward"
            record[f"heldout_mlm_accuracy{suffix}"] = float(metrics["mlm_accuracy"])
            record[f"heldout_mlm_loss{suffix}"] = float(metrics["mlm_loss"])
    return record


def parity(args) -> list[dict]:
    """A bf16 and an FP8 run for each of ``args.seeds``, then the summary: FP8 − bf16 in
    points of held-out MLM accuracy, per seed and their mean, and (two or more seeds) bf16's
    own spread between seeds, the noise the difference is read against."""
    directory, vocab, model, _ = parity_data(args)
    records = []
    for seed in args.seeds:
        for fp8 in (False, True):
            _log(f"parity run {'fp8' if fp8 else 'bf16'} seed {seed}: {model}, "
                 f"{args.parity_steps or 'all'} steps")
            records.append(parity_run(args, directory, vocab, model, fp8, seed))
    return [*records, parity_summary(records)]


def parity_summary(records: list[dict]) -> dict:
    """FP8 − bf16 held-out MLM accuracy in points for each seed of the parity ``records``
    (one bf16 and one FP8 run a seed) and their mean; with two or more seeds also bf16's
    spread between seeds."""
    accuracy = {(r["mode"], r["seed"]): r["heldout_mlm_accuracy"] for r in records}
    seeds = sorted({seed for _, seed in accuracy})
    if missing := [f"{mode} seed {s}" for s in seeds for mode in ("bf16", "fp8")
                   if (mode, s) not in accuracy]:
        raise ValueError(f"parity records lack {', '.join(missing)}")
    points = [100 * (accuracy["fp8", s] - accuracy["bf16", s]) for s in seeds]
    bf16 = [accuracy["bf16", s] for s in seeds]
    mean = statistics.fmean(points)
    summary = {"part": "parity_summary", "seeds": seeds,
               "bf16_heldout_mlm_accuracy": statistics.fmean(bf16),
               "fp8_heldout_mlm_accuracy": statistics.fmean(accuracy["fp8", s] for s in seeds),
               "fp8_minus_bf16_points_per_seed": points, "fp8_minus_bf16_points": mean,
               "within_half_point": abs(mean) <= 0.5}
    if len(seeds) > 1:
        summary["bf16_seed_spread_points"] = 100 * (max(bf16) - min(bf16))
    return summary


# ---- report ------------------------------------------------------------------------------
def _fmt(value, digits=0) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def tables(records: list[dict], header: str) -> str:
    lines = [header, ""]
    rows = [r for r in records if r["part"] == "throughput"]
    if rows:
        lines += ["| shape | batch | bf16 seq/s | fp8 seq/s | fp8 / bf16 | transformers seq/s "
                  "| fp8 / transformers | bf16 MFU | fp8 peak GiB | bf16 peak GiB |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(
                f"| {r['model']}/{r['seq_len']} | {r['batch_size']} | "
                f"{_fmt(r['bf16_seq_per_s'])} | {_fmt(r['fp8_seq_per_s'])} | "
                f"{r['fp8_over_bf16']:.2f}x | {_fmt(r.get('transformers_seq_per_s'))} | "
                + (f"{r['fp8_over_transformers']:.2f}x" if "fp8_over_transformers" in r
                   else "–")
                + f" | {r['bf16_mfu']:.1%} | {_fmt(r['fp8_peak_memory_gib'], 1)} | "
                f"{_fmt(r['bf16_peak_memory_gib'], 1)} |")
        lines.append("")
    runs = [r for r in records if r["part"] == "parity"]
    if runs:
        lines += ["| run | steps | first loss | last loss | held-out MLM acc | "
                  "held-out MLM acc, FP8 forward | train s |", "|---|---|---|---|---|---|---|"]
        for r in runs:
            fwd = r.get("heldout_mlm_accuracy_fp8_forward")
            lines.append(f"| {r['mode']} ({r['model']}, {r['dtype']}, seed {r['seed']}) | "
                         f"{r['steps']} | "
                         f"{r['first_loss']:.3f} | {r['last_loss']:.3f} | "
                         f"{100 * r['heldout_mlm_accuracy']:.2f}% | "
                         f"{'–' if fwd is None else f'{100 * fwd:.2f}%'} | "
                         f"{r['train_seconds']:.0f} |")
        summary = next(r for r in records if r["part"] == "parity_summary")
        seeds = len(summary["seeds"])
        spread = summary.get("bf16_seed_spread_points")
        lines += ["", f"fp8 − bf16: {summary['fp8_minus_bf16_points']:+.2f} points of held-out "
                  f"MLM accuracy{f' (mean of {seeds} seeds)' if seeds > 1 else ''} "
                  f"({'within' if summary['within_half_point'] else 'outside'} the 0.5-point "
                  "target)" + ("." if spread is None else
                               f"; bf16 between seeds: {spread:.2f} points.")]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    out_file = results_file(args.out, "fp8")
    out_dir = os.path.dirname(os.path.abspath(out_file))
    os.makedirs(out_dir, exist_ok=True)
    records = []
    if "throughput" in args.parts:
        records += throughput(args, out_dir)
    if "parity" in args.parts:
        records += parity(args)
    import jax

    command = " ".join(sys.argv[1:] if argv is None else argv)
    header = (f"Device: {jax.devices()[0].device_kind} ({jax.default_backend()}), jax "
              f"{jax.__version__}, Python {platform.python_version()}.\n"
              f"Command: python -m bench fp8 {command}")
    for record in records:
        write_result(out_file, {**record, "command": f"python -m bench fp8 {command}"})
    text = tables(records, header)
    name = "fp8.md" if len(args.parts) == 2 else f"fp8_{args.parts[0]}.md"
    with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
