"""Results of the end-to-end run (``scripts/e2e_small_bert.sh``): collection on the GPU machine,
tables and plots here.

    python -m bench quality e2e pretrain-summary RESULTS/pretrain_metrics.jsonl
    python -m bench quality e2e collect E2E_WORK/ft --output RESULTS/finetune_results.json
    python -m bench quality e2e report RESULTS --docs docs

``collect`` gathers every fine-tuning ``metrics.json`` under ``<dir>/<init>/<task>/seed<N>/``
into one JSON (numpy and the standard library only: it runs on the GPU machine). ``report``
reads ``pretrain_metrics.jsonl``, ``pretrain_config.json``, ``finetune_results.json`` and
``time_*.json`` from RESULTS, writes the generated part of ``docs/results.md`` (between the
``<!-- e2e:begin -->`` / ``<!-- e2e:end -->`` markers) and two PNGs beside it:
``e2e_pretraining.png`` (loss, MLM and NSP accuracy vs step) and ``e2e_finetuning.png``
(per-task dev score, pretrained vs random init, and the average). The task score is the
GLUE main metric of the final epoch, x100.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import sys
from collections.abc import Sequence
from typing import Any

# task -> (main metric key, label in tables); the order is the tables'.
TASK_METRICS = {"sst2": ("accuracy", "SST-2 acc"), "cola": ("mcc", "CoLA MCC"),
                "mrpc": ("acc_and_f1", "MRPC acc/F1"), "stsb": ("corr", "STS-B corr"),
                "rte": ("accuracy", "RTE acc")}
INITS = ("pretrained", "random")
# Fine-tuning settings copied from each run's config.json into the collected results.
RUN_KEYS = ("learning_rate", "epochs", "batch_size", "max_seq_length", "max_train_examples",
            "warmup_proportion", "weight_decay", "init_checkpoint", "tokenizer", "seed",
            "holdout_seed")
BEGIN, END = "<!-- e2e:begin -->", "<!-- e2e:end -->"


# ---- reading ----------------------------------------------------------------------------------
def read_jsonl(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def collect(ft_dir: str) -> dict[str, Any]:
    """Every ``<init>/<task>/seed<N>/metrics.json`` under ``ft_dir``; runs without one
    (failed or unfinished) are listed as missing."""
    runs, missing = [], []
    for run_dir in sorted(glob.glob(os.path.join(ft_dir, "*", "*", "seed*"))):
        init, task, seed_name = run_dir.split(os.sep)[-3:]
        seed = int(seed_name[len("seed"):])
        path = os.path.join(run_dir, "metrics.json")
        if not os.path.isfile(path):
            missing.append({"init": init, "task": task, "seed": seed})
            continue
        with open(path, encoding="utf-8") as f:
            metrics = json.load(f)
        metrics.pop("report", None)
        with open(os.path.join(run_dir, "config.json"), encoding="utf-8") as f:
            stored = json.load(f)  # the model and the run config of the best epoch's save
        run_config = {k: stored["finetune"][k] for k in RUN_KEYS if k in stored["finetune"]}
        runs.append({"init": init, "task": task, "seed": seed, **metrics,
                     "finetune_config": run_config, "model": stored["config"]})
    return {"runs": runs, "missing": missing}


def final_score(run: dict[str, Any]) -> float:
    """The task's main dev metric after the last epoch, x100."""
    key = TASK_METRICS[run["task"]][0]
    return 100.0 * float(run["final"]["dev"][key])


def score_table(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """task -> init -> scores over seeds (seed order)."""
    table: dict[str, dict[str, list[float]]] = {}
    for run in sorted(runs, key=lambda r: r["seed"]):
        if run["task"] in TASK_METRICS:
            table.setdefault(run["task"], {}).setdefault(run["init"], []).append(
                final_score(run))
    return table


def averages(table: dict[str, dict[str, list[float]]]) -> dict[str, list[float]]:
    """init -> per-seed average over the tasks that every seed has (seed i of each task)."""
    out = {}
    for init in INITS:
        per_task = [table[t][init] for t in TASK_METRICS if init in table.get(t, {})]
        if len(per_task) != len([t for t in TASK_METRICS if t in table]) or not per_task:
            continue
        n = min(len(s) for s in per_task)
        out[init] = [statistics.fmean(s[i] for s in per_task) for i in range(n)]
    return out


def _mean_std(values: Sequence[float]) -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.fmean(values):.1f} ± {statistics.stdev(values):.1f}"


# ---- markdown -----------------------------------------------------------------------------------
def pretrain_lines(rows: list[dict[str, Any]]) -> list[str]:
    train = [r for r in rows if r.get("split") == "train"]
    evals = [r for r in rows if r.get("split") == "eval"]
    if not train:
        return ["No pretraining metrics."]
    last = train[-1]
    steady = [r["seq_per_sec"] for r in train if "seq_per_sec" in r]
    lines = ["| step | loss | MLM acc | NSP acc | held-out MLM acc | held-out NSP acc |",
             "|---:|---:|---:|---:|---:|---:|"]
    by_step = {r["step"]: r for r in evals}
    marks = sorted({train[0]["step"], *by_step, last["step"]})
    for step in marks:
        t = min(train, key=lambda r, s=step: abs(r["step"] - s))
        e = by_step.get(step)
        held = (f"{e['mlm_accuracy']:.3f} | {e['nsp_accuracy']:.3f}" if e and
                "nsp_accuracy" in e else "– | –")
        nsp = f"{t['nsp_accuracy']:.3f}" if "nsp_accuracy" in t else "–"
        lines.append(f"| {step} | {t['loss']:.3f} | {t['mlm_accuracy']:.3f} | {nsp} | {held} |")
    if steady:
        mfu = [r["mfu"] for r in train if "mfu" in r]
        lines += ["", f"Throughput: {statistics.median(steady):,.0f} sequences/s (median of the "
                  "logged windows)" + (f", MFU {100 * statistics.median(mfu):.1f}% of the "
                                       "data-sheet bf16 peak" if mfu else "") + "."]
    return lines


def finetune_lines(results: dict[str, Any]) -> list[str]:
    runs = results["runs"]
    table = score_table(runs)
    avg = averages(table)
    seeds = sorted({r["seed"] for r in runs})
    lr = sorted({r.get("finetune_config", {}).get("learning_rate") for r in runs} - {None})
    lines = [f"Dev score after the last epoch, x100, mean ± std over seeds {seeds}"
             + (f"; learning rate {', '.join(f'{x:g}' for x in lr)} for both inits" if lr
                else "") + ".", "",
             "| task | pretrained | random init | Δ |", "|---|---:|---:|---:|"]
    for task, (_, label) in TASK_METRICS.items():
        if task not in table:
            continue
        p, r = table[task].get("pretrained", []), table[task].get("random", [])
        delta = (f"{statistics.fmean(p) - statistics.fmean(r):+.1f}" if p and r else "–")
        lines.append(f"| {label} | {_mean_std(p)} | {_mean_std(r)} | {delta} |")
    if avg:
        p, r = avg.get("pretrained", []), avg.get("random", [])
        delta = (f"**{statistics.fmean(p) - statistics.fmean(r):+.1f}**" if p and r else "–")
        lines.append(f"| **average** | **{_mean_std(p)}** | **{_mean_std(r)}** | {delta} |")
    lines += ["", "Per seed (task score; init, seed):", "",
              "| task | " + " | ".join(f"{i} s{s}" for i in INITS for s in seeds) + " |",
              "|---|" + "---:|" * (len(INITS) * len(seeds))]
    for task, (_, label) in TASK_METRICS.items():
        if task not in table:
            continue
        cells = []
        for init in INITS:
            by_seed = {r["seed"]: final_score(r) for r in runs
                       if r["task"] == task and r["init"] == init}
            cells += [f"{by_seed[s]:.1f}" if s in by_seed else "–" for s in seeds]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if results.get("missing"):
        lines += ["", "Missing runs (no metrics.json): " + ", ".join(
            f"{m['init']} {m['task']} seed {m['seed']}" for m in results["missing"])]
    return lines


def generated_section(results_dir: str) -> str:
    parts = []
    times = sorted(glob.glob(os.path.join(results_dir, "time_*.json")))
    if times:
        stages = [json.load(open(p, encoding="utf-8")) for p in times]
        parts += ["Wall time per GPU stage: " + ", ".join(
            f"{s['stage']} {s['seconds'] / 60:.1f} min" for s in stages) + ".", ""]
    metrics = os.path.join(results_dir, "pretrain_metrics.jsonl")
    if os.path.isfile(metrics):
        parts += ["### Pretraining", "", *pretrain_lines(read_jsonl(metrics)), "",
                  "![pretraining curves](e2e_pretraining.png)", ""]
    finetune = os.path.join(results_dir, "finetune_results.json")
    if os.path.isfile(finetune):
        with open(finetune, encoding="utf-8") as f:
            results = json.load(f)
        parts += ["### Fine-tuning: pretrained vs random initialisation", "",
                  *finetune_lines(results), "",
                  "![fine-tuning results](e2e_finetuning.png)", ""]
    return "\n".join(parts)


def replace_section(document: str, section: str) -> str:
    """The text between the markers replaced by ``section`` (markers appended if absent)."""
    block = f"{BEGIN}\n{section.rstrip()}\n{END}"
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if pattern.search(document):
        return pattern.sub(lambda _: block, document)
    return document.rstrip() + "\n\n" + block + "\n"


# ---- plots --------------------------------------------------------------------------------------
def plot_pretraining(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in rows if r.get("split") == "train"]
    evals = [r for r in rows if r.get("split") == "eval"]
    fig, axes = plt.subplots(1, 3, figsize=(10, 2.8), dpi=80)
    for ax, key, title in zip(axes, ("loss", "mlm_accuracy", "nsp_accuracy"),
                              ("loss (MLM + NSP)", "MLM accuracy", "NSP accuracy"), strict=True):
        ax.plot([r["step"] for r in train if key in r], [r[key] for r in train if key in r],
                label="train", lw=1.2)
        held = [r for r in evals if key in r]
        if held:
            ax.plot([r["step"] for r in held], [r[key] for r in held], "o-", ms=3,
                    label="held-out", lw=1.2)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step", fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_finetuning(results: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = score_table(results["runs"])
    avg = averages(table)
    labels = [TASK_METRICS[t][1] for t in TASK_METRICS if t in table] + ["average"]
    fig, ax = plt.subplots(figsize=(8, 3), dpi=80)
    width = 0.38
    for k, init in enumerate(INITS):
        series = [table[t].get(init, []) for t in TASK_METRICS if t in table]
        series.append(avg.get(init, []))
        means = [statistics.fmean(s) if s else 0.0 for s in series]
        errs = [statistics.stdev(s) if len(s) > 1 else 0.0 for s in series]
        xs = [i + (k - 0.5) * width for i in range(len(labels))]
        ax.bar(xs, means, width, yerr=errs, capsize=2, label=init)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel("dev score x100", fontsize=9)
    ax.axhline(0, color="black", lw=0.6)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def report(results_dir: str, docs_dir: str) -> list[str]:
    """Updates docs/results.md and writes the PNGs; returns the written paths."""
    written = []
    metrics = os.path.join(results_dir, "pretrain_metrics.jsonl")
    if os.path.isfile(metrics):
        path = os.path.join(docs_dir, "e2e_pretraining.png")
        plot_pretraining(read_jsonl(metrics), path)
        written.append(path)
    finetune = os.path.join(results_dir, "finetune_results.json")
    if os.path.isfile(finetune):
        with open(finetune, encoding="utf-8") as f:
            path = os.path.join(docs_dir, "e2e_finetuning.png")
            plot_finetuning(json.load(f), path)
        written.append(path)
    if not written:
        raise SystemExit(f"error: {results_dir} has neither pretrain_metrics.jsonl nor "
                         "finetune_results.json")
    doc_path = os.path.join(docs_dir, "results.md")
    document = open(doc_path, encoding="utf-8").read() if os.path.isfile(doc_path) else \
        "# Results\n"
    with open(doc_path, "w", encoding="utf-8") as f:
        f.write(replace_section(document, generated_section(results_dir)))
    return [doc_path, *written]


# ---- command line -------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench quality e2e",
                                     description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pretrain-summary", help="print the pretraining table")
    p.add_argument("metrics")
    p = sub.add_parser("collect", help="fine-tuning metrics.json files -> one JSON")
    p.add_argument("ft_dir")
    p.add_argument("--output", required=True)
    p = sub.add_parser("report", help="docs/results.md tables and PNG plots")
    p.add_argument("results_dir")
    p.add_argument("--docs", default="docs")
    args = parser.parse_args(argv)
    if args.command == "pretrain-summary":
        print("\n".join(pretrain_lines(read_jsonl(args.metrics))))
    elif args.command == "collect":
        results = collect(args.ft_dir)
        with open(args.output, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
        print(f"collected {len(results['runs'])} runs into {args.output}"
              + (f"; {len(results['missing'])} missing" if results["missing"] else ""))
        if results["runs"]:
            print("\n".join(finetune_lines(results)))
    else:
        for path in report(args.results_dir, args.docs):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
