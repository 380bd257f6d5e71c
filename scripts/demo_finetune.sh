#!/usr/bin/env bash
# make demo, fine-tuning step: a task the demo makes itself from its corpus (which of the two
# books a sentence comes from: Austen or Chesterton), in GLUE's SST-2 TSV layout, fine-tuned
# from the demo's pretraining checkpoint; prints the dev accuracy (chance is 0.5).
#
#   scripts/demo_finetune.sh PRETRAIN_WORKDIR [CORPUS ...]   (default corpus: bert_jax/demo_data)
#
# Environment: DEMO_DIR (output root, default demo_workdir), DEMO_FT_EPOCHS (default 10),
# DEMO_FT_LR (default 2e-3: the tiny demo model wants more than BERT-Base's 2e-5),
# DEMO_FT_EXAMPLES (at most this many train rows, default 2000), DEMO_FT_EXTRA (extra --config.key=value).
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

echo "== fine-tune 1/2: make the task (which book is a sentence from?) in $out/author_task"
python - "$out/author_task" "${DEMO_FT_EXAMPLES:-2000}" "${corpus[@]}" <<'PY'
import os, random, re, sys

out, n_train, paths = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
files = sorted(os.path.join(d, f) for p in paths for d, _, fs in
               (os.walk(p) if os.path.isdir(p) else [(os.path.dirname(p), None,
                                                      [os.path.basename(p)])])
               for f in fs if f.endswith(".txt"))
if len(files) < 2:
    sys.exit(f"need two text files (two authors) in {paths}; found {files}")
rng = random.Random(0)
by_author = []
for path in files[:2]:
    text = open(path, encoding="utf-8", errors="replace").read()
    sentences = [" ".join(s.split()) for s in re.split(r"(?<=[.!?])\s+", text)]
    sentences = [s for s in sentences if 5 <= len(s.split()) <= 40 and "\t" not in s]
    rng.shuffle(sentences)
    by_author.append(sentences)
per_author = min(len(s) for s in by_author)
n_dev = 100  # per author
if per_author < 200 + n_dev:
    sys.exit(f"only {per_author} usable sentences per author; need {200 + n_dev}")
n_train = min(n_train // 2, per_author - n_dev)
os.makedirs(out, exist_ok=True)
for split, lo, hi in (("train", 0, n_train), ("dev", n_train, n_train + n_dev)):
    rows = [(s, str(label)) for label, sents in enumerate(by_author) for s in sents[lo:hi]]
    rng.shuffle(rows)
    with open(os.path.join(out, f"{split}.tsv"), "w", encoding="utf-8") as f:
        f.write("sentence\tlabel\n")
        f.writelines(f"{s}\t{y}\n" for s, y in rows)
print(f"{2 * n_train} train and {2 * n_dev} dev sentences: label 0 = {files[0]}, "
      f"1 = {files[1]}")
PY

echo "== fine-tune 2/2: fine-tune $checkpoint on it"
# shellcheck disable=SC2086
bert-jax finetune --config "$here/experiments/glue.py:sst2" --workdir "$out/finetune" \
  --config.init_checkpoint="$checkpoint" --config.data_dir="$out/author_task" \
  --config.max_seq_length=64 --config.epochs="${DEMO_FT_EPOCHS:-10}" \
  --config.optimizer.learning_rate="${DEMO_FT_LR:-2e-3}" --config.log_every=20 ${DEMO_FT_EXTRA:-}

python - "$out/finetune/metrics.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
for e in m["epochs"]:
    print(f"epoch {e['epoch']}: train loss {e['train_loss']:.3f}, "
          f"dev accuracy {e['dev']['accuracy']:.3f}")
print(f"\nwhich book (2 authors): dev accuracy {m['best']['value']:.3f} "
      f"(chance 0.5), best epoch {m['best']['epoch']}; model in {sys.argv[1].rsplit('/', 1)[0]}")
PY
