#!/usr/bin/env bash
# The GPU benchmark of docs/performance.md, in stages named by what they measure:
#
#   bash bench/run_gpu.sh STAGE [STAGE...]     (from the repository root)
#
#   env       nvidia-smi, versions and devices -> $OUT/env.txt
#   step      bert-jax pretraining base/128 b256, large/128 b256, large/512 b32 and
#             fine-tuning (classify) base/128 b32; the real loop against the step
#   peers     transformers and the plain Flax step on the same workloads
#   compare   bert-jax then transformers, pair by pair: base/128 pretrain, classify base/128,
#             large/128, large/512 (the published comparison table)
#   kernels   attention, norm, gelu and xent kernels against XLA at BERT's shapes
#   profile   per-kernel time of the base/128 and large/512 pretraining steps
#   scaling   data-parallel efficiency and FSDP memory on every GPU present (needs 2+)
#   quality   GLUE / CoNLL / SQuAD fine-tuning against transformers (needs DATA_ROOT)
#   summary   markdown tables of everything under $OUT -> $OUT/summary.md
#   all       every stage above except quality, in that order
#
# Results: JSON lines under $OUT (default ./bench_out): step.jsonl, peers.jsonl,
# kernels.jsonl, scaling.jsonl, ...; each stage's log in $OUT/<stage>.log. Every run is its own
# process under `timeout` (RUN_TIMEOUT_S, default 900 s); a failed run leaves an "error" record
# and the stage goes on. BENCH_SMOKE=1 shrinks every run to a tiny model and 2 steps (a CPU
# check of this script). PYTHON picks the interpreter (default python3).
set -uo pipefail

OUT=${OUT:-$PWD/bench_out}
PY=${PYTHON:-python3}
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-900}
mkdir -p "$OUT"
export TF_CPP_MIN_LOG_LEVEL=3 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# JAX: 90% of the card; compiled programs cached across runs (timings are unaffected).
JAX_ENV=(env XLA_PYTHON_CLIENT_MEM_FRACTION=0.90 JAX_COMPILATION_CACHE_DIR=/tmp/bert_jax_xla_cache
         JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1)

if [ "${BENCH_SMOKE:-0}" = 1 ]; then
  BASE=tiny; LARGE=tiny; S128=64; S512=128; B256=8; B32=8
  TIMING=(--steps 2 --repeats 1 --warmup 1 --peak-size 128); LOOP=(--steps 6 --log-every 2)
  SCALE=(--per-device-batch 2 --device-counts "1,2" --steps 2 --repeats 1 --warmup 1)
  KERNEL_SHAPES=(attention:2x64x2x16 norm:1x16x128 gelu:1x16x256 xent:1x8x64)
  KERNEL_OPTS=(--iters 1 --repeats 1 --tune none --blocks default --sum-blocks 0
               --block-rows 8 --num-warps 4 --hold "" --summed "" --vocab 256)
else
  BASE=base; LARGE=large; S128=128; S512=512; B256=256; B32=32
  TIMING=(--steps 20 --repeats 3 --warmup 3); LOOP=(--steps 120 --log-every 20)
  SCALE=(--per-device-batch 128)
  KERNEL_SHAPES=(attention: norm: gelu: xent:); KERNEL_OPTS=(--tune none)
fi

bench() {  # bench SUITE [MODE] [options...]: one `python -m bench` run; failures are recorded
  local suite=$1 t0=$SECONDS rc
  echo "=== $(date +%T) python -m bench $*" | tee -a "$LOG"
  timeout "$RUN_TIMEOUT_S" "${JAX_ENV[@]}" "$PY" -m bench "$@" --out "$OUT" >>"$LOG" 2>&1
  rc=$?
  echo "    rc=$rc $(( SECONDS - t0 ))s"
  if (( rc != 0 )); then
    tail -n 8 "$LOG" | sed 's/^/    | /'
    "$PY" -c 'import json, sys; print(json.dumps({"command": sys.argv[2:], "error": f"exit code {sys.argv[1]}"}))' \
      "$rc" "$@" >>"$OUT/$suite.jsonl"
  fi
}

# workloads: MODEL SEQ BATCH
PRETRAIN=("$BASE $S128 $B256" "$LARGE $S128 $B256" "$LARGE $S512 $B32")

stage_env() {
  {
    date -u; nvidia-smi || echo "no nvidia-smi"
    for name in jax jaxlib flax optax torch transformers; do
      "$PY" -c "import $name; print('$name', $name.__version__)" 2>/dev/null || echo "$name missing"
    done
    XLA_PYTHON_CLIENT_PREALLOCATE=false "$PY" -c "import jax; print('jax devices:', jax.devices())"
    git rev-parse HEAD 2>/dev/null
  } >"$OUT/env.txt" 2>&1
  cat "$OUT/env.txt"
}

step_pair() {  # step_pair TASK MODEL SEQ BATCH: bert-jax, then transformers
  local task=$1 model=$2 seq=$3 batch=$4
  if [ "$task" = pretrain ]; then
    bench step pretrain --model "$model" --seq-len "$seq" --batch-size "$batch" "${TIMING[@]}" --tag core
  else
    bench step finetune --model "$model" --seq-len "$seq" --batch-size "$batch" "${TIMING[@]}" --tag core
  fi
  bench peers transformers --task "$task" --model "$model" --seq-len "$seq" --batch-size "$batch"
}

stage_step() {
  for w in "${PRETRAIN[@]}"; do
    read -r model seq batch <<<"$w"
    bench step pretrain --model "$model" --seq-len "$seq" --batch-size "$batch" "${TIMING[@]}" --tag core
  done
  bench step finetune --model "$BASE" --seq-len "$S128" --batch-size "$B32" "${TIMING[@]}" --tag core
  bench step loop --model "$BASE" --seq-len "$S128" --batch-size "$B256" "${LOOP[@]}" --compare-step
}

stage_peers() {
  for w in "${PRETRAIN[@]}"; do
    read -r model seq batch <<<"$w"
    bench peers transformers --task pretrain --model "$model" --seq-len "$seq" --batch-size "$batch"
    bench peers flax --model "$model" --seq-len "$seq" --batch-size "$batch" "${TIMING[@]}"
  done
  bench peers transformers --task classify --model "$BASE" --seq-len "$S128" --batch-size "$B32"
}

stage_compare() {
  step_pair pretrain "$BASE" "$S128" "$B256"
  step_pair classify "$BASE" "$S128" "$B32"
  step_pair pretrain "$LARGE" "$S128" "$B256"
  step_pair pretrain "$LARGE" "$S512" "$B32"
}

stage_kernels() {
  for spec in "${KERNEL_SHAPES[@]}"; do
    local kernel=${spec%%:*} shapes=${spec#*:}
    bench kernels --kernel "$kernel" ${shapes:+--shapes "$shapes"} "${KERNEL_OPTS[@]}"
  done
}

stage_profile() {
  for w in "$BASE $S128 $B256" "$LARGE $S512 $B32"; do
    read -r model seq batch <<<"$w"
    local name=profile_${model}_${seq}
    timeout "$RUN_TIMEOUT_S" "${JAX_ENV[@]}" "$PY" -m bench profile --task pretrain --model "$model" \
      --seq-len "$seq" --batch-size "$batch" --out "$OUT/$name" >>"$LOG" 2>&1 \
      && cat "$OUT/$name/summary.md" || echo "    profile $name failed (see $LOG)"
  done
}

stage_scaling() { bench scaling run --model "$LARGE" --seq-len "$S128" "${SCALE[@]}"; }

stage_quality() {
  : "${DATA_ROOT:?set DATA_ROOT to the folder with glue/, conll2003/, squad/}"
  timeout 3600 "${JAX_ENV[@]}" "$PY" -m bench quality finetune --data-root "$DATA_ROOT" \
    --out "$OUT/quality" >>"$LOG" 2>&1 && cat "$OUT/quality/quality_finetune.md"
}

stage_summary() { "$PY" -m bench summary "$OUT" | tee "$OUT/summary.md"; }

STAGES=${*:-all}
[ "$STAGES" = all ] && STAGES="env step peers kernels profile scaling summary"
for stage in $STAGES; do
  if ! declare -F "stage_$stage" >/dev/null; then
    echo "error: unknown stage '$stage' (env step peers compare kernels profile scaling quality summary all)" >&2
    exit 2
  fi
  LOG=$OUT/$stage.log
  echo "##### stage $stage -> $LOG"
  "stage_$stage"
done
