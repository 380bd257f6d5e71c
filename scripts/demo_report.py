"""The end of `make demo`'s pretraining: did the model learn? Prints the held-out curve beside
the unigram baseline (a model that ignores the context), writes the curves as a PNG, and
fills a few masked sentences.

    python scripts/demo_report.py WORKDIR [--text "... [MASK] ..."]
"""

from __future__ import annotations

import argparse
import json
import os

import ml_collections

from bert_jax.tokenization import load_tokenizer
from bert_jax.training.baseline import unigram_baseline
from bert_jax.training.plot import plot_metrics, read_records

# Answers the corpus teaches (Sir Walter Elliot, Captain Wentworth, "do not know").
TEXTS = ("Sir [MASK] Elliot was a proud man.", "Captain [MASK] came to the house.",
         "I do not [MASK] what you mean.")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir")
    parser.add_argument("--text", action="append", help="sentence with [MASK] (repeatable)")
    args = parser.parse_args()
    with open(os.path.join(args.workdir, "config.json"), encoding="utf-8") as f:
        experiment = ml_collections.ConfigDict(json.load(f)["experiment"])
    tokenizer = load_tokenizer(os.path.join(args.workdir, "tokenizer"))
    baseline = unigram_baseline(experiment, tokenizer.vocab_size, tokenizer=tokenizer)

    records = read_records(args.workdir)
    train = [r for r in records if r["split"] == "train"]
    evals = [r for r in records if r["split"] == "eval"]
    print("\n step   train loss  train acc   held-out loss  held-out acc")
    by_step = {r["step"]: r for r in evals}
    for r in train:
        e = by_step.get(r["step"])
        held = f"{e['mlm_loss']:>13.3f}  {e['mlm_accuracy']:>12.3f}" if e else ""
        print(f"{r['step']:>5}  {r['mlm_loss']:>10.3f}  {r['mlm_accuracy']:>9.3f}   {held}")
    if evals:
        first, last = evals[0], evals[-1]
        print(f"\nheld-out masked-LM accuracy: {first['mlm_accuracy']:.3f} (step {first['step']})"
              f" -> {last['mlm_accuracy']:.3f} (step {last['step']}); unigram baseline "
              f"{baseline['mlm_accuracy']:.3f}")
        print(f"held-out masked-LM loss:     {first['mlm_loss']:.3f} -> {last['mlm_loss']:.3f};"
              f" unigram baseline {baseline['mlm_loss']:.3f}")
        print(f"(unigram baseline: always the most frequent training token, "
              f"{tokenizer.id_to_token(baseline['most_frequent_id'])!r}, and each token's "
              f"training frequency as its probability; {baseline['tokens']} held-out "
              "masked tokens)")
    png = plot_metrics(args.workdir, baselines={k: baseline[k]
                                                for k in ("mlm_loss", "mlm_accuracy")})
    print(f"curves: {png}")

    from bert_jax.inference import fill_mask

    texts = args.text or list(TEXTS)
    print("\nfill-mask (top 3):")
    for text, masks in zip(texts, fill_mask(args.workdir, texts, top_k=3), strict=True):
        fillers = " | ".join(", ".join(f"{c['text'] or c['token']!r} "
                                       f"{c['probability']:.2f}" for c in mask)
                             for mask in masks)
        print(f"  {text}  ->  {fillers}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
