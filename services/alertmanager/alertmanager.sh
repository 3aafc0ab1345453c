#!/usr/bin/env bash
# Local Prometheus Alertmanager (Debian package prometheus-alertmanager) on loopback, for the demo
# and the tests of `fleetwatch act`.
#   alertmanager.sh start    start with the config (default: alertmanager.yml beside this script); no-op if up
#   alertmanager.sh stop     stop the instance started here (by pid)
#   alertmanager.sh status   exit 0 if it answers /-/ready
# Environment: FLEETWATCH_HOME (default <repo>/.fleetwatch), ALERTMANAGER_PORT (19094; 19093 is
#              Kafka's controller), ALERTMANAGER_CONFIG (config file).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
home="${FLEETWATCH_HOME:-$repo/.fleetwatch}"
port="${ALERTMANAGER_PORT:-19094}"
config="${ALERTMANAGER_CONFIG:-$here/alertmanager.yml}"
data="$home/alertmanager-$port"
pidfile="$data/alertmanager.pid"
bin="$(command -v prometheus-alertmanager || command -v alertmanager || true)"

log() { echo "alertmanager.sh: $*" >&2; }

ready() { python3 - "$port" <<'PY' 2>/dev/null
import sys, urllib.request
urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/-/ready", timeout=1).read()
PY
}

running_pid() {
  [[ -f "$pidfile" ]] || return 1
  local pid; pid="$(cat "$pidfile")"
  kill -0 "$pid" 2>/dev/null && grep -qa alertmanager "/proc/$pid/cmdline" 2>/dev/null && echo "$pid"
}

start() {
  if pid="$(running_pid)" && ready; then log "already running (pid $pid) on 127.0.0.1:$port"; return 0; fi
  [[ -n "$bin" ]] || { log "alertmanager not found (apt-get install prometheus-alertmanager)"; exit 1; }
  mkdir -p "$data"
  log "starting Alertmanager on 127.0.0.1:$port with $config"
  # --cluster.listen-address= (empty) turns off the gossip listener on 0.0.0.0:9094.
  setsid "$bin" --config.file="$config" --storage.path="$data" \
      --web.listen-address="127.0.0.1:$port" --cluster.listen-address= \
      >"$data/alertmanager.log" 2>&1 </dev/null &
  echo $! > "$pidfile"
  for _ in $(seq 1 100); do
    if ready; then log "ready (pid $(cat "$pidfile"))"; return 0; fi
    if ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      log "alertmanager exited during start:"; tail -20 "$data/alertmanager.log" >&2 || true; exit 1
    fi
    sleep 0.1
  done
  log "alertmanager did not answer on 127.0.0.1:$port within 10 s"; exit 1
}

stop() {
  local pid
  if ! pid="$(running_pid)"; then log "not running"; rm -f "$pidfile"; return 0; fi
  kill "$pid"
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$pidfile"; log "stopped"; return 0; }
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true; rm -f "$pidfile"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) ready ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
