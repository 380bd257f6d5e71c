#!/usr/bin/env bash
# The whole GPU benchmark, in stages that each fit one 10-minute call:
#
#   bash bench/run_gpu.sh STAGE        STAGE = env | core | peer | levers | levers-large |
#                                              loop | scaling | dropout | profile | qkv |
#                                              profile-large | attention-tune | flash-tune |
#                                              batch | large128 | biasgrad |
#                                              gelu | fused | tune | final | nodrop |
#                                              packed | verify | gemmnorm | normtune |
#                                              normshort | gradsums | xent | pairs |
#                                              plain | plain-large | plain-dropout |
#                                              blocks12 | cudnndrop | gemmgelu |
#                                              remaining |
#                                              layernorm | pending | finetune | hash | all
#   bash bench/run_gpu.sh "finetune loop"   several stages in one call, in order
#
# Run from the repository root. Results go to $OUT/bench.jsonl (JSON lines), the stage's log to
# $OUT/<stage>.log, nvidia-smi and versions to $OUT/env.txt, and the markdown summary of
# $OUT/bench.jsonl (plus any files listed in $BENCH_PREVIOUS, colon-separated: results
# fetched from earlier calls) to $OUT/summary.md and stdout. Every configuration runs in
# its own process (JAX's allocator and torch never share one), under `timeout`; a failed or
# skipped run leaves an "error" record and the stage goes on.
#
# Estimated wall time on one H100 (compilation dominates: ~30-60 s for Base, ~60-120 s for an
# unrolled Large; torch.compile ~1-2 min per config; the timed steps are seconds):
#   env            ~10 s
#   core           ~6 min   bert-jax pretrain base/128 b256, large/128 b256, large/512 b32;
#                           fine-tune base/128 b32
#   peer           ~7 min   transformers (bf16 autocast, SDPA, torch.compile, fused AdamW) on
#                           the same four workloads
#   levers         ~9 min   base/128 b256: each lever toggled once against the baseline
#   levers-large   ~8 min   large/512 b32 and large/128 b256: the attention/scan levers
#   loop           ~3 min   bert-jax pretrain (the real loop) on materialized batches vs the step
#   dropout        ~8 min   hidden dropout: hash masks (default) vs Flax nn.Dropout (prng) on
#                           base/128 pretrain and classify, large/512 pretrain
#   profile        ~3 min   bench/profile_step.py kernel tables: base/128 pretrain b256 and
#                           classify b32 (traces and summaries under $OUT/profile-*)
#   profile-large  ~3 min   the same kernel table for pretrain large/512 b32 ($OUT/profile-*.tgz)
#   attention-tune ~3 min   bench_attention.py at 32x512x16x64: the "long" block sweep of the
#                           flash kernel ($OUT/attention.jsonl)
#   flash-tune     ~5 min   the flash kernel: block/stage sweep at 256x128x12x64, then base/128
#                           with the best setting vs the default
#   remaining      ~6 min   base/128: --no-donate and --attention xla (no dropout) against the
#                           baseline and cuDNN without dropout; bench/probe_bias_epilogue.py
#                           ($OUT/probe.jsonl, probe-hlo.tgz); a profile of the default step
#   batch          ~3 min   the largest-batch lever: large/512 b64, base/128 b512
#   large128       ~8 min   large/128 b256 bert-jax and transformers (final's last pair), b512
#   biasgrad       ~6 min   q/k/v bias gradients from the flash kernels (default) vs XLA's
#                           column sums (--qkv-bias-grad xla): base/128, classify, large/512
#   layernorm      ~1 min   base/128 pretrain and classify with --layer-norm flax (two_stage
#                           is the default)
#   pending        ~9 min   unmeasured changes in one call (BUDGET_S=570): base/128 baseline vs
#                           --dropout-hash flat, --layer-norm two_stage, --qkv fused; classify
#                           flax vs two_stage; attention kernels; large/512 rowcol vs flat
#                           hash; a profile (with op attribution) of the default
#   finetune       ~3 min   classify base/128 b32: bert-jax and transformers, same call
#   hash           ~3 min   large/512 b32: --dropout-hash rowcol (default) vs flat
#   nodrop         ~5 min   pretrain base/128, large/128, large/512 with no dropout at all (the
#                           issue's plain-Flax reference has none) and the base/128 default
#   fused          ~8 min   the fifth session's A/B: base/128 --gelu erfc, --layer-norm fused,
#                           --xla-flags graphs; classify; large/512 and large/128 fused; a
#                           profile of the fused LayerNorm step
#   final          ~10 min  bert-jax then transformers, pair by pair: base/128, classify,
#                           large/512, large/128 (what the stage budget leaves out is skipped)
#   tune           ~8 min   the fused LayerNorm kernel: bench_norm.py block sweep ($OUT/norm.jsonl),
#                           then base/128, classify and large/512 with the fastest setting
#                           against the default, and a profile of it
#   gelu           ~3 min   base/128 pretrain and classify: the GELU kernel (default) vs --gelu erfc
#   packed         ~8 min   bench/check_flash_gpu.py (packed vs separate kernels, $OUT/checks.jsonl),
#                           then --qkv packed vs split: base/128, classify, large/512; a profile
#   verify         ~3 min   check_flash_gpu.py, then base/128 pretraining and classify (defaults)
#   gemmnorm       ~9 min   eighth session's A/B (BUDGET_S=580): --xla-flags cublaslt and
#                           --norm-sum-blocks 4 against the defaults on base/128,
#                           classify and large/512; the bias-epilogue probe under cuBLAS-Lt
#                           ($OUT/probe-cublaslt.jsonl, probe-cublaslt-hlo.tgz); the fused
#                           LayerNorm's sum_blocks sweep ($OUT/norm.jsonl)
#   normtune       ~8 min   the fused LayerNorm at the long shapes: a block / warps / sum_blocks
#                           sweep, the fastest setting against the defaults on base/128 and
#                           large/512, a profile of it
#   normshort      ~9 min   the fused LayerNorm sweep at classify's rows and finer long settings;
#                           classify and base/128 with the fastest against the defaults; a
#                           profile of the default base/128 step
#   gradsums       ~9 min   ninth session's A/B (BUDGET_S=570): --residual-grad kernel,
#                           --weight-grad direct, --gelu kernel, each and together, on
#                           base/128; together on classify and large/512; a profile of all
#   xent           ~8 min   tenth session's A/B: the MLM loss kernels alone (bench_xent.py
#                           sweep, $OUT/xent.jsonl), then --mlm-loss kernel (default) vs xla
#                           on base/128 and large/512; a profile of the default base/128 step
#   pairs          ~8 min   bert-jax and transformers at base/128 b256 and large/128 b256
#   blocks12       ~9 min   twelfth session's A/B (BUDGET_S=585): the flash kernel's new
#                           blocks (default) against the eleventh session's (--flash ...)
#                           at base/128 b256, large/512 b32, large/128 b256
#   cudnndrop      ~2 min   thirteenth session: bench/probe_cudnn_dropout.py, cuDNN's attention
#                           with its own dropout: masks and speed ($OUT/probe.jsonl)
#   gemmgelu       ~4 min   fourteenth session: bench/probe_gemm_gelu.py, the MLP's bias + GELU
#                           in the epilogues of a Pallas GEMM against cuBLAS + fused_gelu
#                           ($OUT/probe.jsonl)
#   plain          ~9 min   bert-jax, the issue's plain Flax step (bench/plain_flax.py) and
#                           transformers: base/128 b256, large/512 b32 (BUDGET_S=570)
#   plain-large    ~9 min   the same triple at large/128 b256, then the classify pair
#   plain-dropout  ~8 min   like for like with the plain step: bert-jax with no dropout and
#                           with hidden dropout only, the plain step with hidden dropout;
#                           base/128 b256 and large/512 b32
#   qkv            ~1 min   base/128 pretrain and classify with --qkv fused (split is default)
#   scaling        ~8 min   needs 2+ GPUs (nvidia-h100-x2 / -x4): large/128, 128 per device,
#                           DP on 1..N GPUs and FSDP on 2..N
#   scaling-levers ~13 min  DP at 1 and N GPUs and FSDP at N (all N present), first with the
#                           default flags, then with SCALING_LEVER_ARGS (default: bf16
#                           parameter gathers + the collective-overlap XLA flags); one half per
#                           10-minute call: BUDGET_S=400 runs the first, the second needs a
#                           call of its own (thirteenth session: bench_scaling.py directly);
#                           SCALING_HALF_ARGS=--no-fsdp (DP only, both halves in one call:
#                           ~3.5 min each on 4 H200s)
# Each stage stops starting new runs when its budget (BUDGET_S, default 540 s) would be
# exceeded; skipped runs are listed in the summary, rerun them with a later call.
#
# The device image lacks ml_collections and tensorboardX: carry `.whl` (both wheels) with the
# call; they are installed into /tmp/site here when missing.
#
# BENCH_SMOKE=1 shrinks every run to a tiny model and 2 steps (CPU validation of this script).
set -uo pipefail

STAGE=${1:-all}
OUT=${OUT:-$PWD/bench_out}
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-540}
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-420}
SMOKE=${BENCH_SMOKE:-0}
RESULTS=$OUT/bench.jsonl
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TF_CPP_MIN_LOG_LEVEL=3 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1

if ! "$PY" -c "import ml_collections, tensorboardX" 2>/dev/null; then
  if [ -d .whl ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  else
    echo "ml_collections/tensorboardX missing and no .whl folder carried" >&2
    exit 1
  fi
fi

# JAX runs: own process each, 90% of the card, compiled programs cached across runs of one
# warm machine (same program = no second compile; timings are unaffected).
JAX_ENV=(env XLA_PYTHON_CLIENT_MEM_FRACTION=0.90
         JAX_COMPILATION_CACHE_DIR=/tmp/bert_jax_xla_cache
         JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1)

# Shapes and timing; BENCH_SMOKE replaces them with tiny ones.
if [ "$SMOKE" = 1 ]; then
  BASE=tiny; LARGE=tiny; S128=64; S512=128; B256=8; B32=8; B512=16
  TIMING=(--steps 2 --repeats 1 --warmup 1); LOOP_STEPS=(--steps 6 --log-every 2)
  SCALE=(--per-device-batch 2 --device-counts "1,2" --steps 2 --repeats 1 --warmup 1)
else
  BASE=base; LARGE=large; S128=128; S512=512; B256=256; B32=32; B512=512
  TIMING=(--steps 20 --repeats 3 --warmup 3); LOOP_STEPS=(--steps 120 --log-every 20)
  SCALE=(--per-device-batch 128)
fi

STAGE_START=$(date +%s)
LOG=/dev/null

error_record() {  # error_record TAG TASK MODEL SEQ BATCH MESSAGE
  "$PY" - "$RESULTS" "$@" <<'EOF'
import json, sys
path, tag, task, model, seq, batch, message = sys.argv[1:]
with open(path, "a") as f:
    f.write(json.dumps({"tag": tag, "task": task, "model": model, "seq_len": int(seq),
                        "batch_size": int(batch), "error": message}) + "\n")
EOF
}

run_case() {  # run_case EST_S TAG TASK MODEL SEQ BATCH -- command...
  local est=$1 tag=$2 task=$3 model=$4 seq=$5 batch=$6
  shift 7
  local elapsed=$(( $(date +%s) - STAGE_START ))
  if (( elapsed + est > BUDGET_S )); then
    echo "$(date +%T) SKIP (stage budget: ${elapsed}s used, ~${est}s needed) $tag $task $model/$seq b$batch"
    error_record "$tag" "$task" "$model" "$seq" "$batch" "skipped: stage budget"
    return 0
  fi
  local t0 rc
  t0=$(date +%s)
  echo "=== $(date +%T) $tag $task $model/$seq b$batch: $*" >>"$LOG"
  timeout "$RUN_TIMEOUT_S" "$@" >>"$LOG" 2>&1
  rc=$?
  echo "$(date +%T) rc=$rc $(( $(date +%s) - t0 ))s $tag $task $model/$seq b$batch"
  if (( rc != 0 )); then
    tail -n 8 "$LOG" | sed 's/^/    | /'
    error_record "$tag" "$task" "$model" "$seq" "$batch" "exit code $rc"
  fi
}

pretrain() {  # pretrain EST TAG MODEL SEQ BATCH [bench_pretrain options...]
  local est=$1 tag=$2 model=$3 seq=$4 batch=$5
  shift 5
  run_case "$est" "$tag" pretrain "$model" "$seq" "$batch" -- "${JAX_ENV[@]}" \
    "$PY" bench/bench_pretrain.py --model "$model" --seq-len "$seq" --batch-size "$batch" \
    "${TIMING[@]}" --tag "$tag" --out "$RESULTS" "$@"
}

classify() {  # classify EST TAG [bench_finetune options...]  (base/128, batch 32)
  local est=$1 tag=$2
  shift 2
  run_case "$est" "$tag" classify "$BASE" "$S128" "$B32" -- "${JAX_ENV[@]}" \
    "$PY" bench/bench_finetune.py --model "$BASE" --seq-len "$S128" --batch-size "$B32" \
    "${TIMING[@]}" --tag "$tag" --out "$RESULTS" "$@"
}

profile() {  # profile TASK BATCH NAME [profile_step options...]  (base/128) -> $OUT/NAME.tgz
  local task=$1 batch=$2 name=$3
  shift 3
  profile_model 90 "$task" "$BASE" "$S128" "$batch" "$name" "$@"
}

profile_model() {  # profile_model EST TASK MODEL SEQ BATCH NAME [profile_step options...]
  local est=$1 task=$2 model=$3 seq=$4 batch=$5 name=$6
  shift 6
  run_case "$est" profile "profile_$task" "$model" "$seq" "$batch" -- "${JAX_ENV[@]}" \
    "$PY" bench/profile_step.py --task "$task" --model "$model" --seq-len "$seq" \
    --batch-size "$batch" --out "$OUT/$name" "$@"
  # one file back instead of dozens (the device tool returns a handful of files per call);
  # the trace folder is too deep to come back and trace.json.gz is its flat copy
  [ -d "$OUT/$name" ] && tar czf "$OUT/$name.tgz" -C "$OUT" --exclude=plugins --exclude=hlo \
    "$name" && rm -rf "${OUT:?}/$name"
}

stage_env() {
  {
    date -u
    nvidia-smi || echo "no nvidia-smi"
    nvidia-smi topo -m 2>/dev/null
    "$PY" - <<'EOF'
import platform
print("python", platform.python_version())
for name in ("jax", "jaxlib", "flax", "optax", "orbax.checkpoint", "torch", "transformers"):
    try:
        module = __import__(name, fromlist=["_"])
        print(name, getattr(module, "__version__", "?"))
    except Exception as e:  # noqa: BLE001 - report whatever is missing
        print(name, "unavailable:", e)
EOF
    "${JAX_ENV[@]}" XLA_PYTHON_CLIENT_PREALLOCATE=false "$PY" -c \
      "import jax; print('jax devices:', jax.devices())"
    env | grep -E '^(XLA_|JAX_|NCCL_|CUDA_VISIBLE)' || true
  } >"$OUT/env.txt" 2>&1
  cat "$OUT/env.txt"
}

stage_core() {
  pretrain 90 core "$BASE" "$S128" "$B256"
  pretrain 150 core "$LARGE" "$S128" "$B256"
  pretrain 150 core "$LARGE" "$S512" "$B32"
  classify 60 core
}

torch_gpu() {  # true when torch sees a CUDA device (the peer needs one)
  "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null
}

peer() {  # peer EST TASK MODEL SEQ BATCH: one transformers run (bench/peer_hf.py)
  local est=$1 task=$2 model=$3 seq=$4 batch=$5
  run_case "$est" peer "$task" "$model" "$seq" "$batch" -- "$PY" bench/peer_hf.py \
    --task "$task" --model "$model" --seq-len "$seq" --batch-size "$batch" --out "$RESULTS"
}

stage_peer() {
  if ! torch_gpu; then
    echo "peer: no CUDA device for torch; skipped"
    return 0
  fi
  local w task model seq batch est
  for w in "pretrain $BASE $S128 $B256 120" "pretrain $LARGE $S128 $B256 150" \
           "pretrain $LARGE $S512 $B32 150" "classify $BASE $S128 $B32 100"; do
    read -r task model seq batch est <<<"$w"
    # PEER_ONLY="pretrain:base:128 classify:base:128" limits the workloads
    if [ -n "${PEER_ONLY:-}" ] && [[ " $PEER_ONLY " != *" $task:$model:$seq "* ]]; then
      continue
    fi
    peer "$est" "$task" "$model" "$seq" "$batch"
  done
}

stage_levers() {  # each lever once against the baseline, base/128 b256 (most likely to pay first)
  local m=$BASE s=$S128 b=$B256
  pretrain 45 lever:baseline "$m" "$s" "$b"
  pretrain 60 lever:batch_512 "$m" "$s" "$B512"
  pretrain 60 lever:xla_lhs "$m" "$s" "$b" --xla-flags lhs
  pretrain 60 lever:no_triton_gemm "$m" "$s" "$b" --xla-flags no_triton_gemm
  pretrain 60 lever:vocab_pad_1 "$m" "$s" "$b" --vocab-pad 1
  pretrain 60 lever:skip_cond "$m" "$s" "$b" --skip cond
  pretrain 45 lever:scan "$m" "$s" "$b" --scan
  pretrain 60 lever:attention_dropout_0 "$m" "$s" "$b" --attention-dropout 0
  pretrain 60 lever:remat_dots "$m" "$s" "$b" --remat dots
  pretrain 60 lever:no_donate "$m" "$s" "$b" --no-donate
  pretrain 60 lever:xla_attention_no_dropout "$m" "$s" "$b" --attention-dropout 0 \
    --attention xla
}

stage_levers_large() {  # attention and layer-stack levers where attention matters most
  pretrain 60 lever:baseline "$LARGE" "$S512" "$B32"
  pretrain 120 lever:attention_dropout_0 "$LARGE" "$S512" "$B32" --attention-dropout 0
  pretrain 90 lever:scan "$LARGE" "$S512" "$B32" --scan
  pretrain 60 lever:baseline "$LARGE" "$S128" "$B256"
}

stage_loop() {
  run_case 150 loop pretrain_loop "$BASE" "$S128" "$B256" -- "${JAX_ENV[@]}" \
    "$PY" bench/bench_loop.py --model "$BASE" --seq-len "$S128" --batch-size "$B256" \
    "${LOOP_STEPS[@]}" --compare-step --tag loop --out "$RESULTS"
}

stage_dropout() {  # hidden dropout masks: counter hash (the default) vs threefry (prng)
  local impl
  for impl in hash prng; do
    pretrain 90 "dropout:$impl" "$BASE" "$S128" "$B256" --hidden-dropout "$impl"
  done
  for impl in hash prng; do classify 60 "dropout:$impl" --hidden-dropout "$impl"; done
  for impl in hash prng; do
    pretrain 150 "dropout:$impl" "$LARGE" "$S512" "$B32" --hidden-dropout "$impl"
  done
}

stage_finetune() {  # fine-tuning step, bert-jax and the peer (base/128, batch 32), one call
  classify 60 core  # tagged core: the summary pairs core runs with the peer
  PEER_ONLY="classify:$BASE:$S128" stage_peer
}

stage_hash() {  # dropout mask hash: rowcol (default) vs flat, where attention matters most
  pretrain 75 hash:rowcol "$LARGE" "$S512" "$B32"
  pretrain 75 hash:flat "$LARGE" "$S512" "$B32" --dropout-hash flat
}

stage_nodrop() {  # no dropout at all: the issue's plain-Flax reference trains without it
  local nodrop=(--attention-dropout 0 --hidden-dropout-rate 0)
  pretrain 45 nodrop "$BASE" "$S128" "$B256" "${nodrop[@]}"
  pretrain 45 nodrop:baseline "$BASE" "$S128" "$B256"
  pretrain 120 nodrop "$LARGE" "$S128" "$B256" "${nodrop[@]}"
  pretrain 120 nodrop "$LARGE" "$S512" "$B32" "${nodrop[@]}"
}

stage_gelu() {  # GELU: bert-jax's erf formulation (default) vs jax.nn.gelu's erfc expansion
  pretrain 45 gelu:erf "$BASE" "$S128" "$B256"
  pretrain 45 gelu:erfc "$BASE" "$S128" "$B256" --gelu erfc
  classify 40 gelu:erf
  classify 40 gelu:erfc --gelu erfc
}

stage_fused() {  # the fifth session's A/B runs: gelu_erf vs erfc, fused LayerNorm, CUDA graphs
  pretrain 45 fused:baseline "$BASE" "$S128" "$B256"
  pretrain 45 fused:gelu_erfc "$BASE" "$S128" "$B256" --gelu erfc
  pretrain 45 fused:ln_fused "$BASE" "$S128" "$B256" --layer-norm fused
  pretrain 45 fused:graphs "$BASE" "$S128" "$B256" --xla-flags graphs
  classify 30 fused:baseline
  classify 30 fused:gelu_erfc --gelu erfc
  classify 30 fused:ln_fused --layer-norm fused
  pretrain 60 fused:baseline "$LARGE" "$S512" "$B32"
  pretrain 60 fused:ln_fused "$LARGE" "$S512" "$B32" --layer-norm fused
  pretrain 90 fused:baseline "$LARGE" "$S128" "$B256"
  pretrain 90 fused:ln_fused "$LARGE" "$S128" "$B256" --layer-norm fused
  profile pretrain "$B256" profile-fused-pretrain --layer-norm fused
}

best_norm_blocks() {  # best_norm_blocks SHAPE -> "ROWS:WARPS[:hold] K" of the fastest fused
  # variant (K: row blocks per backward program)
  "$PY" - "$OUT/norm.jsonl" "$1" <<'EOF'
import json, os, sys
path, shape = sys.argv[1:]
runs = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
runs = [r for r in runs if r.get("shape") == shape and "us_fwd_bwd" in r
        and r["variant"].startswith("fused_")]
if not runs:
    print("16:8 1")
else:
    name = min(runs, key=lambda r: r["us_fwd_bwd"])["variant"].split("_")[1:]
    rows, warps = name[0][1:], name[1][1:]
    sums = next((p[1:] for p in name[2:] if p.startswith("k")), "1")
    print(f"{rows}:{warps}" + (":hold" if "hold" in name else "") + f" {sums}")
EOF
}

stage_tune() {  # the fused LayerNorm kernel: block sweep, then the best setting in the step
  local shapes="256x128x768,32x128x768,32x512x1024"
  local sweep=(--block-rows 4,8,16 --num-warps 2,4,8 --hold 16:4,8:8)
  [ "$SMOKE" = 1 ] && shapes="8x64x64,2x64x128" && sweep=(--block-rows 8 --num-warps 4 --hold 8:4)
  run_case 240 norm norm "$BASE" "$S128" "$B256" -- "${JAX_ENV[@]}" "$PY" bench/bench_norm.py \
    --shapes "$shapes" "${sweep[@]}" --out "$OUT/norm.jsonl"
  local small=${shapes%%,*} large=${shapes##*,}
  local b768 b1024
  b768=$(best_norm_blocks "$small" | cut -d" " -f1)
  b1024=$(best_norm_blocks "$large" | cut -d" " -f1)
  echo "best fused LayerNorm blocks: $small -> $b768, $large -> $b1024"
  pretrain 45 tune:baseline "$BASE" "$S128" "$B256"
  pretrain 45 tune:ln_fused "$BASE" "$S128" "$B256" --layer-norm fused --fused-norm-blocks "$b768"
  classify 30 tune:baseline
  classify 30 tune:ln_fused --layer-norm fused --fused-norm-blocks "$b768"
  pretrain 75 tune:baseline "$LARGE" "$S512" "$B32"
  pretrain 75 tune:ln_fused "$LARGE" "$S512" "$B32" --layer-norm fused --fused-norm-blocks "$b1024"
  profile pretrain "$B256" profile-tune-pretrain --layer-norm fused --fused-norm-blocks "$b768"
}

stage_final() {  # bert-jax and transformers pairs, most important first (one 10-minute call
  # fits about three pairs: the last ones are skipped by the stage budget)
  local w task model seq batch est_jax est_peer with_peer=0
  torch_gpu && with_peer=1
  for w in "pretrain $BASE $S128 $B256 60 120" "classify $BASE $S128 $B32 50 100" \
           "pretrain $LARGE $S512 $B32 110 150" "pretrain $LARGE $S128 $B256 150 150"; do
    read -r task model seq batch est_jax est_peer <<<"$w"
    if [ "$task" = classify ]; then
      classify "$est_jax" core
    else
      pretrain "$est_jax" core "$model" "$seq" "$batch"
    fi
    if (( with_peer )); then peer "$est_peer" "$task" "$model" "$seq" "$batch"; fi
  done
}

stage_pairs() {  # the bert-jax/transformers pairs at base/128 and large/128 (the pretraining
  # workloads whose MLM share the fused_xent kernels move; one call, ~8 min)
  pretrain 60 core "$BASE" "$S128" "$B256"
  if torch_gpu; then peer 120 pretrain "$BASE" "$S128" "$B256"; fi
  pretrain 150 core "$LARGE" "$S128" "$B256"
  if torch_gpu; then peer 150 pretrain "$LARGE" "$S128" "$B256"; fi
}

plain() {  # plain EST TAG MODEL SEQ BATCH [plain_flax options...]: the issue's plain Flax step
  local est=$1 tag=$2 model=$3 seq=$4 batch=$5
  shift 5
  run_case "$est" "$tag" pretrain "$model" "$seq" "$batch" -- "${JAX_ENV[@]}" \
    "$PY" bench/plain_flax.py --model "$model" --seq-len "$seq" --batch-size "$batch" \
    "${TIMING[@]}" --tag "$tag" --out "$RESULTS" "$@"
}

triple() {  # triple EST_JAX EST_PLAIN EST_PEER MODEL SEQ BATCH: bert-jax, plain Flax, peer
  pretrain "$1" core "$4" "$5" "$6"
  plain "$2" plain "$4" "$5" "$6"
  if torch_gpu; then peer "$3" pretrain "$4" "$5" "$6"; fi
}

stage_blocks12() {  # twelfth session: the flash kernel's blocks (forward 128 x 32 / 128 x 64,
  # the split backward's dQ kernel 128 x 64) against the eleventh session's (~9 min)
  local old128=fused:128:128:16:64:4:3 old512=split:64:64:64:64:4:3:0:0:0:0
  pretrain 55 blocks12:new "$BASE" "$S128" "$B256"
  pretrain 55 blocks12:old "$BASE" "$S128" "$B256" --flash "$old128"
  pretrain 90 blocks12:new "$LARGE" "$S512" "$B32"
  pretrain 90 blocks12:old "$LARGE" "$S512" "$B32" --flash "$old512"
  pretrain 120 blocks12:new "$LARGE" "$S128" "$B256"
  pretrain 120 blocks12:old "$LARGE" "$S128" "$B256" --flash "$old128"
}

run_probe() {  # run_probe EST SCRIPT [options under BENCH_SMOKE=1...]: one probe, its
  # records in $OUT/probe.jsonl
  local est=$1 script=$2 smoke=()
  shift 2
  [ "$SMOKE" = 1 ] && smoke=("$@")
  run_case "$est" probe probe "$BASE" "$S128" 0 -- "${JAX_ENV[@]}" \
    "$PY" "$script" "${smoke[@]}" --out "$OUT/probe.jsonl"
}

stage_cudnndrop() {  # thirteenth session: cuDNN's fused attention with its own dropout
  # (bench/probe_cudnn_dropout.py: masks and kernel speed). The step A/B of that call ran
  # the same function as model.dropout_attention_impl=cudnn, which commit c7cc0ff had and
  # the next commit removed (~2 min)
  run_probe 100 bench/probe_cudnn_dropout.py \
    --emulate --mask-shapes 2x32x2x16 --shapes "" --executions 2
}

stage_gemmgelu() {  # fourteenth session: the MLP's bias + GELU fused into a Pallas GEMM's
  # epilogues, against cuBLAS + the fused_gelu kernel pair (bench/probe_gemm_gelu.py, ~4 min)
  run_probe 240 bench/probe_gemm_gelu.py --check
}

stage_plain() {  # eleventh session: bert-jax, the plain Flax step (bench/plain_flax.py) and
  # transformers on one card, base/128 b256 then large/512 b32 (~9 min: BUDGET_S=570)
  triple 60 50 120 "$BASE" "$S128" "$B256"
  triple 100 80 150 "$LARGE" "$S512" "$B32"
}

stage_plain_dropout() {  # like for like with the plain Flax step: bert-jax without any dropout
  # (cuDNN attention, as the plain step) and with hidden dropout only, against the plain step
  # with hidden dropout; base/128 b256 and large/512 b32 (~8 min)
  local w model seq batch est
  # PLAIN_WORKLOADS="large:128:256:150" runs other workloads (MODEL:SEQ:BATCH:EST_S each)
  for w in ${PLAIN_WORKLOADS:-"$BASE:$S128:$B256:65" "$LARGE:$S512:$B32:105"}; do
    IFS=: read -r model seq batch est <<<"$w"
    pretrain "$est" nodrop "$model" "$seq" "$batch" --attention-dropout 0 --hidden-dropout-rate 0
    pretrain "$est" hidden-only "$model" "$seq" "$batch" --attention-dropout 0
    plain "$est" plain:hidden "$model" "$seq" "$batch" --hidden-dropout 0.1
  done
}

stage_plain_large() {  # the same triple at large/128 b256, then the classify pair (~9 min)
  triple 150 100 150 "$LARGE" "$S128" "$B256"
  classify 60 core
  if torch_gpu; then peer 100 classify "$BASE" "$S128" "$B32"; fi
}

stage_qkv() {  # the query/key/value projection: split (default) vs fused
  pretrain 60 qkv:fused "$BASE" "$S128" "$B256" --qkv fused
  classify 40 qkv:fused --qkv fused
}

stage_packed() {  # qkv_projection packed (one matmul read in place by the flash kernel, the
  # gradient written packed) vs split, after a check of the compiled kernels against each other
  local shapes=base-128,large-512
  [ "$SMOKE" = 1 ] && shapes=tiny
  run_case 60 check flash_kernels "$BASE" "$S128" 0 -- "${JAX_ENV[@]}" \
    "$PY" bench/check_flash_gpu.py --shapes "$shapes" --out "$OUT/checks.jsonl"
  pretrain 45 qkv:split "$BASE" "$S128" "$B256" --qkv split
  pretrain 45 qkv:packed "$BASE" "$S128" "$B256" --qkv packed
  classify 30 qkv:split --qkv split
  classify 30 qkv:packed --qkv packed
  pretrain 100 qkv:split "$LARGE" "$S512" "$B32" --qkv split
  pretrain 100 qkv:packed "$LARGE" "$S512" "$B32" --qkv packed
  profile pretrain "$B256" "profile-pretrain-$BASE-$S128-packed" --qkv packed
}

stage_verify() {  # the final code in one short call: the compiled flash kernels checked against
  # each other and the reference, then base/128 pretraining and classify at the defaults
  local shapes=base-128,large-512
  [ "$SMOKE" = 1 ] && shapes=tiny
  run_case 60 check flash_kernels "$BASE" "$S128" 0 -- "${JAX_ENV[@]}" \
    "$PY" bench/check_flash_gpu.py --shapes "$shapes" --out "$OUT/checks.jsonl"
  pretrain 60 verify "$BASE" "$S128" "$B256"
  classify 50 verify
}

stage_gemmnorm() {  # the eighth session's A/B: XLA's cuBLAS-Lt path (vector-bias and addend
  # epilogues) and fewer partial sums in the fused LayerNorm backward (row blocks per
  # program), each against the defaults (its no-split-K run needed a flag the device's XLA
  # lacks, and is gone)
  local probe_tokens=32768
  [ "$SMOKE" = 1 ] && probe_tokens=256
  run_case 40 probe bias_epilogue_cublaslt "$BASE" "$S128" 0 -- "${JAX_ENV[@]}" \
    XLA_FLAGS=--xla_gpu_enable_cublaslt=true "$PY" bench/probe_bias_epilogue.py \
    --tokens "$probe_tokens" --out "$OUT/probe-cublaslt.jsonl" --hlo-dir "$OUT/probe-cublaslt-hlo"
  (cd "$OUT" && tar czf probe-cublaslt-hlo.tgz probe-cublaslt-hlo && rm -rf probe-cublaslt-hlo) \
    2>/dev/null
  pretrain 45 gn:baseline "$BASE" "$S128" "$B256"
  pretrain 45 gn:cublaslt "$BASE" "$S128" "$B256" --xla-flags cublaslt
  pretrain 45 gn:sum4 "$BASE" "$S128" "$B256" --norm-sum-blocks 4
  classify 30 gn:baseline
  classify 30 gn:cublaslt --xla-flags cublaslt
  classify 30 gn:sum4 --norm-sum-blocks 4
  local shapes=256x128x768,32x512x1024,32x128x768
  [ "$SMOKE" = 1 ] && shapes=2x64x128
  run_case 60 norm sum_blocks "$BASE" "$S128" 0 -- "${JAX_ENV[@]}" "$PY" bench/bench_norm.py \
    --shapes "$shapes" --block-rows 16 --num-warps 8 --hold 16:8 \
    --summed 16:8:2,16:8:4,16:8:8,32:8:4,4:2:4,4:2:16 --iters 10 --repeats 3 \
    --out "$OUT/norm.jsonl"
  pretrain 90 gn:baseline "$LARGE" "$S512" "$B32"
  pretrain 75 gn:cublaslt "$LARGE" "$S512" "$B32" --xla-flags cublaslt
  pretrain 75 gn:sum4 "$LARGE" "$S512" "$B32" --norm-sum-blocks 4
}

stage_gradsums() {  # the ninth session's A/B (now the defaults, so the baseline turns them
  # off): the two gradients of a fused LayerNorm output summed in its backward kernel,
  # projection weight gradients as one dot in the kernel's layout, the Pallas bias + GELU
  # kernel; each alone and together; then a profile of the step with all three
  local off=(--residual-grad xla --weight-grad xla --gelu erf)
  local all=(--residual-grad kernel --weight-grad direct --gelu kernel)
  pretrain 45 gs:baseline "$BASE" "$S128" "$B256" "${off[@]}"
  pretrain 45 gs:residual "$BASE" "$S128" "$B256" "${off[@]}" --residual-grad kernel
  pretrain 45 gs:weight "$BASE" "$S128" "$B256" "${off[@]}" --weight-grad direct
  pretrain 45 gs:gelu "$BASE" "$S128" "$B256" "${off[@]}" --gelu kernel
  pretrain 45 gs:all "$BASE" "$S128" "$B256" "${all[@]}"
  classify 30 gs:baseline "${off[@]}"
  classify 30 gs:all "${all[@]}"
  pretrain 90 gs:baseline "$LARGE" "$S512" "$B32" "${off[@]}"
  pretrain 75 gs:all "$LARGE" "$S512" "$B32" "${all[@]}"
  profile pretrain "$B256" "profile-gradsums-pretrain" "${all[@]}"
}

stage_xent() {  # tenth session: the MLM decoder + softmax cross-entropy as Pallas kernels
  # (modeling/fused_xent.py): the kernels alone at a tile sweep ($OUT/xent.jsonl), then the
  # step with them (the default) against XLA's passes (--mlm-loss xla) at base/128 and
  # large/512, and a profile of the default base/128 step
  local shapes="256x20x768,32x80x1024" vocab=30592
  [ "$SMOKE" = 1 ] && shapes="2x4x32" && vocab=256
  run_case 150 xent sweep "$BASE" "$S128" "$B256" -- "${JAX_ENV[@]}" "$PY" \
    bench/bench_xent.py --shapes "$shapes" --vocab "$vocab" --iters 10 --repeats 3 \
    --out "$OUT/xent.jsonl"
  pretrain 45 xent:xla "$BASE" "$S128" "$B256" --mlm-loss xla
  pretrain 45 xent:kernel "$BASE" "$S128" "$B256"
  pretrain 90 xent:xla "$LARGE" "$S512" "$B32" --mlm-loss xla
  pretrain 75 xent:kernel "$LARGE" "$S512" "$B32"
  profile pretrain "$B256" "profile-xent-pretrain"
}

stage_normtune() {  # the fused LayerNorm kernel again, with row blocks per backward program
  # (sum_blocks): a sweep at the long shapes, then the fastest setting of each against the
  # defaults in the step (call 2 of the eighth session also listed the XLA build's split-K
  # and cuBLAS-Lt flag names: bench/results/session8-call2/xla-flags.txt)
  local shapes="256x128x768,32x512x1024"
  local summed=4:2:2,4:2:4,4:2:8,4:2:4:hold,4:2:8:hold,2:1:4,2:1:8,2:2:8,8:4:2,8:4:4,4:4:4,8:2:4
  [ "$SMOKE" = 1 ] && shapes="8x64x64,2x64x128" && summed=4:2:2,4:2:2:hold
  run_case 240 norm sum_blocks "$BASE" "$S128" "$B256" -- "${JAX_ENV[@]}" "$PY" \
    bench/bench_norm.py --shapes "$shapes" --block-rows 16,4 --num-warps 8,2 --hold 16:8,4:2 \
    --summed "$summed" --iters 10 --repeats 3 --out "$OUT/norm.jsonl"
  local b768 b1024
  read -r -a b768 <<<"$(best_norm_blocks "${shapes%%,*}")"
  read -r -a b1024 <<<"$(best_norm_blocks "${shapes##*,}")"
  echo "fastest fused LayerNorm: ${shapes%%,*} -> ${b768[*]}, ${shapes##*,} -> ${b1024[*]}"
  pretrain 45 nt:baseline "$BASE" "$S128" "$B256"
  pretrain 45 "nt:${b768[0]}:k${b768[1]}" "$BASE" "$S128" "$B256" \
    --fused-norm-blocks "${b768[0]}" --norm-sum-blocks "${b768[1]}"
  pretrain 90 nt:baseline "$LARGE" "$S512" "$B32"
  pretrain 75 "nt:${b1024[0]}:k${b1024[1]}" "$LARGE" "$S512" "$B32" \
    --fused-norm-blocks "${b1024[0]}" --norm-sum-blocks "${b1024[1]}"
  profile pretrain "$B256" profile-normtune-pretrain \
    --fused-norm-blocks "${b768[0]}" --norm-sum-blocks "${b768[1]}"
}

stage_normshort() {  # the fused LayerNorm for short row counts (classify) and finer long
  # settings: a sweep, then classify with the fastest short setting against the default and
  # base/128 with the fastest long one against the default, and a profile of the default
  local shapes="32x128x768,256x128x768,256x128x1024"
  local summed=2:1:2,2:1:4,2:1:8,2:1:16,1:1:8,1:1:16,1:1:32,2:1:8:hold,4:1:8
  [ "$SMOKE" = 1 ] && shapes="2x64x128,8x64x64,8x64x128" && summed=2:1:2,1:1:4
  run_case 270 norm short "$BASE" "$S128" "$B32" -- "${JAX_ENV[@]}" "$PY" \
    bench/bench_norm.py --shapes "$shapes" --block-rows 4,2 --num-warps 2,1 --hold "" \
    --summed "$summed" --iters 10 --repeats 3 --out "$OUT/norm.jsonl"
  local short long
  read -r -a short <<<"$(best_norm_blocks "${shapes%%,*}")"
  read -r -a long <<<"$(best_norm_blocks "$(echo "$shapes" | cut -d, -f2)")"
  echo "fastest fused LayerNorm: ${shapes%%,*} -> ${short[*]}, $(echo "$shapes" | cut -d, -f2) -> ${long[*]}"
  classify 40 ns:baseline
  classify 30 "ns:${short[0]}:k${short[1]}" --fused-norm-blocks "${short[0]}" \
    --norm-sum-blocks "${short[1]}"
  pretrain 60 ns:baseline "$BASE" "$S128" "$B256"
  pretrain 40 "ns:${long[0]}:k${long[1]}" "$BASE" "$S128" "$B256" \
    --fused-norm-blocks "${long[0]}" --norm-sum-blocks "${long[1]}"
  profile pretrain "$B256" profile-normshort-pretrain
}

stage_layernorm() {  # LayerNorm backward: two_stage (default) vs flax autodiff
  pretrain 60 layernorm:flax "$BASE" "$S128" "$B256" --layer-norm flax
  classify 40 layernorm:flax --layer-norm flax
}

stage_pending() {  # every change not yet measured on a GPU, one call (~9 min: BUDGET_S=570)
  pretrain 45 pending:baseline "$BASE" "$S128" "$B256"
  pretrain 45 pending:hash_flat "$BASE" "$S128" "$B256" --dropout-hash flat
  pretrain 45 pending:layernorm_two_stage "$BASE" "$S128" "$B256" --layer-norm two_stage
  local impl
  for impl in flax two_stage; do classify 40 "pending:layernorm_$impl" --layer-norm "$impl"; done
  attention 60
  pretrain 75 pending:baseline "$LARGE" "$S512" "$B32"
  pretrain 75 pending:hash_flat "$LARGE" "$S512" "$B32" --dropout-hash flat
  profile pretrain "$B256" profile-pending-pretrain
  pretrain 45 pending:qkv_fused "$BASE" "$S128" "$B256" --qkv fused
}

attention() {  # attention EST: bench_attention.py, default blocks, -> $OUT/attention.jsonl
  local shapes=()
  [ "$SMOKE" = 1 ] && shapes=(--shapes 2x64x2x16)
  run_case "$1" attention attention "$BASE" "$S128" "$B256" -- "${JAX_ENV[@]}" \
    "$PY" bench/bench_attention.py --tune none "${shapes[@]}" --out "$OUT/attention.jsonl"
}

stage_profile() {  # per-kernel time tables of one step (bench/profile_step.py);
  # PROFILE_TASKS="pretrain" limits the tasks (default: pretrain classify)
  local tasks=" ${PROFILE_TASKS:-pretrain classify} "
  # shellcheck disable=SC2086  # PROFILE_ARGS: extra options, word-split on purpose
  [[ $tasks == *" pretrain "* ]] && profile pretrain "$B256" "profile-pretrain-$BASE-$S128" ${PROFILE_ARGS:-}
  # shellcheck disable=SC2086
  [[ $tasks == *" classify "* ]] && profile classify "$B32" "profile-classify-$BASE-$S128" ${PROFILE_ARGS:-}
  return 0
}

stage_profile_large() {  # the step profile at Large/512 b32 (attention's largest share)
  # shellcheck disable=SC2086
  profile_model 150 pretrain "$LARGE" "$S512" "$B32" "profile-pretrain-$LARGE-$S512" \
    ${PROFILE_ARGS:-}
}

stage_attention_tune() {  # flash kernel block sweep at the long shape (bench_attention.py)
  local shapes=(--shapes 32x512x16x64)
  [ "$SMOKE" = 1 ] && shapes=(--shapes 2x64x2x16)
  run_case 200 attention attention "$LARGE" "$S512" "$B32" -- "${JAX_ENV[@]}" \
    "$PY" bench/bench_attention.py --tune long "${shapes[@]}" --out "$OUT/attention.jsonl"
}

best_flash() {  # best_flash SHAPE -> BACKWARD:BQ:BK:BQB:BKB:WARPS:STAGES (fastest tuning)
  "$PY" - "$OUT/attention.jsonl" "$1" <<'EOF'
import json, os, sys
path, shape = sys.argv[1:]
runs = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
runs = [r for r in runs if r.get("shape") == shape and "tune" in r and "fwd_bwd_ms" in r]
if runs:
    *blocks, backward = min(runs, key=lambda r: r["fwd_bwd_ms"])["tune"]
    print(":".join([backward, *map(str, blocks)]))
EOF
}

stage_flash_tune() {  # the flash kernel at Base/128 (--tune short, fused backward), then the
  # step with the fastest setting against the default
  local short=256x128x12x64
  [ "$SMOKE" = 1 ] && short=2x64x2x16
  run_case 120 attention attention "$BASE" "$S128" "$B256" -- "${JAX_ENV[@]}" \
    "$PY" bench/bench_attention.py --tune short --shapes "$short" --impls flash_dropout \
    --out "$OUT/attention.jsonl"
  local f128
  f128=$(best_flash "$short")
  echo "best flash settings: $short -> ${f128:-none}"
  pretrain 45 flash:default "$BASE" "$S128" "$B256"
  [ -n "$f128" ] && pretrain 45 flash:best "$BASE" "$S128" "$B256" --flash "$f128"
  return 0
}

stage_biasgrad() {  # q/k/v bias gradients: the flash kernels' sums (default) vs XLA's
  pretrain 45 biasgrad:kernel "$BASE" "$S128" "$B256"
  pretrain 45 biasgrad:xla "$BASE" "$S128" "$B256" --qkv-bias-grad xla
  classify 30 biasgrad:kernel
  classify 30 biasgrad:xla --qkv-bias-grad xla
  pretrain 100 biasgrad:kernel "$LARGE" "$S512" "$B32"
  pretrain 75 biasgrad:xla "$LARGE" "$S512" "$B32" --qkv-bias-grad xla
}

stage_remaining() {  # the two levers never run (base/128), a probe of the q/k/v bias epilogue,
  # and a profile of the current default step
  run_case 60 probe bias_epilogue "$BASE" "$S128" 0 -- "${JAX_ENV[@]}" \
    "$PY" bench/probe_bias_epilogue.py --out "$OUT/probe.jsonl" --hlo-dir "$OUT/probe-hlo"
  (cd "$OUT" && tar czf probe-hlo.tgz probe-hlo && rm -rf probe-hlo) 2>/dev/null
  pretrain 45 lever:baseline "$BASE" "$S128" "$B256"
  pretrain 60 lever:no_donate "$BASE" "$S128" "$B256" --no-donate
  pretrain 60 lever:attention_dropout_0 "$BASE" "$S128" "$B256" --attention-dropout 0
  pretrain 60 lever:xla_attention_no_dropout "$BASE" "$S128" "$B256" --attention-dropout 0 \
    --attention xla
  profile pretrain "$B256" "profile-pretrain-$BASE-$S128"
}

stage_batch() {  # the largest-batch lever: twice the benchmark batch (large/128: stage large128)
  pretrain 120 batch "$LARGE" "$S512" $(( B32 * 2 ))
  pretrain 60 batch "$BASE" "$S128" "$B512"
}

stage_large128() {  # the Large/128 pair (final's last pair, which its budget skips) and b512
  pretrain 150 core "$LARGE" "$S128" "$B256"
  if torch_gpu; then peer 150 pretrain "$LARGE" "$S128" "$B256"; fi
  pretrain 150 batch "$LARGE" "$S128" "$B512"
}

stage_scaling() {  # SCALING_COUNTS=1,2 limits the device counts (default: 1, 2, 4.. present);
  # SCALING_ARGS="--param-gather compute_dtype --xla-flags collectives" go to every run
  local extra=() pass=() RUN_TIMEOUT_S=$(( BUDGET_S > 590 ? BUDGET_S : 590 ))
  [ "$SMOKE" = 1 ] && extra=(--model "$LARGE" --seq-len "$S128")
  [ -n "${SCALING_COUNTS:-}" ] && extra+=(--device-counts "$SCALING_COUNTS")
  # shellcheck disable=SC2206  # SCALING_ARGS: options, word-split on purpose
  [ -n "${SCALING_ARGS:-}" ] && pass=(-- ${SCALING_ARGS})
  run_case 480 scaling scaling_summary "$LARGE" "$S128" 0 -- "${JAX_ENV[@]}" \
    "$PY" bench/bench_scaling.py "${SCALE[@]}" "${extra[@]}" --out "$RESULTS" "${pass[@]}"
}

stage_scaling_levers() {  # the FSDP levers at the largest device count N against the default
  # flags in the same call: DP at 1 and N GPUs and FSDP at N, first with the default flags,
  # then with SCALING_LEVER_ARGS (default: bf16 parameter gathers + collective overlap)
  local n extra=() RUN_TIMEOUT_S=$(( BUDGET_S > 590 ? BUDGET_S : 590 ))
  [ "$SMOKE" = 1 ] && extra=(--model "$LARGE" --seq-len "$S128")
  if [ "$SMOKE" = 1 ]; then n=2; else n=$(nvidia-smi -L | grep -c '^GPU'); fi
  # shellcheck disable=SC2206  # options, word-split on purpose
  local pass=(${SCALING_LEVER_ARGS:---param-gather compute_dtype --xla-flags collectives})
  # shellcheck disable=SC2206  # options for both halves (--no-fsdp: DP only, ~3.5 min each)
  extra+=(${SCALING_HALF_ARGS:-})
  local est=390
  [[ " ${extra[*]} " == *" --no-fsdp "* ]] && est=240  # 204 and 178 s (fourteenth session)
  scaling_half "$est" scaling "$n" "${extra[@]}"  # ~6.5 min each on 4 H200s
  scaling_half "$est" scaling-levers "$n" "${extra[@]}" -- "${pass[@]}"
}

scaling_half() {  # scaling_half EST TAG N [bench_scaling options...]: DP at 1 and N, FSDP at N
  local est=$1 tag=$2 n=$3
  shift 3
  run_case "$est" "$tag" scaling_summary "$LARGE" "$S128" 0 -- "${JAX_ENV[@]}" \
    "$PY" bench/bench_scaling.py "${SCALE[@]}" --device-counts "1,$n" --out "$RESULTS" "$@"
}

run_stage() {
  local name=$1
  LOG=$OUT/$name.log
  STAGE_START=$(date +%s)
  echo "### stage $name (budget ${BUDGET_S}s) $(date +%T)"
  case $name in
    env) stage_env ;;
    core) stage_core ;;
    peer) stage_peer ;;
    levers) stage_levers ;;
    levers-large) stage_levers_large ;;
    loop) stage_loop ;;
    scaling) stage_scaling ;;
    scaling-levers) stage_scaling_levers ;;
    dropout) stage_dropout ;;
    profile) stage_profile ;;
    profile-large) stage_profile_large ;;
    attention-tune) stage_attention_tune ;;
    flash-tune) stage_flash_tune ;;
    batch) stage_batch ;;
    remaining) stage_remaining ;;
    biasgrad) stage_biasgrad ;;
    large128) stage_large128 ;;
    qkv) stage_qkv ;;
    packed) stage_packed ;;
    verify) stage_verify ;;
    gemmnorm) stage_gemmnorm ;;
    normtune) stage_normtune ;;
    gradsums) stage_gradsums ;;
    xent) stage_xent ;;
    pairs) stage_pairs ;;
    plain) stage_plain ;;
    plain-large) stage_plain_large ;;
    plain-dropout) stage_plain_dropout ;;
    blocks12) stage_blocks12 ;;
    cudnndrop) stage_cudnndrop ;;
    gemmgelu) stage_gemmgelu ;;
    normshort) stage_normshort ;;
    final) stage_final ;;
    tune) stage_tune ;;
    fused) stage_fused ;;
    gelu) stage_gelu ;;
    nodrop) stage_nodrop ;;
    layernorm) stage_layernorm ;;
    pending) stage_pending ;;
    finetune) stage_finetune ;;
    hash) stage_hash ;;
    *) echo "unknown stage $name (env|core|peer|levers|levers-large|loop|scaling|scaling-levers|dropout|profile|profile-large|attention-tune|flash-tune|batch|remaining|large128|biasgrad|qkv|packed|verify|gemmnorm|normtune|normshort|gradsums|xent|pairs|plain|plain-large|plain-dropout|blocks12|cudnndrop|gemmgelu|gelu|fused|tune|final|nodrop|layernorm|pending|finetune|hash|all)" >&2
       exit 2 ;;
  esac
  echo "### stage $name done in $(( $(date +%s) - STAGE_START ))s"
}

if [ "$STAGE" = all ]; then
  for s in env core peer levers levers-large loop dropout qkv layernorm profile scaling; do
    run_stage "$s"
  done
else  # one stage, or several: bash bench/run_gpu.sh "finetune loop"
  run_stage env >/dev/null
  for s in $STAGE; do run_stage "$s"; done
fi

touch "$RESULTS"
SOURCES=("$RESULTS")
if [ -n "${BENCH_PREVIOUS:-}" ]; then
  IFS=: read -r -a previous <<<"$BENCH_PREVIOUS"
  SOURCES+=("${previous[@]}")
fi
"$PY" bench/summarize.py "${SOURCES[@]}" | tee "$OUT/summary.md"
