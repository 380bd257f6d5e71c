"""The end of `make demo`'s pretraining: did the model learn? Says what the model was trained
on, prints the held-out curve beside the unigram baseline (a model that ignores the context),
the held-out accuracy at the [MASK] positions alone, writes the curves as a PNG, and fills a
few masked sentences.

    python scripts/demo_report.py WORKDIR [--text "... [MASK] ..."]
"""

from __future__ import annotations

import argparse
import json
import os
import re

import ml_collections

from bert_jax.cli import QUIET_ENVIRONMENT
from bert_jax.tokenization import load_tokenizer
from bert_jax.tpu.topologies import quiet_libtpu_without_tpus
from bert_jax.training.baseline import unigram_baseline
from bert_jax.training.heldout import checkpoint_logits, eval_batches, masked_lm_scores
from bert_jax.training.plot import plot_metrics, read_records

# Prompts for the packaged corpus (bert_jax/demo_data), each with the phrase of the training
# text that answers it: names and phrases that recur there. The report counts each phrase in
# the training files, so what the model could have learned it from is on the screen.
PROMPTS = (("Sir [MASK] Elliot was a proud man.", "Sir Walter"),
           ("She went to see Lady [MASK] .", "Lady Russell"),
           ("Captain [MASK] came to the house.", "Captain Wentworth"),
           ("They talked a great [MASK] of the family.", "a great deal"),
           ("\"I do not know,\" said [MASK] .", "said Syme"))


def _training_files(metadata: dict) -> list[str]:
    files = []
    for path in metadata.get("input", {}).get("paths", []):
        if os.path.isdir(path):
            files += [os.path.join(d, f) for d, _, names in os.walk(path) for f in sorted(names)
                      if f.endswith(".txt")]
        elif os.path.isfile(path):
            files.append(path)
    return sorted(files)


def describe_training(workdir: str, experiment: ml_collections.ConfigDict) -> tuple[str, str]:
    """One paragraph on what the model saw, and the training text (for counting phrases)."""
    meta_path = os.path.join(experiment.data.directory or "", "metadata.json")
    if not os.path.isfile(meta_path):
        return f"trained on {experiment.data.directory}", ""
    with open(meta_path, encoding="utf-8") as f:
        metadata = json.load(f)
    files = _training_files(metadata)
    titles = []
    text = ""
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            body = f.read()
        text += body + "\n"
        first = body.lstrip().splitlines()[0] if body.strip() else ""
        title = first.strip("[] ") if first.startswith("[") else os.path.basename(path)
        titles.append(f"{title} ({len(body.encode('utf-8')) / 1e3:.0f} KB)")
    info = metadata.get("input", {})
    model = experiment.model
    shown = experiment.data.get("mask_token_fraction", 0.8)
    random_ = experiment.data.get("random_token_fraction", 0.1)
    kept = max(0.0, 1.0 - shown - random_)
    lines = [
        f"trained on: {'; '.join(titles) or info.get('paths')}",
        f"  {info.get('tokens', '?'):,} tokens in {info.get('documents', '?')} documents "
        f"(chapters), {info.get('eval_documents', '?')} of them held out for evaluation; "
        f"a {metadata.get('tokenizer', {}).get('vocab_size', '?')}-piece tokenizer trained on "
        "the same text",
        f"  model: {experiment.model.preset} preset ({_layers(model)}), from random weights; "
        f"{experiment.num_train_steps} steps of {experiment.global_batch_size} sequences of "
        f"{experiment.data.max_seq_length} tokens, {experiment.data.masked_lm_prob:.0%} of "
        "the tokens masked afresh in every batch "
        f"({shown:.0%} of them shown as [MASK], {random_:.0%} as a random token, "
        f"{kept:.0%} unchanged)",
    ]
    return "\n".join(lines), text


def _layers(model: ml_collections.ConfigDict) -> str:
    from bert_jax.config import get_preset

    config = get_preset(model.preset)
    return (f"{config.num_hidden_layers} layers, hidden size {config.hidden_size}, "
            f"{config.num_attention_heads} heads")


def mask_position_accuracy(workdir: str, experiment: ml_collections.ConfigDict,
                           tokenizer, most_frequent_id: int) -> dict[str, float]:
    """Held-out accuracy where the input shows [MASK] (``data.mask_token_fraction`` of the
    masked positions; the rest are left unchanged or replaced at random, and an unchanged token
    can simply be copied): the model's, and the unigram baseline's on the same positions."""
    logits_fn, config = checkpoint_logits(workdir)
    scores = masked_lm_scores(logits_fn, eval_batches(experiment, config.vocab_size, tokenizer),
                              tokenizer.mask_id, config.vocab_size,
                              baseline_id=most_frequent_id)
    return {"model": scores["mask_accuracy"], "baseline": scores["mask_baseline_accuracy"],
            "tokens": scores["mask_tokens"]}


def main() -> int:
    for key, value in QUIET_ENVIRONMENT.items():  # as the bert-jax command does
        os.environ.setdefault(key, value)
    quiet_libtpu_without_tpus()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir")
    parser.add_argument("--text", action="append", help="sentence with [MASK] (repeatable)")
    parser.add_argument("--top-k", type=int, default=3, help="fillers shown per [MASK]")
    args = parser.parse_args()
    with open(os.path.join(args.workdir, "config.json"), encoding="utf-8") as f:
        experiment = ml_collections.ConfigDict(json.load(f)["experiment"])
    tokenizer = load_tokenizer(os.path.join(args.workdir, "tokenizer"))
    baseline = unigram_baseline(experiment, tokenizer.vocab_size, tokenizer=tokenizer)
    description, corpus = describe_training(args.workdir, experiment)
    print(f"\n{description}")

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
        at_mask = mask_position_accuracy(args.workdir, experiment, tokenizer,
                                         baseline["most_frequent_id"])
        print(f"held-out accuracy at the [MASK] positions alone: {at_mask['model']:.3f}; "
              f"unigram baseline {at_mask['baseline']:.3f} ({at_mask['tokens']} tokens)")
        print(f"(unigram baseline: always the most frequent training token, "
              f"{tokenizer.id_to_token(baseline['most_frequent_id'])!r}, and each token's "
              f"training frequency as its probability; {baseline['tokens']} held-out "
              "masked tokens)")
    png = plot_metrics(args.workdir, baselines={k: baseline[k]
                                                for k in ("mlm_loss", "mlm_accuracy")})
    print(f"curves: {png}")

    from bert_jax.inference import fill_mask, format_fill_mask

    if args.text:
        prompts = [(text, None) for text in args.text]
    else:
        prompts = [(text, phrase) for text, phrase in PROMPTS
                   if corpus and _count(corpus, phrase)]
    if not prompts:
        return 0
    print(f"\nfill-mask (top {args.top_k}; the prompts use phrases that recur in the "
          "training text, counted in brackets):")
    texts = [text for text, _ in prompts]
    for (text, phrase), masks in zip(prompts, fill_mask(args.workdir, texts, top_k=args.top_k),
                                     strict=True):
        seen = f"  [{phrase!r} {_count(corpus, phrase)}x]" if phrase else ""
        print(f"  {format_fill_mask(text, masks)}{seen}")
    return 0


def _count(text: str, phrase: str) -> int:
    """Occurrences of ``phrase`` as whole words (any whitespace between them)."""
    words = r"\s+".join(re.escape(w) for w in phrase.split())
    return len(re.findall(rf"(?<!\w){words}(?!\w)", text))


if __name__ == "__main__":
    raise SystemExit(main())
