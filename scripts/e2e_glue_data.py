"""GLUE train/dev files for the end-to-end run (``scripts/e2e_small_bert.sh cpu-prep``).

The shared GLUE folder has train splits only. For each task this holds out a dev split from
train with a fixed seed (``bert_jax.tasks.splits.holdout_rows``, the rows the fine-tuning
runner would hold out itself), optionally subsamples the remaining train rows, and writes
``OUT/<Folder>/train.tsv`` and ``dev.tsv`` as verbatim lines of the original file (header kept,
CoLA stays headerless), so the GPU machine needs neither the shared data nor this script.

    python scripts/e2e_glue_data.py --glue GLUE_TRAIN_DIR --output e2e_data/glue
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from bert_jax.errors import BertJaxError
from bert_jax.tasks.glue import GLUE_SPECS
from bert_jax.tasks.registry import get_task
from bert_jax.tasks.splits import holdout_rows

# task -> (dev rows held out: a fraction of train, or a count; train rows kept, 0 = all)
PLAN = {"sst2": (872, 20_000), "cola": (0.1, 0), "mrpc": (0.1, 0), "stsb": (0.1, 0),
        "rte": (0.1, 0)}


def _read_lines(path: str) -> list[str]:
    """``\\n``-terminated lines as the GLUE reader splits them (not ``splitlines``, which
    also breaks at form feeds and Unicode separators), endings and a leading BOM kept."""
    with open(path, encoding="utf-8", newline="") as f:
        text = f.read()
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    return [line for line in lines if line]


def split_task(task: str, glue_dir: str, output_dir: str, seed: int) -> dict[str, int]:
    """Writes one task's train.tsv/dev.tsv; returns the row counts."""
    spec = GLUE_SPECS[task]
    source = os.path.join(glue_dir, spec.folder, "train.tsv")
    if not os.path.isfile(source):
        raise BertJaxError(f"{source}: GLUE train file not found")
    lines = _read_lines(source)
    headerless = spec.headerless is not None and spec.text_a not in lines[0]
    header, rows = ([], lines) if headerless else (lines[:1], lines[1:])
    dev_size, keep = PLAN[task]
    fraction = dev_size / len(rows) if dev_size >= 1 else dev_size
    train_idx, dev_idx = holdout_rows(len(rows), fraction, seed)
    if keep and keep < len(train_idx):
        rng = np.random.default_rng(seed + 1)
        train_idx = np.sort(rng.choice(train_idx, keep, replace=False))
    folder = os.path.join(output_dir, spec.folder)
    os.makedirs(folder, exist_ok=True)
    for name, idx in (("train", train_idx), ("dev", dev_idx)):
        with open(os.path.join(folder, f"{name}.tsv"), "w", encoding="utf-8", newline="") as f:
            f.writelines(header + [rows[i] for i in idx])
    # Read both back with the task's own reader: every row must parse.
    task_obj = get_task(task)
    counts = {"source_rows": len(rows)}
    for name in ("train", "dev"):
        examples = task_obj.read(name, data_dir=output_dir)
        if examples.skipped:
            raise BertJaxError(f"{folder}/{name}.tsv: {len(examples.skipped)} rows do not "
                               f"parse (first: {examples.skipped[0]})")
        counts[name] = len(examples)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--glue", required=True, help="folder with <Task>/train.tsv")
    parser.add_argument("--output", required=True)
    parser.add_argument("--seed", type=int, default=1234, help="holdout and subsample seed")
    parser.add_argument("--tasks", nargs="+", default=list(PLAN), choices=list(PLAN))
    args = parser.parse_args(argv)
    try:
        summary = {task: split_task(task, args.glue, args.output, args.seed)
                   for task in args.tasks}
    except BertJaxError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    summary = {"seed": args.seed, "tasks": summary}
    with open(os.path.join(args.output, "splits.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    for task, counts in summary["tasks"].items():
        print(f"{task}: {counts['train']} train, {counts['dev']} dev "
              f"(of {counts['source_rows']} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
