"""The BERT family at equal tokens on one device: pretrain, fine-tune, compare.

From a plain-text corpus: trains one SentencePiece tokenizer, creates NSP (with phrase/entity
annotations), SOP and FULL-SENTENCES data, then pretrains BERT (MLM + NSP), RoBERTa-style
(MLM, dynamic masking, full sentences), SpanBERT (span masking + SBO), ERNIE-style (knowledge
masking + NSP), ELECTRA (generator 1/4 width + RTD) and ALBERT (SOP, shared layers,
factorised embeddings) with the same encoder size, batch, sequence length and number of steps
(the same tokens), and a DistilBERT student (half the layers) distilled from the BERT run for
the same steps. The steps come from the budget: a short BERT probe measures steps per second,
and each of the seven runs gets an equal share of ``--budget-minutes`` at that rate (variants
that cost more per token than BERT, ELECTRA above all, take longer; the table shows each
run's wall time). Every model is then fine-tuned on the same GLUE tasks with several seeds
(dev = a seeded 10% of train, as ``experiments/glue.py`` does without a dev file).

  python -m bench variants --corpus /work/shared/data/pretrain-corpus \
      --glue /work/shared/data/glue --out bench_out/variants --budget-minutes 2      # GPU
  python -m bench variants --corpus tiny_corpus --glue tiny_glue --out /tmp/v \
      --budget-minutes 0.3 --model tiny --vocab-size 400 --batch-size 16 --seq-len 64 \
      --tasks mrpc --seeds 2 --max-train-examples 64 --epochs 1                    # CPU smoke

Writes OUT/variants.jsonl (one record per variant: pretraining steps, wall time, last
losses, and per task the seeds' dev scores with mean and std), OUT/variants.md (the table)
and OUT/variants.png (the scores with their spread).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

from bench.common import REPO

EXPERIMENT = os.path.join(REPO, "experiments", "pretrain.py")
GLUE_EXPERIMENT = os.path.join(REPO, "experiments", "glue.py")
TASK_DIRS = {"mrpc": "MRPC", "cola": "CoLA", "sst2": "SST-2", "stsb": "STS-B", "rte": "RTE"}
SKIP_FILES = ("MANIFEST.tsv", "README", "cats.txt", "stopwords")

# variant -> (data kind, pretraining overrides); every run shares the common overrides.
VARIANTS = {
    "bert": ("nsp", ["--config.objective=nsp"]),
    "roberta": ("full", ["--config.objective=mlm"]),
    "spanbert": ("full", ["--config.objective=sbo", "--config.data.masking=span"]),
    "ernie": ("nsp", ["--config.objective=nsp", "--config.data.masking=knowledge"]),
    "electra": ("full", ["--config.objective=electra", "--config.electra.generator_fraction=0.25"]),
    "albert": ("sop", ["--config.objective=sop", "--config.model.share_layers=true"]),
    "distilbert": ("full", ["--config.objective=distill"]),
}
DATA_MODES = {"nsp": ["--mode", "nsp", "--knowledge-units"], "sop": ["--mode", "sop"],
              "full": ["--mode", "full_sentences"]}


def _log(message: str) -> None:
    print(f"[variants {time.strftime('%H:%M:%S')}] {message}", flush=True)


def _cli(args: list[str]) -> None:
    from bert_jax.cli import main

    rc = main(args)
    if rc:
        sys.exit(f"bert-jax {' '.join(args)}: exit {rc}")


def corpus_files(corpus: str, max_mb: float) -> list[str]:
    """The corpus' text files in sorted order, up to ``max_mb`` megabytes."""
    files = []
    for root, _, names in os.walk(corpus):
        files += [os.path.join(root, n) for n in names if not n.startswith(SKIP_FILES)]
    files.sort()
    if not files:
        sys.exit(f"--corpus {corpus}: no text files")
    chosen, total = [], 0
    for f in files:
        if chosen and total + os.path.getsize(f) > max_mb * 1e6:
            break
        chosen.append(f)
        total += os.path.getsize(f)
    return chosen


def prepare(args, work: str) -> dict[str, str]:
    """Tokenizer and the three kinds of pretraining data (reused when already there)."""
    files = corpus_files(args.corpus, args.max_corpus_mb)
    tokenizer = os.path.join(work, "tokenizer")
    if not os.path.exists(os.path.join(tokenizer, "tokenizer.json")):
        _log(f"tokenizer: {len(files)} files, vocab {args.vocab_size}")
        _cli(["train-tokenizer", "--input", *files, "--output", tokenizer, "--vocab-size",
              str(args.vocab_size), "--model-type", "unigram", "--seed", "0"])
    data = {"tokenizer": tokenizer}
    for kind, flags in DATA_MODES.items():
        directory = os.path.join(work, f"data_{kind}")
        if not os.path.exists(os.path.join(directory, "metadata.json")):
            _log(f"pretraining data: {kind}")
            _cli(["create-pretraining-data", "--input", *files, "--tokenizer", tokenizer,
                  "--output-dir", directory, "--max-seq-length", str(args.seq_len),
                  "--num-shards", "4", "--num-workers", str(args.num_workers),
                  "--no-progress", *flags])
        data[kind] = directory
    return data


def common_overrides(args, steps: int, data_dir: str, tokenizer: str) -> list[str]:
    preds = max(1, round(args.seq_len * 0.15))
    return [f"--config.model.preset={args.model}",
            f"--config.model.max_position_embeddings={args.seq_len}",
            f"--config.model.dtype={args.dtype}",
            "--config.data.source=tfrecord", f"--config.data.directory={data_dir}",
            f"--config.data.tokenizer={tokenizer}",
            f"--config.data.max_seq_length={args.seq_len}",
            f"--config.data.max_predictions_per_seq={preds}",
            f"--config.data.shuffle_buffer={args.shuffle_buffer}",
            f"--config.global_batch_size={args.batch_size}",
            f"--config.num_train_steps={steps}",
            f"--config.optimizer.learning_rate={args.learning_rate}",
            f"--config.optimizer.warmup_steps={max(1, steps // 10)}",
            f"--config.checkpoint.every_steps={steps}", "--config.checkpoint.keep=1",
            f"--config.log_every={max(1, min(50, steps // 5))}", "--config.eval_steps=0",
            "--config.progress_bar=false"]


def _metrics(workdir: str) -> list[dict]:
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def pretrain(args, name: str, workdir: str, steps: int, data: dict, teacher: str | None
             ) -> dict:
    kind, overrides = VARIANTS[name]
    extra = []
    if name == "albert":
        extra.append(f"--config.model.embedding_size={args.albert_embedding_size}")
    if name == "distilbert":
        extra.append(f"--config.distill.teacher={teacher}")
    seconds_file = os.path.join(workdir, "bench_seconds.json")
    if not os.path.exists(seconds_file):
        _log(f"pretrain {name}: {steps} steps")
        start = time.perf_counter()
        _cli(["pretrain", "--config", f"{EXPERIMENT}:tiny", "--workdir", workdir,
              *common_overrides(args, steps, data[kind], data["tokenizer"]), *overrides,
              *extra])
        with open(seconds_file, "w", encoding="utf-8") as f:
            json.dump({"seconds": round(time.perf_counter() - start, 1)}, f)
    with open(seconds_file, encoding="utf-8") as f:
        seconds = json.load(f)["seconds"]
    records = [r for r in _metrics(workdir) if "loss" in r]
    last = records[-1] if records else {}
    keep = ("loss", "mlm_loss", "mlm_accuracy", "nsp_loss", "sbo_loss", "rtd_loss",
            "rtd_accuracy", "kd_loss", "cos_loss", "seq_per_sec")
    with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
        model = json.load(f)["config"]
    return {"pretrain_steps": steps, "pretrain_seconds": seconds,
            "layers": model["num_hidden_layers"], "hidden": model["hidden_size"],
            "first_loss": records[0]["loss"] if records else None,
            **{f"last_{k}": last[k] for k in keep if k in last}}


def probe_steps_per_second(args, data: dict, work: str) -> float:
    """Steady BERT steps per second from a short run (its second logging interval)."""
    workdir = os.path.join(work, "probe")
    steps = args.probe_steps
    if not _metrics(workdir):
        _cli(["pretrain", "--config", f"{EXPERIMENT}:tiny", "--workdir", workdir,
              *common_overrides(args, steps, data["nsp"], data["tokenizer"]),
              f"--config.log_every={steps // 2}", "--config.objective=nsp"])
    rates = [r["steps_per_sec"] for r in _metrics(workdir) if "steps_per_sec" in r]
    return rates[-1]


def finetune(args, name: str, init: str, task: str, seed: int, work: str) -> float:
    workdir = os.path.join(work, "finetune", f"{name}_{task}_seed{seed}")
    metrics_path = os.path.join(workdir, "metrics.json")
    if not os.path.exists(metrics_path):
        from bert_jax.tasks.config import load_config
        from bert_jax.tasks.finetune import finetune as run_finetune

        config = load_config(f"{GLUE_EXPERIMENT}:{task}", [
            f"--config.data_dir={os.path.join(args.glue, TASK_DIRS[task])}",
            f"--config.init_checkpoint={init}", f"--config.seed={seed}",
            f"--config.epochs={args.epochs}",
            f"--config.max_train_examples={args.max_train_examples}",
            f"--config.max_seq_length={args.seq_len}",
            f"--config.optimizer.learning_rate={args.finetune_learning_rate}",
            f"--config.model.dtype={args.dtype}", "--config.log_every=1000"])
        run_finetune(config, workdir)
    with open(metrics_path, encoding="utf-8") as f:
        result = json.load(f)
    split, metric = result["best"]["metric"].split("/")
    return float(result["final"][split][metric]), f"{metric}"


def write_table(records: list[dict], tasks: list[str], out: str, header: str) -> str:
    lines = [header, "",
             "| variant | layers x hidden | pretrain steps | pretrain s | last loss (first) | "
             + " | ".join(f"{t} (mean ± std)" for t in tasks) + " |",
             "| --- | --- | --- | --- | --- | " + " | ".join("---" for _ in tasks) + " |"]
    for r in records:
        scores = []
        for t in tasks:
            s = r["tasks"][t]
            scores.append(f"{100 * s['mean']:.1f} ± {100 * s['std']:.1f} {s['metric']}")
        first = f"{r['first_loss']:.2f}" if r.get("first_loss") is not None else "-"
        last = f"{r['last_loss']:.2f}" if r.get("last_loss") is not None else "-"
        lines.append(f"| {r['variant']} | {r['layers']} x {r['hidden']} | "
                     f"{r['pretrain_steps']} | {r['pretrain_seconds']} | {last} ({first}) | "
                     + " | ".join(scores) + " |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "variants.md"), "w", encoding="utf-8") as f:
        f.write(text)
    return text


def plot(records: list[dict], tasks: list[str], out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.6 * len(records) + 2, 3.5))
    width = 0.8 / len(tasks)
    for i, t in enumerate(tasks):
        xs = [j + i * width for j in range(len(records))]
        ax.bar(xs, [100 * r["tasks"][t]["mean"] for r in records], width,
               yerr=[100 * r["tasks"][t]["std"] for r in records], capsize=3,
               label=f"{t} ({records[0]['tasks'][t]['metric']})")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(records))])
    ax.set_xticklabels([r["variant"] for r in records])
    ax.set_ylabel("dev score x 100 (mean ± std over seeds)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "variants.png"), dpi=120)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m bench variants", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True, help="directory of plain-text files")
    p.add_argument("--glue", required=True, help="GLUE root with MRPC/, CoLA/, ... train.tsv")
    p.add_argument("--out", required=True)
    p.add_argument("--budget-minutes", type=float, required=True,
                   help="pretraining wall budget of all seven runs together (BERT's rate)")
    p.add_argument("--tasks", default="mrpc,cola")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--model", default="mini", help="bert_jax.config preset of every encoder")
    p.add_argument("--albert-embedding-size", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--max-corpus-mb", type=float, default=4.0)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--shuffle-buffer", type=int, default=2000)
    p.add_argument("--probe-steps", type=int, default=40)
    p.add_argument("--steps", type=int, default=0, help="fixed steps (0: from the budget)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--max-train-examples", type=int, default=2000)
    p.add_argument("--finetune-learning-rate", type=float, default=1e-4)
    p.add_argument("--dtype", default=None, help="compute dtype (default: bfloat16 on GPU, "
                                                 "float32 elsewhere)")
    p.add_argument("--num-workers", type=int, default=min(8, os.cpu_count() or 1))
    args = p.parse_args(argv)
    unknown = [t for t in args.tasks.split(",") if t not in TASK_DIRS]
    if unknown:
        p.error(f"--tasks: unknown {unknown}; choose from {sorted(TASK_DIRS)}")
    bad = [v for v in args.variants.split(",") if v not in VARIANTS]
    if bad:
        p.error(f"--variants: unknown {bad}; choose from {list(VARIANTS)}")
    if "distilbert" in args.variants.split(",") and "bert" not in args.variants.split(","):
        p.error("--variants: distilbert needs bert (its teacher)")
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import jax

    if args.dtype is None:
        args.dtype = "bfloat16" if jax.default_backend() == "gpu" else "float32"
    out = os.path.abspath(args.out)
    work = os.path.join(out, "work")
    os.makedirs(work, exist_ok=True)
    # The fine-tuning runs of one task differ only in their seed: the same programs, compiled
    # once and read back from this cache by the other seeds and variants.
    jax.config.update("jax_compilation_cache_dir", os.path.join(work, "jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    started = time.perf_counter()
    data = prepare(args, work)
    prep_seconds = time.perf_counter() - started
    variants = args.variants.split(",")
    steps = args.steps
    if steps <= 0:
        rate = probe_steps_per_second(args, data, work)
        steps = max(10, int(args.budget_minutes * 60 / len(variants) * rate))
        _log(f"probe: BERT at {rate:.2f} steps/s -> {steps} steps per variant")
    tasks = args.tasks.split(",")
    records = []
    for name in variants:
        workdir = os.path.join(work, "pretrain", name)
        record = {"variant": name, **pretrain(args, name, workdir, steps, data,
                                              os.path.join(work, "pretrain", "bert"))}
        record["tasks"] = {}
        for task in tasks:
            scores = []
            for seed in range(args.seeds):
                value, metric = finetune(args, name, workdir, task, seed, work)
                scores.append(value)
            record["tasks"][task] = {
                "metric": metric, "scores": scores, "mean": statistics.fmean(scores),
                "std": statistics.stdev(scores) if len(scores) > 1 else 0.0}
            _log(f"{name} {task}: {record['tasks'][task]['mean']:.4f} "
                 f"± {record['tasks'][task]['std']:.4f}")
        records.append(record)
    total = time.perf_counter() - started
    device = jax.devices()[0].device_kind
    command = " ".join(sys.argv[1:] if argv is None else argv)
    header = (f"Device: {device} ({jax.default_backend()}), jax {jax.__version__}, Python "
              f"{platform.python_version()}; model preset {args.model}, seq {args.seq_len}, "
              f"batch {args.batch_size}, {steps} steps each "
              f"({steps * args.batch_size * args.seq_len:,} tokens); fine-tuning: "
              f"{args.seeds} seeds, {args.epochs} epochs, at most {args.max_train_examples} "
              f"train examples. Data preparation {prep_seconds:.0f} s, total {total:.0f} s.\n"
              f"Command: python -m bench variants {command}")
    with open(os.path.join(out, "variants.jsonl"), "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps({**r, "device": device, "steps": steps,
                                "total_seconds": round(total, 1)}) + "\n")
    print(write_table(records, tasks, out, header))
    plot(records, tasks, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
