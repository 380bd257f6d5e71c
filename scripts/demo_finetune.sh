#!/usr/bin/env bash
# make demo, fine-tuning step: a grammaticality-like task the demo makes itself (a sentence
# from the demo corpus vs the same words shuffled), in GLUE's SST-2 TSV layout, fine-tuned
# from the demo's pretraining checkpoint; prints the dev accuracy (chance is 0.5).
#
#   scripts/demo_finetune.sh PRETRAIN_WORKDIR [CORPUS ...]   (default corpus: bert_jax/demo_data)
#
# Environment: DEMO_DIR (output root, default demo_workdir), DEMO_FT_EPOCHS (default 2),
# DEMO_FT_EXAMPLES (train rows, default 2000), DEMO_FT_EXTRA (extra --config.key=value).
set -euo pipefail

if [ "$#" -lt 1 ]; then
  echo "usage: $0 PRETRAIN_WORKDIR [CORPUS ...]" >&2
  exit 2
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
checkpoint="$1"
shift
out="${DEMO_DIR:-demo_workdir}"
if [ "$#" -gt 0 ]; then corpus=("$@"); else corpus=("$here/bert_jax/demo_data"); fi

echo "== fine-tune 1/2: make the task (real vs shuffled sentences) in $out/shuffle_task"
python - "$out/shuffle_task" "${DEMO_FT_EXAMPLES:-2000}" "${corpus[@]}" <<'PY'
import os, random, re, sys

out, n_train, paths = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
files = sorted(os.path.join(d, f) for p in paths for d, _, fs in
               (os.walk(p) if os.path.isdir(p) else [(os.path.dirname(p), None,
                                                      [os.path.basename(p)])])
               for f in fs if f.endswith(".txt"))
text = " ".join(open(f, encoding="utf-8", errors="replace").read() for f in files)
sentences = [" ".join(s.split()) for s in re.split(r"(?<=[.!?])\s+", text)]
sentences = [s for s in sentences if 6 <= len(s.split()) <= 30 and "\t" not in s]
rng = random.Random(0)
rng.shuffle(sentences)
n_dev = max(200, n_train // 5)
if len(sentences) < n_train + n_dev:
    sys.exit(f"corpus has {len(sentences)} usable sentences; need {n_train + n_dev}")

def rows(chunk):
    for i, s in enumerate(chunk):
        if i % 2:
            yield s, "1"
        else:
            words = s.split()
            while words == s.split():
                rng.shuffle(words)
            yield " ".join(words), "0"

os.makedirs(out, exist_ok=True)
for split, chunk in (("train", sentences[:n_train]),
                     ("dev", sentences[n_train:n_train + n_dev])):
    with open(os.path.join(out, f"{split}.tsv"), "w", encoding="utf-8") as f:
        f.write("sentence\tlabel\n")
        f.writelines(f"{s}\t{y}\n" for s, y in rows(chunk))
print(f"{n_train} train and {n_dev} dev rows (half shuffled) from {len(files)} files")
PY

echo "== fine-tune 2/2: fine-tune $checkpoint on it"
# shellcheck disable=SC2086
bert-jax finetune --config "$here/experiments/glue.py:sst2" --workdir "$out/finetune" \
  --config.init_checkpoint="$checkpoint" --config.data_dir="$out/shuffle_task" \
  --config.max_seq_length=64 --config.epochs="${DEMO_FT_EPOCHS:-2}" \
  --config.learning_rate=1e-4 --config.log_every=20 ${DEMO_FT_EXTRA:-}

python - "$out/finetune/metrics.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
for e in m["epochs"]:
    print(f"epoch {e['epoch']}: train loss {e['train_loss']:.3f}, "
          f"dev accuracy {e['dev']['accuracy']:.3f}")
print(f"\nreal vs shuffled sentences: dev accuracy {m['best']['value']:.3f} "
      f"(chance 0.5), best epoch {m['best']['epoch']}; model in {sys.argv[1].rsplit('/', 1)[0]}")
PY
