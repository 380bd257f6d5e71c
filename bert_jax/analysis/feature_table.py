"""The BERT paper's feature-based CoNLL-2003 table (Devlin et al. 2019, Table 7): a frozen
encoder's hidden states, combined one of several ways, feed a two-layer BiLSTM tagger; the
last row fine-tunes the whole model. Every row is an ordinary ``bert-jax finetune`` run
(``experiments/feature_ner.py:<row>``); this driver runs them in turn and writes the table::

    python -m bert_jax.analysis.feature_table --checkpoint CKPT --data DATA/conll2003 --out DIR

DIR/<row>/ holds each run's workdir (a finished row is reused when the command is run again);
DIR/feature_table.json and DIR/feature_table.md the dev F1 of every row. A row that fails is
reported and the others still run (exit status 1).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

import ml_collections

from bert_jax import fileio, storage
from bert_jax.errors import BertJaxError

# row -> (description as in the paper, feature_layers; None = fine-tune everything)
ROWS: dict[str, tuple[str, str | None]] = {
    "embeddings": ("Embeddings (first layer)", "embeddings"),
    "second_to_last": ("Second-to-last hidden", "second_to_last"),
    "last": ("Last hidden", "last"),
    "mix4": ("Weighted sum last four hidden", "mix4"),
    "last4": ("Concat last four hidden", "last4"),
    "mix": ("Weighted sum all layers", "mix"),
    "finetune": ("Fine-tuning (all weights)", None),
}
# BERT-base dev F1 in the paper's Table 7, for reference.
PAPER_BASE_F1 = {"finetune": 96.4, "embeddings": 91.0, "second_to_last": 95.6, "last": 94.9,
                 "mix4": 95.9, "last4": 96.1, "mix": 95.5}


def row_config(row: str, quick: bool = False) -> ml_collections.ConfigDict:
    """The fine-tuning config of one row: CoNLL-2003 NER (``experiments/ner.py``); feature
    rows freeze the encoder and train a 2 x 768 BiLSTM tagger with Adam at 1e-3."""
    from bert_jax.finetuning.recipes import make_quick, task_config

    if row not in ROWS:
        raise BertJaxError(f"unknown feature-table row {row!r}; rows: {', '.join(ROWS)}")
    c = task_config("conll2003", "conll2003", learning_rate=5e-5)
    layers = ROWS[row][1]
    if layers is not None:
        c.freeze_encoder = True
        c.feature_layers = layers
        c.feature_head = "bilstm"
        c.lstm_hidden_size = 768
        c.lstm_layers = 2
        c.optimizer.learning_rate = 1e-3
        c.epochs = 4
    if quick:
        make_quick(c)
    return c


def markdown(rows: list[dict]) -> str:
    lines = ["| system | feature_layers | dev F1 | BERT-base in the paper | train s |",
             "| --- | --- | --- | --- | --- |"]
    for r in rows:
        f1 = f"{r['dev_f1']:.1f}" if r.get("dev_f1") is not None else f"failed: {r['error']}"
        secs = f"{r['train_seconds']:.0f}" if r.get("train_seconds") is not None else ""
        lines.append(f"| {r['system']} | {r['feature_layers'] or '(fine-tuned)'} | {f1} | "
                     f"{PAPER_BASE_F1[r['row']]} | {secs} |")
    return "\n".join(lines) + "\n"


def run_table(checkpoint: str, data: str, out: str, rows: list[str], overrides: list[str],
              quick: bool = False, log=print) -> tuple[list[dict], bool]:
    """Runs each row (reusing finished ones); returns (table rows, all succeeded)."""
    from bert_jax.finetuning.config import apply_overrides
    from bert_jax.finetuning.finetune import METRICS_FILE, finetune

    results, ok = [], True
    for row in rows:
        workdir = storage.join(out, row)
        metrics_path = storage.join(workdir, METRICS_FILE)
        entry = {"row": row, "system": ROWS[row][0], "feature_layers": ROWS[row][1],
                 "workdir": workdir}
        try:
            if storage.isfile(metrics_path):
                log(f"[{row}] reusing {metrics_path}")
                metrics = json.loads(storage.read_text(metrics_path))
            else:
                c = row_config(row, quick)
                c.init_checkpoint = checkpoint
                c.data_dir = data
                apply_overrides(c, overrides)
                log(f"[{row}] {ROWS[row][0]}: fine-tuning into {workdir}")
                t0 = time.perf_counter()
                metrics = finetune(c, workdir)
                log(f"[{row}] done in {time.perf_counter() - t0:.0f} s")
            best = metrics["best"]
            entry.update(dev_f1=best["value"], best_epoch=best["epoch"],
                         train_seconds=metrics.get("train_seconds"),
                         train_examples=metrics.get("train_examples"))
        except (BertJaxError, Exception) as e:  # one failed row must not lose the others
            ok = False
            entry["error"] = f"{type(e).__name__}: {e}"
            log(f"[{row}] failed: {entry['error']}")
            if not isinstance(e, BertJaxError):
                traceback.print_exc()
        results.append(entry)
        _write(out, checkpoint, data, overrides, results)
    return results, ok


def _write(out: str, checkpoint: str, data: str, overrides: list[str], rows: list[dict]):
    storage.makedirs(out)
    fileio.atomic_write_json(storage.join(out, "feature_table.json"), {
        "checkpoint": checkpoint, "data": data, "overrides": overrides, "rows": rows},
        indent=1, sort_keys=False)
    fileio.atomic_write(storage.join(out, "feature_table.md"), markdown(rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bert_jax.analysis.feature_table",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True,
                        help="bert-jax model dir / workdir or Hugging Face dir")
    parser.add_argument("--data", required=True,
                        help="CoNLL-2003 folder (train.txt, valid.txt)")
    parser.add_argument("--out", required=True, help="output folder (one workdir per row)")
    parser.add_argument("--rows", default=",".join(ROWS),
                        help=f"comma-separated subset of {','.join(ROWS)}")
    parser.add_argument("--quick", action="store_true",
                        help="the _quick settings (1 epoch, 256 sentences, length 64)")
    parser.add_argument("--max-train-examples", type=int, default=0,
                        help="train on this many sentences (0 = all)")
    args, overrides = parser.parse_known_args(argv)
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    try:
        unknown = [r for r in rows if r not in ROWS]
        if unknown:
            raise BertJaxError(f"--rows: unknown {unknown}; rows: {', '.join(ROWS)}")
        if not storage.isdir(args.data):
            raise BertJaxError(f"--data {args.data}: no such folder")
        bad = [o for o in overrides if not o.startswith("--config.")]
        if bad:
            raise BertJaxError(f"unrecognized arguments: {' '.join(bad)} (config overrides "
                               "are --config.key=value)")
        if args.max_train_examples:
            overrides = [*overrides, f"--config.max_train_examples={args.max_train_examples}"]
        results, ok = run_table(args.checkpoint, args.data, args.out, rows, overrides,
                                args.quick)
    except BertJaxError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(markdown(results))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
