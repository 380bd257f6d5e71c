#!/usr/bin/env bash
# Runs ON a TPU worker (shipped by tpu_setup.sh, called by tpu_run.sh over ssh). Starts the
# training command in its own session (setsid), so it survives the ssh connection, writes its
# output to a log file, uploads that log to GCS every minute and at exit, and forwards SIGTERM so
# the trainer can checkpoint. No tmux, no nohup.
#
#   worker_run.sh start --log-name NAME --run-id ID [--gcs-log-dir GS] [--env K=V]... [--follow] -- CMD...
#   worker_run.sh stop [--timeout S]
#
# State lives under $BERT_JAX_RUNS (default ~/bert-jax-runs): RUN_ID/NAME.{log,pid,exit} and
# current.pid (the supervisor of the running launch).
set -euo pipefail

RUNS="${BERT_JAX_RUNS:-$HOME/bert-jax-runs}"
PIDFILE="${RUNS}/current.pid"
UPLOAD_EVERY="${BERT_JAX_UPLOAD_EVERY:-60}"

die() {
  echo "worker_run: error: $*" >&2
  exit 2
}

# stop_running TIMEOUT: SIGTERM the running launch (the trainer saves a checkpoint and exits),
# then SIGKILL its whole session if it is still alive after TIMEOUT seconds.
stop_running() {
  local timeout="$1" pid waited=0
  [[ -f "$PIDFILE" ]] || return 0
  pid="$(<"$PIDFILE")"
  if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
    echo "worker_run: stopping the previous launch (pid ${pid})" >&2
    kill -TERM "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null && ((waited < timeout)); do
      sleep 1
      waited=$((waited + 1))
    done
    kill -KILL -- "-${pid}" 2>/dev/null || true
  fi
  rm -f "$PIDFILE"
}

# upload LOG GCS_DIR: copy the log next to the run's checkpoints; failures only warn.
upload() {
  [[ -n "$2" ]] || return 0
  gcloud storage cp --quiet "$1" "$2/" >/dev/null 2>&1 || echo "worker_run: log upload to $2 failed" >&2
}

# supervise LOG EXITFILE GCS_DIR CMD...: the session leader; runs CMD, uploads, records the status.
supervise() {
  local log="$1" exitfile="$2" gcs="$3" child uploader rc
  shift 3
  echo "$$" >"${log%.log}.pid"
  echo "$$" >"$PIDFILE"
  child=""
  trap '[[ -n "$child" ]] && kill -TERM "$child" 2>/dev/null' TERM INT HUP
  "$@" >>"$log" 2>&1 </dev/null &
  child=$!
  if [[ -n "$gcs" ]]; then
    (while sleep "$UPLOAD_EVERY"; do upload "$log" "$gcs"; done) &
    uploader=$!
  fi
  rc=0
  wait "$child" || rc=$?
  while kill -0 "$child" 2>/dev/null; do # wait returned early for a trapped signal
    rc=0
    wait "$child" || rc=$?
  done
  [[ -n "${uploader:-}" ]] && kill "$uploader" 2>/dev/null
  echo "worker_run: command exited with status ${rc} at $(date -u +%FT%TZ)" >>"$log"
  upload "$log" "$gcs"
  echo "$rc" >"$exitfile"
  rm -f "$PIDFILE"
  exit "$rc"
}

start() {
  local name="" run_id="" gcs="" follow=0 envs=() log exitfile pid waited=0
  while (($#)); do
    case "$1" in
      --log-name) name="$2"; shift 2 ;;
      --run-id) run_id="$2"; shift 2 ;;
      --gcs-log-dir) gcs="${2%/}"; shift 2 ;;
      --env) envs+=("$2"); shift 2 ;;
      --follow) follow=1; shift ;;
      --) shift; break ;;
      *) die "unknown argument '$1'" ;;
    esac
  done
  [[ "$name" =~ ^[A-Za-z0-9_.-]+$ && "$run_id" =~ ^[A-Za-z0-9_.-]+$ ]] || die "--log-name and --run-id are required"
  (($#)) || die "no command after --"

  stop_running 300
  mkdir -p "${RUNS}/${run_id}"
  log="${RUNS}/${run_id}/${name}.log"
  exitfile="${RUNS}/${run_id}/${name}.exit"
  rm -f "$exitfile" "${log%.log}.pid"
  echo "worker_run: $(hostname) starting at $(date -u +%FT%TZ): $*" >>"$log"
  local kv
  for kv in "${envs[@]+"${envs[@]}"}"; do
    export "${kv?}"
  done
  setsid bash "${BASH_SOURCE[0]}" _supervise "$log" "$exitfile" "$gcs" "$@" </dev/null >/dev/null 2>&1 &
  while [[ ! -s "${log%.log}.pid" ]] && ((waited < 100)); do
    sleep 0.1
    waited=$((waited + 1))
  done
  [[ -s "${log%.log}.pid" ]] || die "the supervisor did not start; see ${log}"
  pid="$(<"${log%.log}.pid")"
  echo "worker_run: started pid ${pid}, log ${log}${gcs:+, uploaded to ${gcs}/${name}.log}" >&2
  ((follow)) || return 0
  # Stream the log until the run ends; a dropped ssh connection ends only this tail.
  tail -n +1 -F --pid="$pid" "$log" 2>/dev/null || true
  waited=0
  while [[ ! -f "$exitfile" ]] && ((waited < 200)); do # the exit file lands just after the pid ends
    sleep 0.1
    waited=$((waited + 1))
  done
  [[ -f "$exitfile" ]] || die "the run ended without an exit status; see ${log}"
  exit "$(<"$exitfile")"
}

case "${1:-}" in
  start) shift; start "$@" ;;
  stop)
    shift
    timeout=300
    [[ "${1:-}" == --timeout && "${2:-}" =~ ^[0-9]+$ ]] && timeout="$2"
    stop_running "$timeout"
    ;;
  _supervise) shift; supervise "$@" ;;
  *) die "usage: worker_run.sh start|stop ... (see the header of this file)" ;;
esac
