# Shared by the local service scripts (kafka.sh, alertmanager.sh, prometheus.sh, slurm.sh); sourced, not run.
# Each script defines `log` (with its own prefix) before using these.

# svc_running_pid PIDFILE CMDLINE_PATTERN: print the pid if that process is alive and is ours.
svc_running_pid() {
  [[ -f "$1" ]] || return 1
  local pid; pid="$(cat "$1")"
  kill -0 "$pid" 2>/dev/null && grep -qa -- "$2" "/proc/$pid/cmdline" 2>/dev/null && echo "$pid"
}

# svc_http_ready PORT: exit 0 if http://127.0.0.1:PORT/-/ready answers (Prometheus, Alertmanager).
svc_http_ready() { python3 - "$1" <<'PY' 2>/dev/null
import sys, urllib.request
urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/-/ready", timeout=1).read()
PY
}

# svc_wait_ready NAME PIDFILE LOGFILE SECONDS READY_COMMAND...: wait until READY_COMMAND succeeds;
# fail (exit 1, with the log's tail) if the process dies first or the time runs out.
svc_wait_ready() {
  local name=$1 pidfile=$2 logfile=$3 secs=$4; shift 4
  local i
  for ((i = 0; i < secs * 10; i++)); do
    if "$@"; then log "ready (pid $(cat "$pidfile"))"; return 0; fi
    if ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      log "$name exited during start; see $logfile"; tail -20 "$logfile" >&2 || true; exit 1
    fi
    sleep 0.1
  done
  log "$name did not become ready within $secs s; see $logfile"; exit 1
}

# svc_stop NAME PIDFILE CMDLINE_PATTERN SECONDS: SIGTERM, wait, then SIGKILL.
svc_stop() {
  local name=$1 pidfile=$2 pattern=$3 secs=$4 pid i
  if ! pid="$(svc_running_pid "$pidfile" "$pattern")"; then log "not running"; rm -f "$pidfile"; return 0; fi
  kill "$pid"
  for ((i = 0; i < secs * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$pidfile"; log "stopped"; return 0; }
    sleep 0.1
  done
  log "$name did not stop in $secs s; killing"; kill -9 "$pid" 2>/dev/null || true; rm -f "$pidfile"
}
