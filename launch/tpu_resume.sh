#!/usr/bin/env bash
# Bring a preempted (or missing) slice back and continue training: re-create it when it is gone,
# preempted or suspended, re-install bert-jax, and relaunch the same command with the same
# workdir, so the trainer resumes from its latest checkpoint. With --max-restarts it keeps doing
# this until the training finishes.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'EOF'
Usage: launch/tpu_resume.sh --name NAME --zone ZONE --accelerator-type TYPE --stage-dir GS \
         --workdir GS [options] [-- --config.KEY=VALUE ...]

Check the slice; if it is missing, preempted, suspended or failed, delete what is left and create
it again (tpu_create.sh), install (tpu_setup.sh), then run (tpu_run.sh) with the same workdir.

Slice (as for tpu_create.sh): --name --zone --project --accelerator-type --runtime-version
  --spot --preemptible --queued --num-slices --service-account --wait-timeout
Setup (as for tpu_setup.sh): --stage-dir --python
Run (as for tpu_run.sh): --workdir --config --run-id --log-dir --gcs-log-dir --env --detach
  --skip-preflight, and the config
  overrides after '--'
Resume options:
  --setup               Re-install even when the slice was healthy (default: only after re-creating)
  --max-restarts N      After the run fails (a preemption), resume again, up to N times (default 0)
  --assume-state STATE  With --dry-run: the state to plan for (default PREEMPTED; e.g. READY,
                        ACTIVE, SUSPENDED, MISSING), since a dry run queries nothing
  --dry-run             Print the exact commands instead of running them
  -h, --help            This help
EOF
}

NAME="" ZONE="" PROJECT="" ACCELERATOR="" QUEUED=0 NUM_SLICES=1 FORCE_SETUP=0 MAX_RESTARTS=0
# The slice is recreated for the run tpu_run.sh checks again (its preflight), so the create
# step skips its own (which would check the default config).
ASSUMED=PREEMPTED CREATE=(--skip-preflight) SETUP=() RUN=() OVERRIDES=()

split_equals "$@"
set -- "${ARGS[@]+"${ARGS[@]}"}"
while (($#)); do
  case "$1" in
    --name) need_value "$@"; NAME="$2"; shift 2 ;;
    --zone) need_value "$@"; ZONE="$2"; shift 2 ;;
    --project) need_value "$@"; PROJECT="$2"; shift 2 ;;
    --accelerator-type) need_value "$@"; ACCELERATOR="$2"; shift 2 ;;
    --num-slices) need_value "$@"; NUM_SLICES="$2"; shift 2 ;;
    --queued) QUEUED=1; CREATE+=("$1"); shift ;;
    --spot | --preemptible) CREATE+=("$1"); shift ;;
    --runtime-version | --service-account | --wait-timeout) need_value "$@"; CREATE+=("$1" "$2"); shift 2 ;;
    --stage-dir | --python) need_value "$@"; SETUP+=("$1" "$2"); shift 2 ;;
    --workdir | --config | --run-id | --log-dir | --gcs-log-dir | --env) need_value "$@"; RUN+=("$1" "$2"); shift 2 ;;
    --detach | --skip-preflight) RUN+=("$1"); shift ;;
    --setup) FORCE_SETUP=1; shift ;;
    --max-restarts) need_value "$@"; MAX_RESTARTS="$2"; shift 2 ;;
    --assume-state) need_value "$@"; ASSUMED="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; OVERRIDES=("$@"); break ;;
    *) die "unknown argument '$1' (see --help; config overrides go after '--')" ;;
  esac
done

validate_slice "$NAME" "$ZONE" "$PROJECT" "$NUM_SLICES" "$ACCELERATOR"
[[ "$MAX_RESTARTS" =~ ^[0-9]+$ ]] || die "--max-restarts must be 0 or a positive integer, got '$MAX_RESTARTS'"
[[ "$ASSUMED" =~ ^[A-Z_]+$ ]] || die "--assume-state '$ASSUMED' must be a state name such as PREEMPTED or READY"
((NUM_SLICES > 1)) && QUEUED=1

SLICE=(--name "$NAME" --zone "$ZONE" --num-slices "$NUM_SLICES")
[[ -n "$PROJECT" ]] && SLICE+=(--project "$PROJECT")
DRY=()
((DRY_RUN)) && DRY=(--dry-run)
DELETE=("${SLICE[@]}")
((QUEUED)) && DELETE+=(--queued)
# Validate every step's arguments (a dry run of each) before touching anything.
"${LAUNCH_DIR}/tpu_create.sh" "${SLICE[@]}" --accelerator-type "$ACCELERATOR" "${CREATE[@]+"${CREATE[@]}"}" --dry-run >/dev/null
"${LAUNCH_DIR}/tpu_setup.sh" "${SLICE[@]}" "${SETUP[@]+"${SETUP[@]}"}" --dry-run >/dev/null
"${LAUNCH_DIR}/tpu_run.sh" "${SLICE[@]}" --accelerator-type "$ACCELERATOR" "${RUN[@]+"${RUN[@]}"}" \
  --dry-run -- "${OVERRIDES[@]+"${OVERRIDES[@]}"}" >/dev/null

# resume_once: make the slice usable, then run; returns the run's status.
resume_once() {
  local state recreated=0
  if ((DRY_RUN)); then
    state_argv "$QUEUED"
    printf '# the state, from the command below, is taken to be %s (--assume-state)\n%s\n' \
      "$ASSUMED" "$(quote_cmd "${STATE_ARGV[@]}")"
    state="$ASSUMED"
  else
    state="$(slice_state "$QUEUED")"
    log "${NAME} is ${state}"
  fi
  case "$state" in
    READY | ACTIVE) ;;
    CREATING | PROVISIONING | WAITING_FOR_RESOURCES | ACCEPTED | STARTING | RESTARTING | REPAIRING)
      wait_ready "$QUEUED" 7200
      recreated=1
      ;;
    MISSING)
      "${LAUNCH_DIR}/tpu_create.sh" "${SLICE[@]}" --accelerator-type "$ACCELERATOR" "${CREATE[@]+"${CREATE[@]}"}" "${DRY[@]+"${DRY[@]}"}"
      recreated=1
      ;;
    *) # PREEMPTED, SUSPENDED, FAILED, TERMINATED, STOPPED, ...: delete what is left, create again
      "${LAUNCH_DIR}/tpu_delete.sh" "${DELETE[@]}" "${DRY[@]+"${DRY[@]}"}"
      "${LAUNCH_DIR}/tpu_create.sh" "${SLICE[@]}" --accelerator-type "$ACCELERATOR" "${CREATE[@]+"${CREATE[@]}"}" "${DRY[@]+"${DRY[@]}"}"
      recreated=1
      ;;
  esac
  if ((recreated || FORCE_SETUP)); then
    "${LAUNCH_DIR}/tpu_setup.sh" "${SLICE[@]}" "${SETUP[@]}" "${DRY[@]+"${DRY[@]}"}"
  fi
  "${LAUNCH_DIR}/tpu_run.sh" "${SLICE[@]}" --accelerator-type "$ACCELERATOR" "${RUN[@]}" \
    "${DRY[@]+"${DRY[@]}"}" -- "${OVERRIDES[@]+"${OVERRIDES[@]}"}"
}

for ((attempt = 0; ; attempt++)); do
  rc=0
  resume_once || rc=$?
  ((rc == 0)) && exit 0
  ((attempt < MAX_RESTARTS)) || exit "$rc"
  log "run failed (status ${rc}); resuming again ($((attempt + 1))/${MAX_RESTARTS}) in 60 s"
  sleep 60
done
