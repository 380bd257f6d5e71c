#!/usr/bin/env bash
# make demo: raw text -> SentencePiece tokenizer -> pretraining data -> pretrain a tiny BERT on
# the CPU (a few minutes), with falling loss and rising masked-LM accuracy.
#
#   scripts/demo.sh [CORPUS ...]      text files or directories (default: bert_jax/demo_data)
#
# Environment: DEMO_DIR (output root, default demo_workdir), DEMO_STEPS (default 300),
# DEMO_VOCAB (default 4000), DEMO_EXTRA (extra --config.key=value overrides).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${DEMO_DIR:-demo_workdir}"
steps="${DEMO_STEPS:-300}"
vocab="${DEMO_VOCAB:-4000}"
if [ "$#" -gt 0 ]; then corpus=("$@"); else corpus=("$here/bert_jax/demo_data"); fi
corpus_files=()
for path in "${corpus[@]}"; do
  if [ -d "$path" ]; then
    while IFS= read -r f; do corpus_files+=("$f"); done \
      < <(find "$path" -type f -name '*.txt' | sort)
  else
    corpus_files+=("$path")
  fi
done
mkdir -p "$out"

echo "== 1/3 train a SentencePiece tokenizer (vocab $vocab) on ${corpus[*]}"
bert-jax train-tokenizer --input "${corpus_files[@]}" --output "$out/tokenizer" \
  --vocab-size "$vocab"

echo "== 2/3 create pretraining data (NSP pairs, seq 128, 5% held out)"
bert-jax create-pretraining-data --input "${corpus_files[@]}" --tokenizer "$out/tokenizer" \
  --output-dir "$out/data" --max-seq-length 128 --dupe-factor 5 --num-shards 4 \
  --holdout-fraction 0.05 --no-progress

echo "== 3/3 pretrain the tiny model for $steps steps on the CPU"
# shellcheck disable=SC2086
bert-jax pretrain --config "$here/experiments/pretrain.py:tiny" --workdir "$out/pretrain" \
  --config.data.source=tfrecord --config.data.directory="$out/data" \
  --config.data.tokenizer="$out/tokenizer" --config.num_train_steps="$steps" \
  ${DEMO_EXTRA:-}

python - "$out/pretrain/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
train = [r for r in rows if r["split"] == "train"]
evals = [r for r in rows if r["split"] == "eval"]
print("\nstep   loss    mlm_acc  nsp_acc")
for r in train:
    print(f"{r['step']:>4}  {r['loss']:.3f}   {r['mlm_accuracy']:.3f}    {r['nsp_accuracy']:.3f}")
if evals:
    first, last = evals[0], evals[-1]
    print(f"held-out MLM accuracy: {first['mlm_accuracy']:.3f} (step {first['step']}) -> "
          f"{last['mlm_accuracy']:.3f} (step {last['step']})")
PY

cat <<MSG

Done. Everything is under $out/:
  tokenizer/            SentencePiece tokenizer
  data/                 TFRecord shards + metadata.json
  pretrain/             config.json, tokenizer/, checkpoints/<step>/, metrics.jsonl,
                        tensorboard/ (tensorboard --logdir $out/pretrain/tensorboard)
Next:
  bert-jax fill-mask $out/pretrain --text "It was a [MASK] day."
  bert-jax export $out/pretrain --output $out/hf     # Hugging Face format
  Rerunning the pretrain command resumes from the newest checkpoint.
MSG
