#!/usr/bin/env bash
# Install bert-jax with pinned dependencies (launch/requirements-tpu.txt) on every worker of a TPU
# slice: build a wheel of this checkout, bundle it with experiments/ and the worker helper, stage
# the bundle on GCS, then install it on all workers at once into ~/bert-jax-venv.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

UV_VERSION=0.13.9 # installs the pinned Python and the requirements on the workers

usage() {
  cat <<'EOF'
Usage: launch/tpu_setup.sh --name NAME --zone ZONE --stage-dir gs://BUCKET/PATH [options]

Install bert-jax (this checkout) and its pinned dependencies on every TPU worker.

Required:
  --name NAME            TPU name (the queued resource name for multislice)
  --zone ZONE            e.g. us-central2-b
  --stage-dir GS_URL     GCS folder the bundle is copied through, e.g. gs://my-bucket/stage
Options:
  --project ID           GCP project (default: gcloud's configured project)
  --num-slices N         Number of slices (multislice: all nodes of the queued resource)
  --python VERSION       Python for the workers' virtualenv (default 3.12)
  --dry-run              Print the exact commands instead of running them
  -h, --help             This help

On each worker: ~/bert-jax (experiments/, launch/, dist/*.whl) and ~/bert-jax-venv.
EOF
}

NAME="" ZONE="" PROJECT="" STAGE="" NUM_SLICES=1 PYTHON_VERSION=3.12

split_equals "$@"
set -- "${ARGS[@]+"${ARGS[@]}"}"
while (($#)); do
  case "$1" in
    --name) need_value "$@"; NAME="$2"; shift 2 ;;
    --zone) need_value "$@"; ZONE="$2"; shift 2 ;;
    --project) need_value "$@"; PROJECT="$2"; shift 2 ;;
    --stage-dir) need_value "$@"; STAGE="${2%/}"; shift 2 ;;
    --num-slices) need_value "$@"; NUM_SLICES="$2"; shift 2 ;;
    --python) need_value "$@"; PYTHON_VERSION="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

require --name "$NAME"
require --zone "$ZONE"
require --stage-dir "$STAGE"
validate_name "$NAME"
validate_zone "$ZONE"
validate_project "$PROJECT"
validate_gcs --stage-dir "$STAGE"
validate_positive_int --num-slices "$NUM_SLICES"
[[ "$PYTHON_VERSION" =~ ^3\.(1[1-9])$ ]] || die "--python '$PYTHON_VERSION' must be 3.11 or newer, e.g. 3.12"

BUILD="${REPO_ROOT}/build/launch"
BUNDLE="${STAGE}/bert-jax-bundle.tgz"

# 1. A wheel of this checkout plus the files the workers run from.
run rm -rf "${BUILD}"
run mkdir -p "${BUILD}/dist"
run python3 -m pip wheel --quiet --no-deps --wheel-dir "${BUILD}/dist" "${REPO_ROOT}"
run tar -czf "${BUILD}/bert-jax-bundle.tgz" -C "${REPO_ROOT}" experiments launch/worker_run.sh \
  launch/requirements-tpu.txt -C "${BUILD}" dist
run gcloud storage cp "${BUILD}/bert-jax-bundle.tgz" "${BUNDLE}"

# 2. Install on every worker of every slice, all at once.
# shellcheck disable=SC2016 # $HOME and $(...) expand on the worker
printf -v REMOTE '%s; ' \
  'set -euo pipefail' \
  'cd "$HOME"' \
  "gcloud storage cp $(quote_cmd "$BUNDLE") bert-jax-bundle.tgz" \
  'rm -rf bert-jax bert-jax-venv && mkdir bert-jax && tar -xzf bert-jax-bundle.tgz -C bert-jax' \
  "python3 -m pip install --user --quiet uv==${UV_VERSION} || python3 -m pip install --user --quiet --break-system-packages uv==${UV_VERSION}" \
  "\"\$HOME/.local/bin/uv\" venv --quiet --python $(quote_cmd "$PYTHON_VERSION") bert-jax-venv" \
  '"$HOME/.local/bin/uv" pip install --quiet --python bert-jax-venv/bin/python -r bert-jax/launch/requirements-tpu.txt' \
  '"$HOME/.local/bin/uv" pip install --quiet --python bert-jax-venv/bin/python --no-deps bert-jax/dist/*.whl' \
  'bert-jax-venv/bin/bert-jax --help >/dev/null' \
  'echo "$(hostname): $(bert-jax-venv/bin/python -c "import jax, bert_jax; print(\"jax\", jax.__version__)") ready"'
REMOTE="${REMOTE%; }"
if ((NUM_SLICES > 1)); then
  ssh_argv "$NUM_SLICES" all all "$REMOTE"
else
  ssh_argv 1 0 all "$REMOTE"
fi
run "${SSH_ARGV[@]}"
((DRY_RUN)) || log "installed on every worker of ${NAME}; next: launch/tpu_run.sh"
