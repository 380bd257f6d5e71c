#!/usr/bin/env bash
# make demo: raw text -> SentencePiece tokenizer -> pretraining data -> pretrain a tiny BERT on
# the CPU (about 5 minutes on 2 cores), then show what it learned: what it was
# trained on, held-out masked-LM accuracy and loss against the unigram baseline (also at the
# [MASK] positions alone), a PNG of the curves, and fill-mask predictions.
#
#   scripts/demo.sh [CORPUS ...]      text files or directories (default: bert_jax/demo_data)
#
# Environment: DEMO_DIR (output root, default demo_workdir), DEMO_STEPS (default: the demo
# experiment's 2400), DEMO_VOCAB (default 2000), DEMO_EXTRA (extra --config.key=value overrides),
# DEMO_WRITE_DOCS=1 (write the report into docs/pretraining.md's marked block; DEMO_DOCS_ROOT
# names another copy of the repository to write into).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${DEMO_DIR:-demo_workdir}"
vocab="${DEMO_VOCAB:-2000}"
if [ "$#" -gt 0 ]; then corpus=("$@"); else corpus=("$here/bert_jax/demo_data"); fi
steps=()
if [ -n "${DEMO_STEPS:-}" ]; then steps=("--config.num_train_steps=$DEMO_STEPS"); fi
mkdir -p "$out"
SECONDS=0

echo "== 1/4 train a SentencePiece tokenizer (vocab $vocab) on ${corpus[*]}"
bert-jax train-tokenizer --input "${corpus[@]}" --output "$out/tokenizer" --vocab-size "$vocab"

echo "== 2/4 create pretraining data (NSP pairs, seq 32, 5% of documents held out)"
bert-jax create-pretraining-data --input "${corpus[@]}" --tokenizer "$out/tokenizer" \
  --output-dir "$out/data" --max-seq-length 32 --dupe-factor 5 --num-shards 2 \
  --holdout-fraction 0.05 --no-progress

echo "== 3/4 pretrain the tiny model on the CPU (experiments/pretrain.py:demo)"
# shellcheck disable=SC2086
bert-jax pretrain --config "$here/experiments/pretrain.py:demo" --workdir "$out/pretrain" \
  --config.data.directory="$out/data" --config.data.tokenizer="$out/tokenizer" \
  "${steps[@]}" ${DEMO_EXTRA:-}

echo "== 4/4 did it learn? held-out data against the unigram baseline"
python "$here/scripts/demo_report.py" "$out/pretrain" | tee "$out/pretrain_report.txt"
if [ -n "${DEMO_WRITE_DOCS:-}" ]; then
  python "$here/scripts/demo_docs.py" pretrain "$out" --root "${DEMO_DOCS_ROOT:-$here}"
fi

cat <<MSG

Done in ${SECONDS} s. Everything is under $out/:
  tokenizer/            SentencePiece tokenizer
  data/                 TFRecord shards + metadata.json
  pretrain/             config.json, tokenizer/, checkpoints/<step>/, metrics.jsonl,
                        curves.png, tensorboard/ (tensorboard --logdir $out/pretrain/tensorboard)
Next:
  bert-jax fill-mask $out/pretrain --text "It was a [MASK] day."
  bert-jax export $out/pretrain --output $out/hf     # Hugging Face format
  bert-jax plot-metrics $out/pretrain               # redraw curves.png
  Rerunning the pretrain command resumes from the newest checkpoint.
MSG
