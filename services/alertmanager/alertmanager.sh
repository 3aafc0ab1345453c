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

# shellcheck source=../lib.sh
source "$here/../lib.sh"
log() { echo "alertmanager.sh: $*" >&2; }

ready() { svc_http_ready "$port"; }

running_pid() { svc_running_pid "$pidfile" alertmanager; }

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
  svc_wait_ready alertmanager "$pidfile" "$data/alertmanager.log" 10 ready
}

stop() { svc_stop alertmanager "$pidfile" alertmanager 5; }

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) ready ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
