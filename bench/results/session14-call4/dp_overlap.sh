#!/usr/bin/env bash
# ad-hoc (fourteenth session, call 4; run as `bash dp_overlap.sh` from the repository root
# with .whl carried): why DP's gradient all-reduce is not overlapped; HLO dumps + A/B
export PATH=/opt/torch/.venv/bin:$PATH PYTHONUNBUFFERED=1
python -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_MEM_FRACTION=0.90
run() {  # run NAME DEVICES BATCH XLA_FLAGS [dump]
  local name=$1 dev=$2 batch=$3 flags=$4
  [ "${5:-}" = dump ] && flags="$flags --xla_dump_to=$OUT/dump_$name --xla_dump_hlo_module_re=train_step --xla_dump_disable_metadata=true"
  echo "### $name $(date +%T)"
  CUDA_VISIBLE_DEVICES=$dev XLA_FLAGS="$flags" timeout 150 python bench/bench_pretrain.py --model large \
    --seq-len 128 --batch-size "$batch" --mesh dp --steps 10 --repeats 2 --warmup 2 \
    --tag "dp_$name" --out "$OUT/dp.jsonl" 2>&1 | grep -v '^{' | tail -3
  tail -1 "$OUT/dp.jsonl" | python -c "import json,sys; r=json.loads(sys.stdin.read()); print(r['tag'], r['devices'], round(r['seq_per_s'],1), round(r['step_time_s']*1e3,2)) if r['tag']=='dp_$name' else print('dp_$name FAILED')"
}
run default 0,1 256 ""
run analytical 0,1 256 "--xla_gpu_enable_analytical_latency_estimator=true" dump
run overlap4 0,1 256 "--xla_gpu_experimental_parallel_collective_overlap_limit=4" dump
run both 0,1 256 "--xla_gpu_enable_analytical_latency_estimator=true --xla_gpu_experimental_parallel_collective_overlap_limit=4"
find "$OUT" -path '*dump_*' -type f ! -name '*after_optimizations.txt' -delete
find "$OUT" -path '*dump_*' -name '*after_optimizations.txt' -exec gzip {} \;
