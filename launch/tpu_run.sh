#!/usr/bin/env bash
# Run the same `bert-jax pretrain` on every worker of a TPU slice (or of every slice, multislice).
# One ssh per worker; each worker's output goes to LOG_DIR/slice-S-worker-W.log here and, from the
# worker itself, to GCS next to the checkpoints. The training runs in its own session on the
# worker (launch/worker_run.sh), so a dropped connection does not stop it.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'EOF'
Usage: launch/tpu_run.sh --name NAME --zone ZONE --accelerator-type TYPE --workdir gs://... \
         [options] [-- --config.KEY=VALUE ...]
       launch/tpu_run.sh --name NAME --zone ZONE --accelerator-type TYPE --stop

Start bert-jax pretraining on all workers (after tpu_setup.sh). Re-running the same command with
the same --workdir resumes from the latest checkpoint.

Required:
  --name NAME               TPU name (queued resource name for multislice)
  --zone ZONE               e.g. us-central2-b
  --accelerator-type TYPE   e.g. v4-32, v5litepod-64 (sets the number of workers)
  --workdir GS_URL          Checkpoints, TensorBoard events and metrics, e.g. gs://bucket/runs/base
Options:
  --project ID              GCP project (default: gcloud's configured project)
  --num-slices N            Multislice over N slices; adds --config.parallel.dcn_mesh.data=N
  --config FILE:VARIANT     Default experiments/pretrain.py:bert_base_phase1 (relative to the
                            bundle tpu_setup.sh installed)
  --run-id ID               Names this launch's logs (default: UTC time, e.g. 20250101-120000)
  --log-dir DIR             Local folder for the per-worker logs (default logs/NAME/RUN_ID)
  --gcs-log-dir GS_URL      Where workers upload their logs (default WORKDIR/logs/RUN_ID)
  --env KEY=VALUE           Environment variable for the trainer (repeatable)
  --detach                  Start and return; do not stream the logs here
  --skip-preflight          Start without the compile check (by default the training step is
                            first compiled for this slice here and a config that does not fit
                            is refused: bert-jax compile, docs/tpu.md)
  --stop                    SIGTERM the running launch on all workers (it checkpoints and exits)
  --dry-run                 Print the exact commands instead of running them (the preflight
                            as a '#' comment)
  -h, --help                This help
After '--': config overrides passed to `bert-jax pretrain`, e.g.
  -- --config.data.directory=gs://bucket/data/seq128 --config.global_batch_size=512
EOF
}

NAME="" ZONE="" PROJECT="" ACCELERATOR="" NUM_SLICES=1 CONFIG=experiments/pretrain.py:bert_base_phase1
WORKDIR="" RUN_ID="" LOG_DIR="" GCS_LOG_DIR="" DETACH=0 STOP=0 ENVS=() OVERRIDES=() PREFLIGHT=1

split_equals "$@"
set -- "${ARGS[@]+"${ARGS[@]}"}"
while (($#)); do
  case "$1" in
    --name) need_value "$@"; NAME="$2"; shift 2 ;;
    --zone) need_value "$@"; ZONE="$2"; shift 2 ;;
    --project) need_value "$@"; PROJECT="$2"; shift 2 ;;
    --accelerator-type) need_value "$@"; ACCELERATOR="$2"; shift 2 ;;
    --num-slices) need_value "$@"; NUM_SLICES="$2"; shift 2 ;;
    --config) need_value "$@"; CONFIG="$2"; shift 2 ;;
    --workdir) need_value "$@"; WORKDIR="${2%/}"; shift 2 ;;
    --run-id) need_value "$@"; RUN_ID="$2"; shift 2 ;;
    --log-dir) need_value "$@"; LOG_DIR="$2"; shift 2 ;;
    --gcs-log-dir) need_value "$@"; GCS_LOG_DIR="${2%/}"; shift 2 ;;
    --env) need_value "$@"; ENVS+=("$2"); shift 2 ;;
    --detach) DETACH=1; shift ;;
    --stop) STOP=1; shift ;;
    --skip-preflight) PREFLIGHT=0; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; OVERRIDES=("$@"); break ;;
    *) die "unknown argument '$1' (see --help; config overrides go after '--')" ;;
  esac
done

validate_slice "$NAME" "$ZONE" "$PROJECT" "$NUM_SLICES" "$ACCELERATOR"
WORKERS="$(workers_per_slice "$ACCELERATOR")"

if ((STOP)); then
  # shellcheck disable=SC2016 # $HOME expands on the worker
  REMOTE='cd "$HOME/bert-jax" && bash launch/worker_run.sh stop --timeout 300'
  if ((NUM_SLICES > 1)); then ssh_argv "$NUM_SLICES" all all "$REMOTE"; else ssh_argv 1 0 all "$REMOTE"; fi
  run "${SSH_ARGV[@]}"
  exit 0
fi

require --workdir "$WORKDIR"
validate_gcs --workdir "$WORKDIR"
validate_config_spec "$CONFIG"
validate_overrides 1 "${OVERRIDES[@]+"${OVERRIDES[@]}"}"
for kv in "${ENVS[@]+"${ENVS[@]}"}"; do validate_env "$kv"; done
if ((NUM_SLICES > 1)); then
  dcn=""
  for arg in "${OVERRIDES[@]+"${OVERRIDES[@]}"}"; do
    [[ "$arg" == --config.parallel.dcn_mesh.data=* ]] && dcn="${arg#*=}"
  done
  if [[ -z "$dcn" ]]; then
    OVERRIDES+=("--config.parallel.dcn_mesh.data=${NUM_SLICES}")
  elif ((dcn != NUM_SLICES)); then
    die "--config.parallel.dcn_mesh.data=${dcn} but --num-slices ${NUM_SLICES}: the DCN axis spans the slices"
  fi
fi
((PREFLIGHT)) && preflight "$CONFIG" "$ACCELERATOR" "$NUM_SLICES" "${OVERRIDES[@]+"${OVERRIDES[@]}"}"
RUN_ID="${RUN_ID:-$(date -u +%Y%m%d-%H%M%S)}"
[[ "$RUN_ID" =~ ^[A-Za-z0-9_.-]+$ ]] || die "--run-id '$RUN_ID' may use letters, digits, '.', '_' and '-' only"
LOG_DIR="${LOG_DIR:-logs/${NAME}/${RUN_ID}}"
GCS_LOG_DIR="${GCS_LOG_DIR:-${WORKDIR}/logs/${RUN_ID}}"
validate_gcs --gcs-log-dir "$GCS_LOG_DIR"

# remote_command SLICE WORKER -> REMOTE, the command one worker runs.
remote_command() {
  local start=(start --log-name "slice-$1-worker-$2" --run-id "$RUN_ID" --gcs-log-dir "$GCS_LOG_DIR") kv
  for kv in "${ENVS[@]+"${ENVS[@]}"}"; do start+=(--env "$kv"); done
  ((DETACH)) || start+=(--follow)
  local train=(pretrain --config "$CONFIG" --workdir "$WORKDIR" "${OVERRIDES[@]+"${OVERRIDES[@]}"}")
  # shellcheck disable=SC2016 # $HOME expands on the worker
  printf -v REMOTE 'cd "$HOME/bert-jax" && exec bash launch/worker_run.sh %s -- "$HOME/bert-jax-venv/bin/bert-jax" %s' \
    "$(quote_cmd "${start[@]}")" "$(quote_cmd "${train[@]}")"
}

run mkdir -p "$LOG_DIR"
PIDS=() LOGS=()
for ((slice = 0; slice < NUM_SLICES; slice++)); do
  for ((worker = 0; worker < WORKERS; worker++)); do
    remote_command "$slice" "$worker"
    ssh_argv "$NUM_SLICES" "$slice" "$worker" "$REMOTE"
    logfile="${LOG_DIR}/slice-${slice}-worker-${worker}.log"
    LOGS+=("$logfile")
    if ((DRY_RUN)); then
      printf '%s > %s 2>&1 < /dev/null &\n' "$(quote_cmd "${SSH_ARGV[@]}")" "$(quote_cmd "$logfile")"
    else
      "${SSH_ARGV[@]}" >"$logfile" 2>&1 </dev/null &
      PIDS+=($!)
    fi
  done
done
if ((DRY_RUN)); then
  echo "wait"
  exit 0
fi

log "${#PIDS[@]} workers started (run ${RUN_ID}); logs in ${LOG_DIR}/ and ${GCS_LOG_DIR}/"
stop_following() {
  kill "${PIDS[@]}" 2>/dev/null || true
  log "stopped following; training continues on the workers. Stop it with: $0 --name ${NAME} --zone ${ZONE} --accelerator-type ${ACCELERATOR} --num-slices ${NUM_SLICES} --stop"
  exit 130
}
trap stop_following INT
if ! ((DETACH)); then
  tail -n +1 -F --pid="${PIDS[0]}" "${LOGS[0]}" 2>/dev/null &
fi
FAILED=0
for i in "${!PIDS[@]}"; do
  rc=0
  wait "${PIDS[$i]}" || rc=$?
  if ((rc != 0)); then
    log "FAILED (exit ${rc}): ${LOGS[$i]}"
    FAILED=1
  fi
done
if ((FAILED)); then
  log "at least one worker failed; see the logs above. After a preemption run launch/tpu_resume.sh with the same arguments."
  exit 1
fi
if ((DETACH)); then
  log "started on all workers; follow ${GCS_LOG_DIR}/ or TensorBoard on ${WORKDIR}"
else
  log "all workers finished; logs in ${LOG_DIR}/"
fi
