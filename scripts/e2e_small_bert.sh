#!/usr/bin/env bash
# End-to-end proof: pretrain a small BERT from raw text on one GPU, fine-tune it and an
# identically configured random init on SST-2, CoLA, MRPC, STS-B and RTE, report both.
# Model, schedule and sizes: experiments/e2e.py. Results: docs/results.md.
#
#   scripts/e2e_small_bert.sh cpu-prep CORPUS_DIR GLUE_DIR   # with tensorflow (~3 min, 2 cores)
#   scripts/e2e_small_bert.sh gpu-pretrain                   # GPU, no tensorflow
#   scripts/e2e_small_bert.sh gpu-finetune                   # GPU, same machine (reads E2E_WORK)
#   scripts/e2e_small_bert.sh report RESULTS_DIR             # anywhere: tables + PNGs into docs/
#
# Environment:
#   E2E_SCALE     gpu (default) | check (CPU validation: 2 x 128 model, 30 steps, 100 rows, 1 epoch)
#   E2E_DATA      prepared inputs (default e2e_data; git-ignored, carried to the GPU machine):
#                 tokenizer/, batches/{train,eval}/ (materialized), glue/<Task>/{train,dev}.tsv
#   E2E_PREP      tensorflow-side intermediates (default e2e_prep; never carried): TFRecords
#   E2E_WORK      run outputs (default e2e_work): pretrain/ (checkpoint), ft/<init>/<task>/seed<N>/
#   OUT           where the results files go (default e2e_out); bring $OUT back for `report`
#   E2E_TASKS     default "sst2 cola mrpc stsb rte";  E2E_SEEDS  default "0 1"
#   E2E_INITS     default "pretrained random";        E2E_PARALLEL  fine-tuning processes (4)
#
# GPU time estimate (one H100, ~40% MFU of ~750 TFLOP/s = 300 TFLOP/s; bench/common.py FLOPs):
#   gpu-pretrain: 6 x 512, vocab 8192, seq 128, 20 predictions -> 1.56e10 FLOP/sequence;
#     7,000 steps x 256 = 1.79e6 sequences = 2.8e16 FLOP = ~93 s at 40% MFU (~190 s if a
#     512-wide model only reaches 20%), + ~60 s start-up and compilation, + 8 evaluations of 5
#     batches (negligible): 2.5-4.5 min.
#   gpu-finetune: 2 inits x 2 seeds x (20,000 + 7,696 + 3,301 + 5,174 + 2,241 rows) x 3 epochs
#     = 4.6e5 sequences x ~1.5e10 FLOP (6 x 512 encoder at seq 128, no MLM head) = 6.9e15 FLOP:
#     ~25 s of compute. The cost is per run: ~15 s process start, featurization and
#     compilation (shared through the persistent compilation cache: identical shapes across
#     inits and seeds) + ~3,600 steps at a few ms of dispatch each; 20 runs, 4 at a time
#     (E2E_PARALLEL): 3-5 min.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
scale="${E2E_SCALE:-gpu}"
data="${E2E_DATA:-e2e_data}"
prep="${E2E_PREP:-e2e_prep}"
work="${E2E_WORK:-e2e_work}"
out="${OUT:-e2e_out}"
tasks="${E2E_TASKS:-sst2 cola mrpc stsb rte}"

bench_e2e() {  # python -m bench quality e2e ARGS... (the repository's bench package)
  PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" python -m bench quality e2e "$@"
}
seeds="${E2E_SEEDS:-0 1}"
inits="${E2E_INITS:-pretrained random}"
parallel="${E2E_PARALLEL:-4}"
experiment="$here/experiments/e2e.py"
# The repository's bert_jax, whether or not it is installed (python -m bert_jax = bert-jax).
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
bert_jax() { python -m bert_jax "$@"; }
case "$scale" in
  gpu) suffix="" ;;
  check) suffix="_check" ;;
  *) echo "E2E_SCALE=$scale: expected gpu or check" >&2; exit 2 ;;
esac

# One value of experiments/e2e.py, e.g. setting PREP check batch_size.
setting() {
  python - "$experiment" "$@" <<'PY'
import runpy, sys
value = runpy.run_path(sys.argv[1])[sys.argv[2]]
for key in sys.argv[3:]:
    value = value[key]
print(value)
PY
}

stage_start=$SECONDS
finish() {  # GPU stages also leave their time in $OUT for the report
  local seconds=$((SECONDS - stage_start))
  echo "== stage $1 done in ${seconds} s"
  if [[ "$1" == gpu-* ]]; then
    printf '{"stage": "%s", "scale": "%s", "seconds": %d}\n' "$1" "$scale" "$seconds" \
      > "$out/time_$1.json"
  fi
}

cpu_prep() {
  local corpus="$1" glue="$2"
  local vocab steps eval_steps batch preds
  vocab="$(setting VOCAB_SIZE)"
  preds="$(setting MAX_PREDICTIONS)"
  steps="$(setting PREP "$scale" train_steps)"
  eval_steps="$(setting PREP "$scale" eval_steps)"
  batch="$(setting PREP "$scale" batch_size)"
  # Corpus text only: no MANIFEST.tsv, README files or Reuters' category/stopword lists.
  mkdir -p "$prep" "$data"
  find "$corpus" -type f ! -name MANIFEST.tsv ! -name README ! -name cats.txt \
    ! -name stopwords | LC_ALL=C sort > "$prep/corpus_files.txt"
  mapfile -t files < "$prep/corpus_files.txt"
  echo "== corpus: ${#files[@]} files, $(du -ch "${files[@]}" | tail -1 | cut -f1)"

  if [ -f "$data/tokenizer/tokenizer.json" ]; then
    echo "== 1/4 tokenizer: reusing $data/tokenizer"
  else
    echo "== 1/4 SentencePiece unigram tokenizer, vocab $vocab"
    bert_jax train-tokenizer --input "${files[@]}" --output "$data/tokenizer" \
      --vocab-size "$vocab" --model-type unigram --seed 0
  fi
  if [ -f "$prep/pretrain_data/metadata.json" ]; then
    echo "== 2/4 NSP data: reusing $prep/pretrain_data"
  else
    echo "== 2/4 NSP pretraining data, seq 128, 2% of documents held out"
    bert_jax create-pretraining-data --input "${files[@]}" --tokenizer "$data/tokenizer" \
      --output-dir "$prep/pretrain_data" --max-seq-length 128 --mode nsp --dupe-factor 2 \
      --num-shards 16 --holdout-fraction 0.02 --seed 12345 --no-progress
  fi
  echo "== 3/4 materialize $steps x $batch train and $eval_steps x $batch held-out batches"
  rm -rf "$data/batches"
  bert_jax materialize-batches --data-dir "$prep/pretrain_data" --output "$data/batches/train" \
    --steps "$steps" --batch-size "$batch" --max-predictions "$preds" --seed 0 \
    --tokenizer "$data/tokenizer" --no-progress
  bert_jax materialize-batches --data-dir "$prep/pretrain_data" --output "$data/batches/eval" \
    --split eval --steps "$eval_steps" --batch-size "$batch" --max-predictions "$preds" \
    --seed 1 --tokenizer "$data/tokenizer" --no-progress
  echo "== 4/4 GLUE train/dev splits (dev held out from train, seed 1234)"
  python "$here/scripts/e2e_glue_data.py" --glue "$glue" --output "$data/glue"
  local size
  size=$(du -sm "$data" | cut -f1)
  echo "== $data: ${size} MiB (carry it; the device copy holds 64 MiB with the repository)"
  if [ "$size" -gt 58 ]; then
    echo "error: $data is ${size} MiB; lower PREP train_steps in experiments/e2e.py" >&2
    exit 1
  fi
}

# GPU machines without ml_collections / sentencepiece: install the wheels
# carried in .whl/ (no index, no network) into /tmp/site.
ensure_deps() {
  python -c "import ml_collections, sentencepiece" 2>/dev/null && return 0
  if ! ls "$here"/.whl/*.whl > /dev/null 2>&1; then
    echo "error: ml_collections or sentencepiece missing and no .whl/ carried" >&2
    exit 1
  fi
  python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$here"/.whl/*.whl
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
}

gpu_pretrain() {
  ensure_deps
  mkdir -p "$work" "$out"
  bert_jax pretrain --config "$experiment:pretrain$suffix" --workdir "$work/pretrain" \
    --config.data.directory="$data/batches/train" \
    --config.data.eval_directory="$data/batches/eval" \
    --config.data.tokenizer="$data/tokenizer"
  cp "$work/pretrain/metrics.jsonl" "$out/pretrain_metrics.jsonl"
  cp "$work/pretrain/config.json" "$out/pretrain_config.json"
  bench_e2e pretrain-summary "$out/pretrain_metrics.jsonl"
}

gpu_finetune() {
  if [[ " $inits " == *" pretrained "* ]] && [ ! -f "$work/pretrain/config.json" ]; then
    echo "error: no pretrained model in $work/pretrain (run gpu-pretrain on this machine)" >&2
    exit 2
  fi
  ensure_deps
  mkdir -p "$work/ft" "$out"
  # Identical shapes across inits and seeds compile once for all processes.
  export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-$work/jax_cache}"
  export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-$(python -c \
    "print(round(0.9 / $parallel, 3))")}"
  local jobs="$work/ft/jobs.txt"
  : > "$jobs"
  for seed in $seeds; do
    for task in $tasks; do  # the longest task (sst2) first keeps the parallel slots busy
      for init in $inits; do
        echo "$init $task $seed" >> "$jobs"
      done
    done
  done
  echo "== $(wc -l < "$jobs") fine-tuning runs, $parallel at a time (logs: $work/ft/*/*/*/log.txt)"
  export E2E_SUFFIX="$suffix" E2E_EXPERIMENT="$experiment" E2E_DATA_DIR="$data" \
    E2E_WORK_DIR="$work"
  local status=0
  # shellcheck disable=SC2016
  xargs -P "$parallel" -L 1 bash -c '
    init=$0 task=$1 seed=$2
    dir="$E2E_WORK_DIR/ft/$init/$task/seed$seed"
    mkdir -p "$dir"
    if [ "$init" = pretrained ]; then
      source_args=(--config.init_checkpoint="$E2E_WORK_DIR/pretrain")
    else
      source_args=(--config.tokenizer="$E2E_DATA_DIR/tokenizer")
    fi
    start=$SECONDS
    if python -m bert_jax finetune --config "$E2E_EXPERIMENT:finetune_$task$E2E_SUFFIX" \
        --workdir "$dir" --config.data_dir="$E2E_DATA_DIR/glue" --config.seed="$seed" \
        "${source_args[@]}" > "$dir/log.txt" 2>&1; then
      echo "   $init $task seed $seed: $((SECONDS - start)) s"
    else
      echo "   $init $task seed $seed FAILED; tail of $dir/log.txt:"; tail -20 "$dir/log.txt"
      exit 255
    fi' < "$jobs" || status=$?
  bench_e2e collect "$work/ft" --output "$out/finetune_results.json"
  return "$status"
}

stage="${1:-}"
case "$stage" in
  cpu-prep)
    [ "$#" -eq 3 ] || { echo "usage: $0 cpu-prep CORPUS_DIR GLUE_DIR" >&2; exit 2; }
    cpu_prep "$2" "$3" ;;
  gpu-pretrain) gpu_pretrain ;;
  gpu-finetune) gpu_finetune ;;
  report)
    [ "$#" -eq 2 ] || { echo "usage: $0 report RESULTS_DIR" >&2; exit 2; }
    bench_e2e report "$2" --docs "$here/docs" ;;
  *) echo "usage: $0 cpu-prep CORPUS_DIR GLUE_DIR | gpu-pretrain | gpu-finetune |" \
          "report RESULTS_DIR" >&2; exit 2 ;;
esac
finish "$stage"
