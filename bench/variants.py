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

Two phases, for a GPU machine without tensorflow (docs/variants.md):

  python -m bench variants --prepare-only prep/ --corpus CORPUS --glue GLUE --out work/
      # with tensorflow: tokenizer, data, the batches of every (data, masking) pair the
      # variants use, packed into prep/ (variants_prep.tar.xz + prepared.json, ~17 MiB)
  python -m bench variants --prepared prep/ --out bench_out/variants
      # no tensorflow: unpacks to /tmp, pretrains from data.source=materialized, fine-tunes

Writes OUT/variants.jsonl (one record per variant: pretraining steps, distinct batches, wall
time, last losses, and per task the seeds' dev scores with mean and std), OUT/variants.md (the
table) and OUT/variants.png (the scores with their spread).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time

from bench.common import REPO

EXPERIMENT = os.path.join(REPO, "experiments", "pretrain.py")
GLUE_EXPERIMENT = os.path.join(REPO, "experiments", "glue.py")
TASK_DIRS = {"mrpc": "MRPC", "cola": "CoLA", "sst2": "SST-2", "stsb": "STS-B", "rte": "RTE"}
SKIP_FILES = ("MANIFEST.tsv", "README", "cats.txt", "stopwords")

# variant -> (data kind, data.masking, pretraining overrides); every run shares the common
# overrides.
VARIANTS = {
    "bert": ("nsp", "token", ["--config.objective=nsp"]),
    "roberta": ("full", "token", ["--config.objective=mlm"]),
    "spanbert": ("full", "span", ["--config.objective=sbo"]),
    "ernie": ("nsp", "knowledge", ["--config.objective=nsp"]),
    "electra": ("full", "token", ["--config.objective=electra",
                                  "--config.electra.generator_fraction=0.25"]),
    "albert": ("sop", "token", ["--config.objective=sop", "--config.model.share_layers=true"]),
    "distilbert": ("full", "token", ["--config.objective=distill"]),
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


def prepare(args, work: str, kinds=tuple(DATA_MODES)) -> dict[str, str]:
    """Tokenizer and the kinds of pretraining data (reused when already there)."""
    files = corpus_files(args.corpus, args.max_corpus_mb)
    tokenizer = os.path.join(work, "tokenizer")
    if not os.path.exists(os.path.join(tokenizer, "tokenizer.json")):
        _log(f"tokenizer: {len(files)} files, vocab {args.vocab_size}")
        _cli(["train-tokenizer", "--input", *files, "--output", tokenizer, "--vocab-size",
              str(args.vocab_size), "--model-type", "unigram", "--seed", "0"])
    data = {"tokenizer": tokenizer}
    for kind in kinds:
        flags = DATA_MODES[kind]
        directory = os.path.join(work, f"data_{kind}")
        if not os.path.exists(os.path.join(directory, "metadata.json")):
            _log(f"pretraining data: {kind}")
            _cli(["create-pretraining-data", "--input", *files, "--tokenizer", tokenizer,
                  "--output-dir", directory, "--max-seq-length", str(args.seq_len),
                  "--num-shards", "4", "--num-workers", str(args.num_workers),
                  "--no-progress", *flags])
        data[kind] = directory
    return data


def max_predictions(seq_len: int) -> int:
    return max(1, round(seq_len * 0.15))


def combos(variants: list[str]) -> dict[str, tuple[str, str]]:
    """The (data kind, masking) pairs the variants train on, by name (nsp_token, ...)."""
    from bench.variants_prep import combo_name

    return {combo_name(kind, masking): (kind, masking)
            for kind, masking, _ in (VARIANTS[v] for v in variants)}


def materialize(args, data: dict[str, str], work: str, variants: list[str]) -> dict[str, str]:
    """``args.batches`` batches of every (data kind, masking) pair, as the live pipeline of
    the pretraining run would produce them (seed 0, the run's shuffle buffer)."""
    from bert_jax.data.materialize import materialize_batches
    from bert_jax.tokenization.factory import load_tokenizer

    tokenizer = load_tokenizer(data["tokenizer"])
    out = {}
    for combo, (kind, masking) in combos(variants).items():
        directory = os.path.join(work, "materialized", combo)
        path = os.path.join(directory, "manifest.json")
        current = None
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                current = json.load(f)
        if current is None or current["steps"] != args.batches \
                or current["batch_size"] != args.batch_size:
            _log(f"materialize {combo}: {args.batches} batches of {args.batch_size}")
            materialize_batches(data[kind], directory, steps=args.batches,
                                batch_size=args.batch_size,
                                max_predictions=max_predictions(args.seq_len), seed=0,
                                tokenizer=tokenizer, shuffle_buffer=args.shuffle_buffer,
                                masking=masking, basic_fraction=0.25, progress=False)
        out[combo] = directory
    return out


def glue_files(glue: str, tasks: list[str]) -> dict[str, list[str]]:
    """The files of each task folder the fine-tuning reads (train, and dev where present)."""
    out = {}
    for task in tasks:
        folder = os.path.join(glue, TASK_DIRS[task])
        names = [n for n in ("train.tsv", "dev.tsv") if os.path.exists(os.path.join(folder, n))]
        if "train.tsv" not in names:
            sys.exit(f"--glue {glue}: no {TASK_DIRS[task]}/train.tsv")
        out[TASK_DIRS[task]] = [os.path.join(folder, n) for n in names]
    return out


def _examples(data_dir: str) -> int:
    from bert_jax.data.metadata import load_metadata

    return sum(load_metadata(data_dir).train_examples)


def prepare_only(args, work: str) -> dict:
    """The first phase: data, batches and GLUE files packed into ``args.prepare_only``."""
    from bench import variants_prep

    variants = args.variants.split(",")
    started = time.perf_counter()
    data = prepare(args, work, sorted({VARIANTS[v][0] for v in variants}))
    materialized = materialize(args, data, work, variants)
    stage = os.path.join(work, "stage")
    shutil.rmtree(stage, ignore_errors=True)
    _log(f"pack {len(materialized)} batch sets into {args.prepare_only}")
    variants_prep.pack(stage, materialized,
                       {c: kind for c, (kind, _) in combos(variants).items()})
    shutil.copytree(data["tokenizer"], os.path.join(stage, "tokenizer"))
    for folder, files in glue_files(args.glue, args.tasks.split(",")).items():
        os.makedirs(os.path.join(stage, "glue", folder))
        for f in files:
            shutil.copy(f, os.path.join(stage, "glue", folder))
    prepared = variants_prep.write_archive(stage, args.prepare_only, {
        "batches": args.batches, "steps": args.steps or args.batches,
        "batch_size": args.batch_size, "seq_len": args.seq_len,
        "max_predictions": max_predictions(args.seq_len), "vocab_size": args.vocab_size,
        "model": args.model, "variants": variants, "tasks": args.tasks.split(","),
        "corpus_mb": round(sum(os.path.getsize(f) for f in
                               corpus_files(args.corpus, args.max_corpus_mb)) / 1e6, 2),
        "combos": {c: {"kind": kind, "masking": masking}
                   for c, (kind, masking) in combos(variants).items()},
        "examples": {kind: _examples(data[kind]) for kind in {k for k, _ in
                                                             combos(variants).values()}},
        "prepare_seconds": round(time.perf_counter() - started, 1)})
    shutil.rmtree(stage)
    _log(f"{args.prepare_only}: {prepared['archive_bytes'] / 2 ** 20:.1f} MiB "
         f"({prepared['unpacked_bytes'] / 2 ** 20:.1f} MiB unpacked), "
         f"{prepared['batches']} batches per (data, masking), {prepared['steps']} steps")
    return prepared


def common_overrides(args, steps: int, data_dir: str, tokenizer: str,
                     source: str = "tfrecord") -> list[str]:
    preds = max_predictions(args.seq_len)
    return [f"--config.model.preset={args.model}",
            f"--config.model.max_position_embeddings={args.seq_len}",
            f"--config.model.dtype={args.dtype}",
            f"--config.data.source={source}", f"--config.data.directory={data_dir}",
            f"--config.data.tokenizer={tokenizer}",
            *(["--config.data.repeat=true"] if source == "materialized" else []),
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
    """One variant's pretraining run (skipped when it finished before). ``data`` maps the
    data kinds (tfrecord) or the (kind, masking) pairs (materialized) to folders."""
    from bench.variants_prep import combo_name

    kind, masking, overrides = VARIANTS[name]
    if data.get("source") == "materialized":  # the masks are in the batches
        directory, source, extra = data[combo_name(kind, masking)], "materialized", []
    else:
        directory, source = data[kind], "tfrecord"
        extra = [f"--config.data.masking={masking}"]
    if name == "albert":
        extra.append(f"--config.model.embedding_size={args.albert_embedding_size}")
    if name == "distilbert":
        extra.append(f"--config.distill.teacher={teacher}")
    seconds_file = os.path.join(workdir, "bench_seconds.json")
    if not os.path.exists(seconds_file):
        _log(f"pretrain {name}: {steps} steps")
        start = time.perf_counter()
        _cli(["pretrain", "--config", f"{EXPERIMENT}:tiny", "--workdir", workdir,
              *common_overrides(args, steps, directory, data["tokenizer"], source),
              *overrides, *extra])
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
    from bench.variants_prep import combo_name

    workdir = os.path.join(work, "probe")
    steps = args.probe_steps
    materialized = data.get("source") == "materialized"
    directory = data[combo_name("nsp", "token")] if materialized else data["nsp"]
    if not _metrics(workdir):
        _cli(["pretrain", "--config", f"{EXPERIMENT}:tiny", "--workdir", workdir,
              *common_overrides(args, steps, directory, data["tokenizer"],
                                "materialized" if materialized else "tfrecord"),
              f"--config.log_every={steps // 2}", "--config.objective=nsp"])
    rates = [r["steps_per_sec"] for r in _metrics(workdir) if "steps_per_sec" in r]
    return rates[-1]


def finetune(args, name: str, init: str, task: str, seed: int, work: str, glue: str,
             programs) -> tuple[float, str]:
    """One fine-tuning run in this process; ``programs`` (a FinetunerCache) lets runs of the
    same shape (seeds, variants with the same encoder shape) share compiled steps. One length
    bucket: at this size the runs are bound by per-step dispatch, not padding, and every
    bucket would be one more program to compile per model shape."""
    workdir = os.path.join(work, "finetune", f"{name}_{task}_seed{seed}")
    metrics_path = os.path.join(workdir, "metrics.json")
    if not os.path.exists(metrics_path):
        from bert_jax.finetuning.config import load_config
        from bert_jax.finetuning.finetune import finetune as run_finetune

        config = load_config(f"{GLUE_EXPERIMENT}:{task}", [
            f"--config.data_dir={os.path.join(glue, TASK_DIRS[task])}",
            "--config.length_bucket_min=0", "--config.progress_bar=false",
            f"--config.init_checkpoint={init}", f"--config.seed={seed}",
            f"--config.epochs={args.epochs}",
            f"--config.max_train_examples={args.max_train_examples}",
            f"--config.max_seq_length={args.seq_len}",
            f"--config.optimizer.learning_rate={args.finetune_learning_rate}",
            f"--config.model.dtype={args.dtype}", "--config.log_every=1000"])
        run_finetune(config, workdir, programs=programs)
    with open(metrics_path, encoding="utf-8") as f:
        result = json.load(f)
    split, metric = result["best"]["metric"].split("/")
    return float(result["final"][split][metric]), f"{metric}"


def write_table(records: list[dict], tasks: list[str], out: str, header: str) -> str:
    lines = [header, "",
             "| variant | layers x hidden | pretrain steps (distinct batches) | pretrain s | "
             "last loss (first) | " + " | ".join(f"{t} (mean ± std)" for t in tasks) + " |",
             "| --- | --- | --- | --- | --- | " + " | ".join("---" for _ in tasks) + " |"]
    for r in records:
        scores = []
        for t in tasks:
            s = r["tasks"][t]
            scores.append(f"{100 * s['mean']:.1f} ± {100 * s['std']:.1f} {s['metric']}")
        first = f"{r['first_loss']:.2f}" if r.get("first_loss") is not None else "-"
        last = f"{r['last_loss']:.2f}" if r.get("last_loss") is not None else "-"
        distinct = r.get("distinct_batches") or "live"
        lines.append(f"| {r['variant']} | {r['layers']} x {r['hidden']} | "
                     f"{r['pretrain_steps']} ({distinct}) | {r['pretrain_seconds']} | "
                     f"{last} ({first}) | "
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
    phase = p.add_mutually_exclusive_group()
    phase.add_argument("--prepare-only", metavar="DIR",
                       help="needs tensorflow: write the tokenizer, the batches of every "
                            "(data, masking) pair and the GLUE files to DIR, packed, and stop "
                            "(--out holds the intermediate files)")
    phase.add_argument("--prepared", metavar="DIR",
                       help="no tensorflow: run everything from DIR (made by --prepare-only), "
                            "unpacked into --unpack-dir")
    p.add_argument("--unpack-dir", default=None,
                   help="--prepared: where the archive is unpacked (default: a folder under "
                        "the system's temporary directory)")
    p.add_argument("--corpus", help="directory of plain-text files (not with --prepared)")
    p.add_argument("--glue", help="GLUE root with MRPC/, CoLA/, ... train.tsv (with "
                                  "--prepared: default the copy in DIR)")
    p.add_argument("--out", required=True)
    p.add_argument("--budget-minutes", type=float, default=None,
                   help="pretraining wall budget of all seven runs together (BERT's rate); "
                        "with --prepared the default is the steps DIR was prepared for")
    p.add_argument("--tasks", default="mrpc,cola")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--model", default="mini", help="bert_jax.config preset of every encoder")
    p.add_argument("--albert-embedding-size", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--max-corpus-mb", type=float, default=12.0)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--batches", type=int, default=1200,
                   help="--prepare-only: batches materialized per (data, masking) pair")
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--shuffle-buffer", type=int, default=2000)
    p.add_argument("--probe-steps", type=int, default=40)
    p.add_argument("--steps", type=int, default=0,
                   help="fixed steps per variant (0: from the budget; --prepare-only: the "
                        "steps the GPU phase runs by default, 0 = --batches)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--max-train-examples", type=int, default=2000)
    p.add_argument("--finetune-learning-rate", type=float, default=1e-4)
    p.add_argument("--dtype", default=None, help="compute dtype (default: bfloat16 on GPU, "
                                                 "float32 elsewhere)")
    p.add_argument("--num-workers", type=int, default=min(8, os.cpu_count() or 1))
    args = p.parse_args(argv)
    if args.prepared:
        if args.corpus:
            p.error("--corpus: not with --prepared (the data is in the prepared folder)")
    else:
        for name in ("corpus", "glue"):
            if not getattr(args, name):
                p.error(f"--{name} is required (unless --prepared)")
        if not args.prepare_only and args.budget_minutes is None and args.steps <= 0:
            p.error("--budget-minutes or --steps is required (unless --prepared)")
    if args.batches < 1:
        p.error(f"--batches {args.batches}: must be >= 1")
    unknown = [t for t in args.tasks.split(",") if t not in TASK_DIRS]
    if unknown:
        p.error(f"--tasks: unknown {unknown}; choose from {sorted(TASK_DIRS)}")
    bad = [v for v in args.variants.split(",") if v not in VARIANTS]
    if bad:
        p.error(f"--variants: unknown {bad}; choose from {list(VARIANTS)}")
    if "distilbert" in args.variants.split(",") and "bert" not in args.variants.split(","):
        p.error("--variants: distilbert needs bert (its teacher)")
    return args


def use_prepared(args, work: str) -> tuple[dict, dict, float]:
    """Unpacks ``args.prepared`` and takes its settings; returns (data, prepared settings,
    seconds). Settings that shape the data come from the folder, never from the flags."""
    import tempfile

    from bench import variants_prep

    started = time.perf_counter()
    prepared = variants_prep.read_prepared(args.prepared)
    missing = [c for c in combos(args.variants.split(",")) if c not in prepared["combos"]]
    missing_tasks = [t for t in args.tasks.split(",") if t not in prepared["tasks"]
                     and not args.glue]
    if missing or missing_tasks:
        sys.exit(f"--prepared {args.prepared}: prepared without {missing + missing_tasks} "
                 "(prepare again with these --variants / --tasks, or pass --glue)")
    for name in ("batch_size", "seq_len", "model"):
        setattr(args, name, prepared[name])
    target = args.unpack_dir or os.path.join(
        tempfile.gettempdir(), f"bert_jax_variants_{prepared['archive_bytes']}")
    _log(f"unpack {args.prepared} ({prepared['archive_bytes'] / 2 ** 20:.1f} MiB) to {target}")
    data = {**variants_prep.unpack(args.prepared, target), "source": "materialized"}
    return data, prepared, time.perf_counter() - started


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    out = os.path.abspath(args.out)
    work = os.path.join(out, "work")
    os.makedirs(work, exist_ok=True)
    if args.prepare_only:
        prepare_only(args, work)
        return 0
    import jax

    if args.dtype is None:
        args.dtype = "bfloat16" if jax.default_backend() == "gpu" else "float32"
    # The fine-tuning runs of one task differ only in their seed: the same programs, compiled
    # once and read back from this cache by the other seeds and variants.
    jax.config.update("jax_compilation_cache_dir", os.path.join(work, "jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    started = time.perf_counter()
    distinct = None
    if args.prepared:
        data, prepared, prep_seconds = use_prepared(args, work)
        distinct = prepared["batches"]
        glue = args.glue or data["glue"]
    else:
        data = prepare(args, work)
        prep_seconds = time.perf_counter() - started
        glue = args.glue
    variants = args.variants.split(",")
    steps = args.steps
    if steps <= 0 and args.budget_minutes is None:
        steps = prepared["steps"]
    elif steps <= 0:
        rate = probe_steps_per_second(args, data, work)
        steps = max(10, int(args.budget_minutes * 60 / len(variants) * rate))
        _log(f"probe: BERT at {rate:.2f} steps/s -> {steps} steps per variant")
    from bert_jax.finetuning.trainer import FinetunerCache

    programs = FinetunerCache()
    tasks = args.tasks.split(",")
    records = []
    pretrain_total = finetune_total = 0.0
    for name in variants:
        workdir = os.path.join(work, "pretrain", name)
        t0 = time.perf_counter()
        record = {"variant": name, **pretrain(args, name, workdir, steps, data,
                                              os.path.join(work, "pretrain", "bert"))}
        pretrain_total += time.perf_counter() - t0
        record["distinct_batches"] = distinct
        record["tasks"] = {}
        t0 = time.perf_counter()
        for task in tasks:
            scores = []
            for seed in range(args.seeds):
                value, metric = finetune(args, name, workdir, task, seed, work, glue, programs)
                scores.append(value)
            record["tasks"][task] = {
                "metric": metric, "scores": scores, "mean": statistics.fmean(scores),
                "std": statistics.stdev(scores) if len(scores) > 1 else 0.0}
            _log(f"{name} {task}: {record['tasks'][task]['mean']:.4f} "
                 f"± {record['tasks'][task]['std']:.4f}")
        finetune_total += time.perf_counter() - t0
        records.append(record)
    total = time.perf_counter() - started
    device = jax.devices()[0].device_kind
    command = " ".join(sys.argv[1:] if argv is None else argv)
    if distinct:
        data_line = (f"Pretraining data: {distinct} distinct batches per (data, masking) pair, "
                     f"materialized with the pipeline's dynamic masking; {steps} steps = "
                     f"{steps / distinct:.1f} passes, so "
                     + ("every batch is seen once." if steps <= distinct else
                        "batches repeat with the same masks (cycling)."))
    else:
        data_line = "Pretraining data: the live tf.data pipeline, every batch masked afresh."
    header = (f"Device: {device} ({jax.default_backend()}), jax {jax.__version__}, Python "
              f"{platform.python_version()}; model preset {args.model}, seq {args.seq_len}, "
              f"batch {args.batch_size}, {steps} steps each "
              f"({steps * args.batch_size * args.seq_len:,} tokens); fine-tuning: "
              f"{args.seeds} seeds, {args.epochs} epochs, at most {args.max_train_examples} "
              f"train examples. {data_line} Data preparation {prep_seconds:.0f} s, "
              f"pretraining {pretrain_total:.0f} s, fine-tuning {finetune_total:.0f} s "
              f"({len(programs)} distinct fine-tuning shapes), total {total:.0f} s.\n"
              f"Command: python -m bench variants {command}")
    with open(os.path.join(out, "variants.jsonl"), "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps({**r, "device": device, "steps": steps,
                                "pretrain_total_seconds": round(pretrain_total, 1),
                                "finetune_total_seconds": round(finetune_total, 1),
                                "total_seconds": round(total, 1)}) + "\n")
    print(write_table(records, tasks, out, header))
    plot(records, tasks, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
