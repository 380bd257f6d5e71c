#!/usr/bin/env bash
# make demo, fine-tuning step: a task the demo makes itself from its corpus (which of the two
# books a sentence comes from: Austen or Chesterton), as your own data would be (a TSV with a
# sentence and a book column, experiments/custom.py:classification), fine-tuned from the
# demo's pretraining checkpoint; prints the dev accuracy per epoch (chance is 0.5).
#
#   scripts/demo_finetune.sh PRETRAIN_WORKDIR [CORPUS ...]   (default corpus: bert_jax/demo_data)
#
# Environment: DEMO_DIR (output root, default demo_workdir), DEMO_FT_EPOCHS (default 10),
# DEMO_FT_LR (default 2e-3: the tiny demo model wants more than BERT-Base's 2e-5),
# DEMO_FT_EXAMPLES (at most this many train rows, default 2000), DEMO_FT_EXTRA (extra
# --config.key=value), DEMO_WRITE_DOCS=1 (write the output into docs/finetuning.md and the
# README's marked blocks; DEMO_DOCS_ROOT names another copy of the repository).
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

mkdir -p "$out"
echo "== fine-tune 1/2: make the task (which book is a sentence from?) in $out/which_book_data"
(python - "$out/which_book_data" "${DEMO_FT_EXAMPLES:-2000}" "${corpus[@]}" <<'PY'
import os, random, re, sys

out, n_train, paths = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
files = sorted(os.path.join(d, f) for p in paths for d, _, fs in
               (os.walk(p) if os.path.isdir(p) else [(os.path.dirname(p), None,
                                                      [os.path.basename(p)])])
               for f in fs if f.endswith(".txt"))
if len(files) < 2:
    sys.exit(f"need two text files (two authors) in {paths}; found {files}")
rng = random.Random(0)
books = [os.path.splitext(os.path.basename(f))[0] for f in files[:2]]
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
    rows = [(s, book) for book, sents in zip(books, by_author) for s in sents[lo:hi]]
    rng.shuffle(rows)
    with open(os.path.join(out, f"{split}.tsv"), "w", encoding="utf-8") as f:
        f.write("sentence\tbook\n")
        f.writelines(f"{s}\t{y}\n" for s, y in rows)
print(f"{2 * n_train} train and {2 * n_dev} dev sentences ({n_dev} per book, so chance is "
      f"0.5), labelled {books[0]} or {books[1]}")
PY
) | tee "$out/finetune_output.txt"

echo "== fine-tune 2/2: fine-tune $checkpoint on it"
# shellcheck disable=SC2086
PYTHONUNBUFFERED=1 bert-jax finetune --config "$here/experiments/custom.py:classification" \
  --workdir "$out/which_book" --config.init_checkpoint="$checkpoint" \
  --config.train_file="$out/which_book_data/train.tsv" \
  --config.dev_file="$out/which_book_data/dev.tsv" \
  --config.text_column=sentence --config.label_column=book \
  --config.max_seq_length=64 --config.epochs="${DEMO_FT_EPOCHS:-10}" \
  --config.optimizer.learning_rate="${DEMO_FT_LR:-2e-3}" --config.log_every=0 \
  ${DEMO_FT_EXTRA:-} | tee -a "$out/finetune_output.txt"
if [ -n "${DEMO_WRITE_DOCS:-}" ]; then
  python "$here/scripts/demo_docs.py" finetune "$out" --root "${DEMO_DOCS_ROOT:-$here}"
fi
