# shellcheck shell=bash disable=SC2034 # the globals set here are read by the scripts that source this
# Shared helpers for the launch/ scripts: errors, argument parsing, validation, safe quoting and
# run-or-print (--dry-run). Sourced, never executed. Needs bash >= 4.4 (macOS: `brew install bash`).

if ((BASH_VERSINFO[0] < 4 || (BASH_VERSINFO[0] == 4 && BASH_VERSINFO[1] < 4))); then
  echo "error: bash >= 4.4 is required (found ${BASH_VERSION}); on macOS run 'brew install bash'" >&2
  exit 2
fi

LAUNCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${LAUNCH_DIR}/.." && pwd)"
DRY_RUN=0

die() {
  echo "error: $*" >&2
  exit 2
}

log() {
  echo "[$(basename "$0")] $*" >&2
}

# quote_cmd ARG... -> one line that bash parses back into exactly these arguments. Plain words stay
# bare, others go in single quotes (readable, nothing expands inside), and any argument holding a
# single quote or a newline is quoted by printf %q.
quote_cmd() {
  local arg word out=()
  for arg in "$@"; do
    if [[ "$arg" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
      out+=("$arg")
    elif [[ "$arg" != *"'"* && "$arg" != *$'\n'* ]]; then
      out+=("'${arg}'")
    else
      printf -v word '%q' "$arg"
      out+=("$word")
    fi
  done
  printf '%s' "${out[*]}"
}

# run ARG...: with --dry-run print the quoted command on stdout; otherwise echo it to stderr and
# run it.
run() {
  if ((DRY_RUN)); then
    printf '%s\n' "$(quote_cmd "$@")"
  else
    printf '+ %s\n' "$(quote_cmd "$@")" >&2
    "$@"
  fi
}

# need_value FLAG [VALUE...]: fail unless the flag is followed by a value (callers pass "$@" and
# then `shift 2`).
need_value() {
  (($# >= 2)) && [[ -n "$2" && "$2" != --* ]] || die "$1 needs a value"
}

# split_equals ARG... -> the global array ARGS, with every '--flag=value' before '--' split into
# '--flag' 'value', so each script parses one form only.
split_equals() {
  ARGS=()
  while (($#)); do
    if [[ "$1" == "--" ]]; then
      ARGS+=("$@")
      return
    elif [[ "$1" == --*=* ]]; then
      ARGS+=("${1%%=*}" "${1#*=}")
    else
      ARGS+=("$1")
    fi
    shift
  done
}

validate_name() {
  [[ "$1" =~ ^[a-z]([-a-z0-9]{0,46}[a-z0-9])?$ ]] ||
    die "--name '$1' is not a valid TPU name: lowercase letters, digits and '-', starting with a letter, at most 48 characters"
}

validate_zone() {
  [[ "$1" =~ ^[a-z]+-[a-z]+[0-9]+-[a-z]$ ]] ||
    die "--zone '$1' is not a zone name like us-central2-b or europe-west4-a"
}

validate_project() {
  [[ -z "$1" || "$1" =~ ^[a-z][-a-z0-9]{4,28}[a-z0-9]$ || "$1" =~ ^[a-z0-9.-]+:[a-z][-a-z0-9]{4,28}[a-z0-9]$ ]] ||
    die "--project '$1' is not a project id (6-30 lowercase letters, digits, '-')"
}

# validate_positive_int FLAG VALUE
validate_positive_int() {
  [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1 must be a positive integer, got '$2'"
}

# validate_accelerator TYPE: v2-/v3-/v4-/v5p- count TensorCores (two per chip, multiples of 8);
# v5litepod-/v6e- count chips (1, 4, 8 or a multiple of 16).
validate_accelerator() {
  local type="$1" family size
  [[ "$type" =~ ^(v2|v3|v4|v5p|v5litepod|v6e)-([0-9]+)$ ]] ||
    die "--accelerator-type '$type' must look like v4-32, v5litepod-64, v5p-128, v6e-16, v3-32 or v2-8"
  family="${BASH_REMATCH[1]}"
  size="${BASH_REMATCH[2]}"
  case "$family" in
    v2 | v3 | v4 | v5p)
      ((size >= 8 && size % 8 == 0)) ||
        die "--accelerator-type '$type': ${family} sizes count TensorCores and are multiples of 8 (e.g. ${family}-8, ${family}-32)"
      ;;
    v5litepod | v6e)
      ((size == 1 || size == 4 || size == 8 || (size >= 16 && size % 16 == 0))) ||
        die "--accelerator-type '$type': ${family} sizes count chips: 1, 4, 8, 16, 32, 64, 128, 256"
      ;;
  esac
}

# workers_per_slice TYPE -> number of TPU VM hosts in one slice of this type.
workers_per_slice() {
  local family="${1%-*}" size="${1##*-}"
  case "$family" in
    v2 | v3 | v4 | v5p) echo $(((size + 7) / 8)) ;;     # 4 chips = 8 TensorCores per host
    v5litepod | v6e) if ((size <= 8)); then echo 1; else echo $((size / 4)); fi ;; # 4 chips per host in multi-host slices
  esac
}

# default_runtime_version TYPE -> the TPU VM image for this generation.
default_runtime_version() {
  case "${1%-*}" in
    v2 | v3 | v4) echo tpu-ubuntu2204-base ;;
    v5litepod) echo v2-alpha-tpuv5-lite ;;
    v5p) echo v2-alpha-tpuv5 ;;
    v6e) echo v2-alpha-tpuv6e ;;
  esac
}

# validate_gcs FLAG PATH: a gs://bucket[/path] URL.
validate_gcs() {
  [[ "$2" =~ ^gs://[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9](/.*)?$ ]] ||
    die "$1 must be a gs://bucket/path URL (every TPU worker must reach it), got '$2'"
}

# config_variants FILE -> the names in the file's `VARIANTS = (...)` tuple, one per line (none if
# the file has no such tuple).
config_variants() {
  [[ -f "$1" ]] || return 0
  sed -n '/^VARIANTS *= *(/,/)/p' "$1" | grep -o '"[A-Za-z0-9_]*"' | tr -d '"'
}

# validate_config_spec SPEC: FILE.py:VARIANT, FILE relative to the repository root; when the file
# lists its VARIANTS (experiments/pretrain.py does), the variant must be one of them.
validate_config_spec() {
  [[ "$1" =~ ^[^:]+\.py:[A-Za-z0-9_]+$ ]] ||
    die "--config '$1' must be FILE.py:VARIANT, e.g. experiments/pretrain.py:bert_base_phase1"
  local file="${1%%:*}" variant="${1##*:}" variants
  [[ -f "${REPO_ROOT}/${file}" ]] || die "--config: no file ${file} in ${REPO_ROOT} (it is shipped to the workers by tpu_setup.sh)"
  variants="$(config_variants "${REPO_ROOT}/${file}")"
  if [[ -n "$variants" ]] && ! grep -qx -- "$variant" <<<"$variants"; then
    die "--config: unknown variant '${variant}' of ${file}; expected one of: ${variants//$'\n'/ }"
  fi
}

# validate_overrides GCS_ONLY ARG...: every extra argument is --config.KEY=VALUE; with
# GCS_ONLY=1 the data directories must be gs:// (TPU workers share no filesystem).
validate_overrides() {
  local gcs_only="$1" arg key value
  shift
  for arg in "$@"; do
    [[ "$arg" =~ ^--config\.([A-Za-z0-9_.]+)=(.*)$ ]] ||
      die "extra argument '$arg' after '--' must be a config override --config.KEY=VALUE"
    key="${BASH_REMATCH[1]}"
    value="${BASH_REMATCH[2]}"
    case "$key" in
      data.directory | data.tokenizer)
        if ((gcs_only)); then
          validate_gcs "--config.${key}" "$value"
        elif [[ "$value" != gs://* && "$value" != /* ]]; then
          die "--config.${key} must be an absolute path on a shared filesystem or gs://, got '$value'"
        fi
        ;;
      parallel.dcn_mesh.data | global_batch_size | checkpoint.every_steps)
        validate_positive_int "--config.${key}" "$value"
        ;;
    esac
  done
}

# validate_env KEY=VALUE
validate_env() {
  [[ "$1" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env '$1' must be KEY=VALUE"
}

# The gcloud flags that place a command: --zone and, if given, --project.
scope_flags() {
  SCOPE=("--zone=${ZONE}")
  [[ -n "${PROJECT}" ]] && SCOPE+=("--project=${PROJECT}")
  return 0
}

# ssh_argv NUM_SLICES SLICE WORKER COMMAND -> SSH_ARGV, the gcloud command that runs COMMAND on
# one worker ('all' for SLICE/WORKER reaches every one). Multislice nodes belong to the queued
# resource NAME and are addressed by index.
ssh_argv() {
  local num_slices="$1" slice="$2" worker="$3" command="$4"
  scope_flags
  if ((num_slices > 1)); then
    SSH_ARGV=(gcloud compute tpus queued-resources ssh "${NAME}" "${SCOPE[@]}"
      "--node=${slice}" "--worker=${worker}" --strict-host-key-checking=no "--command=${command}")
  else
    SSH_ARGV=(gcloud compute tpus tpu-vm ssh "${NAME}" "${SCOPE[@]}"
      "--worker=${worker}" --strict-host-key-checking=no "--command=${command}")
  fi
}

# require FLAG VALUE: fail with a clear message when a required flag is missing.
# validate_slice NAME ZONE PROJECT NUM_SLICES [ACCELERATOR]: the flags every slice command
# shares, required and validated (the accelerator type only where the command takes one).
validate_slice() {
  require --name "$1"
  require --zone "$2"
  if (($# > 4)); then require --accelerator-type "$5"; fi
  validate_name "$1"
  validate_zone "$2"
  validate_project "$3"
  if (($# > 4)); then validate_accelerator "$5"; fi
  validate_positive_int --num-slices "$4"
}

require() {
  [[ -n "$2" ]] || die "$1 is required (see --help)"
}

# state_argv QUEUED -> STATE_ARGV, the gcloud command printing the slice's state: a queued
# resource's (ACTIVE, WAITING_FOR_RESOURCES, SUSPENDED, FAILED, ...) or a node's (READY, CREATING,
# PREEMPTED, ...).
state_argv() {
  scope_flags
  if (($1)); then
    STATE_ARGV=(gcloud compute tpus queued-resources describe "${NAME}" "${SCOPE[@]}" "--format=value(state.state)")
  else
    STATE_ARGV=(gcloud compute tpus tpu-vm describe "${NAME}" "${SCOPE[@]}" "--format=value(state)")
  fi
}

# slice_state QUEUED -> prints the state, or MISSING when the resource does not exist.
slice_state() {
  state_argv "$1"
  local state
  state="$("${STATE_ARGV[@]}" 2>/dev/null)" || state=MISSING
  echo "${state:-MISSING}"
}

# wait_ready QUEUED TIMEOUT_S: poll until the slice is usable; fail on a terminal state.
wait_ready() {
  local queued="$1" timeout="$2" state deadline
  state_argv "$queued"
  if ((DRY_RUN)); then
    printf '# poll every 30 s, up to %s s, until ACTIVE/READY:\n%s\n' "$timeout" "$(quote_cmd "${STATE_ARGV[@]}")"
    return 0
  fi
  deadline=$((SECONDS + timeout))
  while :; do
    state="$(slice_state "$queued")"
    case "$state" in
      ACTIVE | READY) log "${NAME} is ${state}"; return 0 ;;
      FAILED | SUSPENDED | PREEMPTED | TERMINATED | MISSING)
        die "${NAME} is ${state}; delete it (tpu_delete.sh) or re-create it (tpu_resume.sh)" ;;
    esac
    ((SECONDS < deadline)) || die "${NAME} still ${state} after ${timeout} s (raise --wait-timeout)"
    log "${NAME} is ${state}; waiting"
    sleep 30
  done
}

# preflight CONFIG ACCELERATOR NUM_SLICES OVERRIDE...: compile the training step for this slice on
# this machine (`bert-jax compile`, docs/tpu.md) and stop unless it fits the chips' memory. Runs
# before anything is created or started; under --dry-run it prints the command as a comment.
# BERT_JAX_PYTHON picks the interpreter (default python3; it needs bert-jax's packages and
# libtpu). Generations the compile check has no data for (v2, v3) are skipped with a note.
preflight() {
  local config="$1" accelerator="$2" slices="$3" rc=0
  shift 3
  local cmd=("${BERT_JAX_PYTHON:-python3}" -m bert_jax compile --config "$config"
    --topology "$accelerator" --num-slices "$slices" "$@")
  if [[ ! "$accelerator" =~ ^(v4|v5p|v5litepod|v6e)- ]]; then
    log "preflight skipped: no compile data for ${accelerator%-*}"
    return 0
  fi
  if ((DRY_RUN)); then
    printf '# preflight (cd %s): %s\n' "$(quote_cmd "$REPO_ROOT")" "$(quote_cmd "${cmd[@]}")"
    return 0
  fi
  log "preflight: compiling ${config} for ${slices} x ${accelerator} (--skip-preflight skips)"
  (cd "$REPO_ROOT" && "${cmd[@]}") >&2 || rc=$?
  case "$rc" in
    0) log "preflight: the step fits ${accelerator}" ;;
    1) die "preflight: ${config} does not fit ${slices} x ${accelerator} (see the levers above); not launching. Change the config or pass --skip-preflight" ;;
    *) die "preflight: the compile check failed (exit ${rc}); fix the config or pass --skip-preflight" ;;
  esac
}
