#!/usr/bin/env bash
# Create a Cloud TPU VM slice (directly, or through a queued resource; several slices for
# multislice), optionally on spot/preemptible capacity, and wait until it is usable.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'EOF'
Usage: launch/tpu_create.sh --name NAME --zone ZONE --accelerator-type TYPE [options] \
         [-- --config.KEY=VALUE ...]

Create a TPU VM pod slice for bert-jax pretraining. First, the preflight compiles the training
step of --config (with the overrides after '--') for this slice on this machine and refuses to
create a slice the step does not fit (bert-jax compile, docs/tpu.md).

Required:
  --name NAME               TPU (and queued resource) name, e.g. bert-base-v4
  --zone ZONE               e.g. us-central2-b (v4), us-west4-a or europe-west4-b (v5e)
  --accelerator-type TYPE   v4-32, v5litepod-64, v5p-128, v6e-16, v3-32, ...
Options:
  --project ID              GCP project (default: gcloud's configured project)
  --runtime-version V       TPU VM image (default per generation: tpu-ubuntu2204-base for
                            v2/v3/v4, v2-alpha-tpuv5-lite for v5e, v2-alpha-tpuv5 for v5p,
                            v2-alpha-tpuv6e for v6e)
  --spot                    Spot capacity (cheaper, can be preempted at any time)
  --preemptible             Preemptible capacity (direct creation only; use --spot with --queued)
  --queued                  Request through a queued resource (waits for capacity)
  --num-slices N            Multislice: N slices joined over DCN (implies --queued); nodes are
                            NAME-0 .. NAME-(N-1); pass --config.parallel.dcn_mesh.data=N to tpu_run.sh
  --valid-until-duration D  Queued only: give up if not provisioned within D (e.g. 6h)
  --service-account EMAIL   Service account of the workers (needs write access to the bucket)
  --no-wait                 Return right after the request instead of waiting until usable
  --wait-timeout S          Seconds to wait for the slice (default 7200)
  --config FILE:VARIANT     The run the slice is for, checked by the preflight (default
                            experiments/pretrain.py:bert_base_phase1)
  --skip-preflight          Create without the compile check
  --dry-run                 Print the exact commands instead of running them (the preflight
                            as a '#' comment)
  -h, --help                This help
EOF
}

NAME="" ZONE="" PROJECT="" ACCELERATOR="" RUNTIME="" SPOT=0 PREEMPTIBLE=0 QUEUED=0 NUM_SLICES=1
VALID_UNTIL="" SERVICE_ACCOUNT="" WAIT=1 WAIT_TIMEOUT=7200
CONFIG=experiments/pretrain.py:bert_base_phase1 PREFLIGHT=1 OVERRIDES=()

split_equals "$@"
set -- "${ARGS[@]+"${ARGS[@]}"}"
while (($#)); do
  case "$1" in
    --name) need_value "$@"; NAME="$2"; shift 2 ;;
    --zone) need_value "$@"; ZONE="$2"; shift 2 ;;
    --project) need_value "$@"; PROJECT="$2"; shift 2 ;;
    --accelerator-type) need_value "$@"; ACCELERATOR="$2"; shift 2 ;;
    --runtime-version) need_value "$@"; RUNTIME="$2"; shift 2 ;;
    --spot) SPOT=1; shift ;;
    --preemptible) PREEMPTIBLE=1; shift ;;
    --queued) QUEUED=1; shift ;;
    --num-slices) need_value "$@"; NUM_SLICES="$2"; shift 2 ;;
    --valid-until-duration) need_value "$@"; VALID_UNTIL="$2"; shift 2 ;;
    --service-account) need_value "$@"; SERVICE_ACCOUNT="$2"; shift 2 ;;
    --no-wait) WAIT=0; shift ;;
    --wait-timeout) need_value "$@"; WAIT_TIMEOUT="$2"; shift 2 ;;
    --config) need_value "$@"; CONFIG="$2"; shift 2 ;;
    --skip-preflight) PREFLIGHT=0; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; OVERRIDES=("$@"); break ;;
    *) die "unknown argument '$1' (see --help; config overrides go after '--')" ;;
  esac
done

validate_slice "$NAME" "$ZONE" "$PROJECT" "$NUM_SLICES" "$ACCELERATOR"
validate_positive_int --wait-timeout "$WAIT_TIMEOUT"
RUNTIME="${RUNTIME:-$(default_runtime_version "$ACCELERATOR")}"
[[ "$RUNTIME" =~ ^[a-z0-9][-a-z0-9.]*$ ]] || die "--runtime-version '$RUNTIME' is not a TPU software version name"
((SPOT && PREEMPTIBLE)) && die "--spot and --preemptible exclude each other"
((NUM_SLICES > 1)) && QUEUED=1
((QUEUED && PREEMPTIBLE)) && die "--preemptible is for direct creation; queued resources and multislice take --spot"
[[ -n "$VALID_UNTIL" ]] && ! ((QUEUED)) && die "--valid-until-duration needs --queued"
[[ -z "$VALID_UNTIL" || "$VALID_UNTIL" =~ ^[0-9]+[smhd]$ ]] ||
  die "--valid-until-duration '$VALID_UNTIL' must be a duration like 30m, 6h or 2d"

validate_config_spec "$CONFIG"
validate_overrides 1 "${OVERRIDES[@]+"${OVERRIDES[@]}"}"
((PREFLIGHT)) && preflight "$CONFIG" "$ACCELERATOR" "$NUM_SLICES" "${OVERRIDES[@]+"${OVERRIDES[@]}"}"

scope_flags
# The workers write checkpoints, TensorBoard events and logs to GCS: full cloud-platform scope.
EXTRA=("--scopes=https://www.googleapis.com/auth/cloud-platform")
[[ -n "$SERVICE_ACCOUNT" ]] && EXTRA+=("--service-account=${SERVICE_ACCOUNT}")
((SPOT)) && EXTRA+=(--spot)

if ((QUEUED)); then
  if ((NUM_SLICES > 1)); then
    NODES=("--node-count=${NUM_SLICES}" "--node-prefix=${NAME}")
  else
    NODES=("--node-id=${NAME}")
  fi
  [[ -n "$VALID_UNTIL" ]] && EXTRA+=("--valid-until-duration=${VALID_UNTIL}")
  run gcloud compute tpus queued-resources create "$NAME" "${SCOPE[@]}" \
    "--accelerator-type=${ACCELERATOR}" "--runtime-version=${RUNTIME}" "${NODES[@]}" "${EXTRA[@]}"
else
  ((PREEMPTIBLE)) && EXTRA+=(--preemptible)
  run gcloud compute tpus tpu-vm create "$NAME" "${SCOPE[@]}" \
    "--accelerator-type=${ACCELERATOR}" "--version=${RUNTIME}" "${EXTRA[@]}"
fi

if ((WAIT)); then
  wait_ready "$QUEUED" "$WAIT_TIMEOUT"
fi
((DRY_RUN)) || log "slice ${NAME}: ${NUM_SLICES} x ${ACCELERATOR}, $(workers_per_slice "$ACCELERATOR") workers per slice; next: launch/tpu_setup.sh"
