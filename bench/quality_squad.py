"""SQuAD v1.1 from the CLI against transformers, over seeds, on articles held out by article.

Two steps, both deterministic:

  python -m bench quality squad split --input squad-v1.1-dev-part-a.json --dev-articles 6 \
      --out DATA_DIR          # DATA_DIR/train-v1.1.json + dev-v1.1.json, whole articles
  python -m bench quality squad run --data-dir DATA_DIR --checkpoint HF_DIR \
      --seeds 0,1,2,3,4 --learning-rates 3e-5,5e-5 --out OUT

``split`` picks the dev articles with :func:`bert_jax.tasks.splits.holdout_groups` (the
holdout that ``holdout_fraction`` uses, by article), so no paragraph or article of dev is seen
in training; both files keep the official layout and the articles verbatim.

``run`` does for every learning rate and seed what a user does: ``python -m bert_jax
finetune --config experiments/squad.py:v1 --workdir W --config.data_dir=DATA_DIR
--config.init_checkpoint=HF_DIR --config.seed=S --config.optimizer.learning_rate=LR`` (the
documented recipe otherwise: 2 epochs, length 384, stride 128, batch 32), then the
transformers peer (``python -m bench quality peer``) on that run's own config
(``W/config.json``'s ``finetune`` section): same examples, features, order and
hyperparameters. ``--variant NAME:KEY=VALUE,...`` adds bert-jax runs with more
``--config.KEY=VALUE`` overrides; ``--peer-head-init`` starts the peer from each bert-jax
run's initial span head (same seed: same head on both sides). Runs go ``--parallel`` at a
time (one GPU holds several runs of a small model). Both sides are scored with bert-jax's
official SQuAD scorer after the last epoch. Writes OUT/squad_seeds.json (every run) and
OUT/squad_seeds.md (mean ± sample std per side and learning rate).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

from bench.common import REPO

EXPERIMENT = os.path.join("experiments", "squad.py") + ":v1"
FILES = ("train-v1.1.json", "dev-v1.1.json")
HEAD_SHARED = "transformers from bert-jax's head"
SIDES = ("bert_jax", "transformers", HEAD_SHARED)


# ---- split ----------------------------------------------------------------------------------
def split_articles(data: dict, dev_articles: int, seed: int) -> tuple[dict, dict, list[int]]:
    """(train, dev, dev article indices): whole articles, ``dev_articles`` of them in dev,
    chosen as ``holdout_groups`` chooses groups with that fraction and seed."""
    from bert_jax.errors import BertJaxError
    from bert_jax.tasks.splits import holdout_groups

    articles = data.get("data") if isinstance(data, dict) else None
    if not isinstance(articles, list):
        raise BertJaxError("expected the SQuAD layout {'version', 'data': [articles]}")
    n = len(articles)
    if not 0 < dev_articles < n:
        raise BertJaxError(f"--dev-articles={dev_articles}: expected 1..{n - 1} of {n} articles")
    train_idx, dev_idx = holdout_groups(range(n), dev_articles / n, seed)
    version = data.get("version", "1.1")
    return ({"version": version, "data": [articles[i] for i in train_idx]},
            {"version": version, "data": [articles[i] for i in dev_idx]},
            [int(i) for i in dev_idx])


def split_main(argv) -> int:
    from bert_jax.fileio import atomic_write_json
    from bert_jax.textio import read_text

    ap = argparse.ArgumentParser(prog="python -m bench quality squad split",
                                 description="hold out whole SQuAD articles as a dev file")
    ap.add_argument("--input", required=True, help="an official SQuAD v1.1 JSON file")
    ap.add_argument("--dev-articles", type=int, default=6)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", required=True, help="folder for train-v1.1.json, dev-v1.1.json")
    args = ap.parse_args(argv)
    train, dev, dev_idx = split_articles(json.loads(read_text(args.input)), args.dev_articles,
                                         args.seed)
    for name, part in zip(FILES, (train, dev), strict=True):
        # compact, as distributed; sort_keys off so the articles stay verbatim
        atomic_write_json(os.path.join(args.out, name), part, indent=None, sort_keys=False)
        questions = sum(len(p["qas"]) for a in part["data"] for p in a["paragraphs"])
        print(f"{os.path.join(args.out, name)}: {len(part['data'])} articles, "
              f"{questions} questions")
    print(f"dev articles (indices in {args.input}): {dev_idx}")
    return 0


# ---- run ------------------------------------------------------------------------------------
def cli_command(workdir: str, data_dir: str, checkpoint: str, seed: int, lr: float,
                extra: tuple[str, ...] = ()) -> list[str]:
    """The user's command for one seed and learning rate (the recipe otherwise)."""
    return [sys.executable, "-m", "bert_jax", "finetune", "--config",
            os.path.join(REPO, EXPERIMENT), "--workdir", workdir,
            f"--config.data_dir={data_dir}", f"--config.init_checkpoint={checkpoint}",
            f"--config.seed={seed}", f"--config.optimizer.learning_rate={lr}",
            "--config.progress_bar=False", *extra]


def _final(metrics_path: str) -> dict:
    with open(metrics_path, encoding="utf-8") as f:
        result = json.load(f)
    final = result["final"]
    split = next(k for k in final if isinstance(final[k], dict))
    return {"exact_match": final[split]["exact_match"], "f1": final[split]["f1"],
            "train_losses": [e["train_loss"] for e in result["epochs"]],
            "train_examples": result["train_examples"], "dev_examples": result["dev_examples"]}


def run_one(job: dict, args) -> dict:
    """One bert-jax CLI run and (for the default side) its transformers peer."""
    workdir = job["workdir"]
    log = open(workdir + ".log", "w", encoding="utf-8")  # closed in the finally below
    env = {k: v for k, v in os.environ.items() if k != "BERT_JAX_DATA"}
    record = {k: job[k] for k in ("variant", "seed", "learning_rate")}
    try:
        t0 = time.perf_counter()
        cmd = cli_command(workdir, args.data_dir, args.checkpoint, job["seed"],
                          job["learning_rate"], job["extra"])
        subprocess.run(cmd, check=True, cwd=REPO, env=env, stdout=log, stderr=log)
        record["bert_jax"] = {**_final(os.path.join(workdir, "metrics.json")),
                              "seconds": time.perf_counter() - t0, "command": cmd}
        if job["peer"]:
            with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
                run_config = json.load(f)["finetune"]
            config_path = workdir + ".run_config.json"
            with open(config_path, "w", encoding="utf-8") as f:
                json.dump(run_config, f, indent=2)
            out = workdir + ".peer.json"
            peer = [sys.executable, "-m", "bench", "quality", "peer", "--config-json",
                    config_path, "--checkpoint", args.checkpoint, "--out", out]
            if args.peer_no_compile:
                peer.append("--no-compile")
            side = "transformers"
            if args.peer_head_init:  # the peer starts from this run's initial head
                from bench.quality_finetune import bert_jax_initial_head
                from bert_jax.finetuning.config import config_from_dict

                os.makedirs(workdir + ".head", exist_ok=True)
                peer += ["--head-init", bert_jax_initial_head(config_from_dict(run_config),
                                                              workdir + ".head")]
                side = HEAD_SHARED
            t0 = time.perf_counter()
            subprocess.run(peer, check=True, cwd=REPO, stdout=log, stderr=log)
            with open(out, encoding="utf-8") as f:
                p = json.load(f)
            metrics = next(iter(p["metrics"].values()))
            record[side] = {"exact_match": metrics["exact_match"],
                                      "f1": metrics["f1"], "train_losses": p["train_losses"],
                                      "seconds": time.perf_counter() - t0, "command": peer,
                                      "torch": p["torch"], "transformers": p["transformers"]}
    except subprocess.CalledProcessError as e:
        record["error"] = f"{e.cmd[:4]}... exited {e.returncode} (see {workdir}.log)"
    finally:
        log.close()
    brief = {k: record[k] for k in ("variant", "learning_rate", "seed", "error") if k in record}
    for side in SIDES:
        if side in record:
            brief[side] = {k: round(record[side][k], 2) for k in ("exact_match", "f1", "seconds")}
    print(json.dumps(brief), flush=True)
    return record


def mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.2f} ± {sd:.2f}"


def summary(records: list[dict]) -> str:
    """Mean ± sample std over seeds of EM and F1, per learning rate, side and variant."""
    rows: dict[tuple, list[dict]] = {}
    for r in records:
        for side in SIDES:
            if side in r:
                name = side if side != "bert_jax" or r["variant"] == "default" \
                    else f"bert_jax {r['variant']}"
                rows.setdefault((r["learning_rate"], name), []).append(r[side])
    lines = ["| lr | side | seeds | EM mean ± std | F1 mean ± std | F1 per seed |",
             "| --- | --- | ---: | ---: | ---: | --- |"]
    for (lr, name), runs in sorted(rows.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        lines.append(f"| {lr:g} | {name} | {len(runs)} | "
                     f"{mean_std([x['exact_match'] for x in runs])} | "
                     f"{mean_std([x['f1'] for x in runs])} | "
                     f"{', '.join(format(x['f1'], '.1f') for x in runs)} |")
    return "\n".join(lines) + "\n"


def parse_variant(text: str) -> tuple[str, tuple[str, ...]]:
    """'name:key=value,key=value' -> (name, ('--config.key=value', ...))."""
    name, _, body = text.partition(":")
    if not name or not body:
        raise argparse.ArgumentTypeError(f"--variant {text!r}: expected NAME:KEY=VALUE[,...]")
    return name, tuple(f"--config.{kv}" for kv in body.split(","))


def run_main(argv) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench quality squad run",
                                 description="bert-jax CLI and transformers over seeds")
    ap.add_argument("--data-dir", required=True, help="train-v1.1.json + dev-v1.1.json")
    ap.add_argument("--checkpoint", required=True, help="Hugging Face model directory")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--learning-rates", default="3e-5")
    ap.add_argument("--variant", action="append", default=[], type=parse_variant,
                    help="NAME:KEY=VALUE,...: extra bert-jax runs with these overrides")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an override for every bert-jax run (the peer reads it from the "
                    "run's config)")
    ap.add_argument("--skip-peer", action="store_true")
    ap.add_argument("--peer-no-compile", action="store_true",
                    help="transformers without torch.compile (same numerics, no compile time)")
    ap.add_argument("--peer-head-init", action="store_true",
                    help="the peer starts from each bert-jax run's initial span head")
    ap.add_argument("--parallel", type=int, default=1, help="runs at a time")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    args.data_dir, args.checkpoint = map(os.path.abspath, (args.data_dir, args.checkpoint))
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    common = tuple(f"--config.{kv}" for kv in args.set)
    jobs = []
    for lr in (float(x) for x in args.learning_rates.split(",")):
        for seed in (int(x) for x in args.seeds.split(",")):
            for name, extra in (("default", ()), *args.variant):
                jobs.append({"variant": name, "seed": seed, "learning_rate": lr,
                             "extra": common + extra,
                             "peer": name == "default" and not args.skip_peer,
                             "workdir": os.path.join(out, f"{name}-lr{lr:g}-seed{seed}")})
    records: list[dict] = []
    table = ""
    with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
        # the files are rewritten after every run: a sweep cut short keeps what finished
        for future in as_completed([pool.submit(run_one, job, args) for job in jobs]):
            records.append(future.result())
            with open(os.path.join(out, "squad_seeds.json"), "w", encoding="utf-8") as f:
                json.dump({"data_dir": args.data_dir, "checkpoint": args.checkpoint,
                           "records": records}, f, indent=2, default=str)
            table = summary([r for r in records if "error" not in r])
            with open(os.path.join(out, "squad_seeds.md"), "w", encoding="utf-8") as f:
                f.write(table)
    print(table)
    failed = [r for r in records if "error" in r]
    for r in failed:
        print(f"failed: {r['variant']} lr {r['learning_rate']} seed {r['seed']}: {r['error']}")
    return 1 if failed else 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    modes = {"split": split_main, "run": run_main}
    if not argv or argv[0] not in modes:
        print("usage: python -m bench quality squad {split,run} [options] (--help)",
              file=sys.stderr)
        return 2
    return modes[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
