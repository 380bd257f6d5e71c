#!/usr/bin/env bash
# Delete a TPU slice: the queued resource with its nodes (queued/multislice) or the TPU VM.
# Checkpoints and logs on GCS are kept.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'EOF'
Usage: launch/tpu_delete.sh --name NAME --zone ZONE [--queued] [--num-slices N] [options]

Delete a TPU slice created by tpu_create.sh (GCS data, checkpoints and logs stay).

Required:
  --name NAME       TPU (and queued resource) name
  --zone ZONE       e.g. us-central2-b
Options:
  --project ID      GCP project (default: gcloud's configured project)
  --queued          It was created through a queued resource (deletes the request and its nodes)
  --num-slices N    Multislice (implies --queued)
  --dry-run         Print the exact commands instead of running them
  -h, --help        This help
EOF
}

NAME="" ZONE="" PROJECT="" QUEUED=0 NUM_SLICES=1

split_equals "$@"
set -- "${ARGS[@]+"${ARGS[@]}"}"
while (($#)); do
  case "$1" in
    --name) need_value "$@"; NAME="$2"; shift 2 ;;
    --zone) need_value "$@"; ZONE="$2"; shift 2 ;;
    --project) need_value "$@"; PROJECT="$2"; shift 2 ;;
    --queued) QUEUED=1; shift ;;
    --num-slices) need_value "$@"; NUM_SLICES="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

validate_slice "$NAME" "$ZONE" "$PROJECT" "$NUM_SLICES"
((NUM_SLICES > 1)) && QUEUED=1

scope_flags
if ((QUEUED)); then
  # --force also deletes the TPU nodes the request created.
  run gcloud compute tpus queued-resources delete "$NAME" "${SCOPE[@]}" --force --quiet
else
  run gcloud compute tpus tpu-vm delete "$NAME" "${SCOPE[@]}" --quiet
fi
