#!/usr/bin/env bash
# Local Prometheus (Debian package `prometheus`) on loopback, scraping fleetwatch's workers and
# evaluating the pipeline alert rules (rules/fleetwatch-pipeline.yml), for the demo, local runs and
# the tests.
#   prometheus.sh start                     start (prometheus.yml beside this script); no-op if up
#   prometheus.sh stop                      stop the instance started here (by pid)
#   prometheus.sh status                    exit 0 if it answers /-/ready
#   prometheus.sh target JOB HOST:PORT...   scrape these targets as JOB (fleetwatch-detect,
#                                           fleetwatch-act, fleetwatch-agent, fleetwatch-drainer);
#                                           replaces JOB's list; picked up within seconds, no restart
#   prometheus.sh untarget JOB              stop scraping JOB
#   prometheus.sh url                       print the base URL
# Example (a detect worker on its default metrics port):
#   bash services/prometheus/prometheus.sh start
#   fleetwatch detect --metrics-port 9108 &
#   bash services/prometheus/prometheus.sh target fleetwatch-detect 127.0.0.1:9108
#   open http://127.0.0.1:19090/targets and /alerts
# Environment: FLEETWATCH_HOME (default <repo>/.fleetwatch, git-ignored; data and target files go
#              there), PROMETHEUS_PORT (19090), PROMETHEUS_SCRAPE_INTERVAL (5s; the tests use 1s),
#              FLEETWATCH_CLUSTER (the `cluster` label on registered targets, default "local"),
#              PROMETHEUS_RETENTION (2d).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
home="${FLEETWATCH_HOME:-$repo/.fleetwatch}"
port="${PROMETHEUS_PORT:-19090}"
interval="${PROMETHEUS_SCRAPE_INTERVAL:-5s}"
cluster="${FLEETWATCH_CLUSTER:-local}"
retention="${PROMETHEUS_RETENTION:-2d}"
data="$home/prometheus-$port"
targets="$home/prometheus-targets"
pidfile="$data/prometheus.pid"
config="$data/prometheus.yml"
bin="$(command -v prometheus || true)"

# shellcheck source=../lib.sh
source "$here/../lib.sh"
log() { echo "prometheus.sh: $*" >&2; }

ready() { svc_http_ready "$port"; }

running_pid() { svc_running_pid "$pidfile" prometheus; }

# write_targets JOB ADDR...: a file_sd file; written to a temp name and renamed, because Prometheus
# watches the file and must never read it half-written.
write_targets() {
  local job="$1"; shift
  grep -q "job_name: $job\$" "$here/prometheus.yml" || { log "no scrape job '$job' in $here/prometheus.yml"; exit 2; }
  mkdir -p "$targets"
  python3 - "$targets/$job.json" "$cluster" "$@" <<'PY'
import json, os, sys
path, cluster, addrs = sys.argv[1], sys.argv[2], sys.argv[3:]
tmp = path + ".tmp"
with open(tmp, "w") as f:
    json.dump([{"targets": addrs, "labels": {"cluster": cluster}}] if addrs else [], f)
os.replace(tmp, path)
PY
}

render_config() {
  # The repo's prometheus.yml with its two relative paths made absolute (FLEETWATCH_HOME may be
  # anywhere) and the scrape interval of this run.
  sed -e "s#\.\./\.\./\.fleetwatch/prometheus-targets/#$targets/#g" \
      -e "s#^  - rules/#  - $here/rules/#" \
      -e "s#^\(  scrape_interval:\).*#\1 $interval#" \
      -e "s#^\(  evaluation_interval:\).*#\1 $interval#" \
      "$here/prometheus.yml" > "$config.tmp"
  mv "$config.tmp" "$config"
}

start() {
  if pid="$(running_pid)" && ready; then log "already running (pid $pid) on 127.0.0.1:$port"; return 0; fi
  [[ -n "$bin" ]] || { log "prometheus not found (apt-get install prometheus)"; exit 1; }
  mkdir -p "$data/tsdb" "$targets"
  render_config
  write_targets prometheus "127.0.0.1:$port"
  log "starting Prometheus on 127.0.0.1:$port (data in $data, targets in $targets)"
  # setsid: it outlives the shell that started it (the demo reuses it, like the Kafka broker).
  setsid "$bin" --config.file="$config" --storage.tsdb.path="$data/tsdb" \
      --storage.tsdb.retention.time="$retention" --web.listen-address="127.0.0.1:$port" \
      --web.enable-lifecycle >"$data/prometheus.log" 2>&1 </dev/null &
  echo $! > "$pidfile"
  svc_wait_ready prometheus "$pidfile" "$data/prometheus.log" 15 ready
}

stop() { svc_stop prometheus "$pidfile" prometheus 10; }

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) ready ;;
  target)
    [[ $# -ge 3 ]] || { echo "usage: $0 target JOB HOST:PORT..." >&2; exit 2; }
    shift; write_targets "$@" ;;
  untarget)
    [[ $# -eq 2 ]] || { echo "usage: $0 untarget JOB" >&2; exit 2; }
    write_targets "$2" ;;
  url) echo "http://127.0.0.1:$port" ;;
  *) echo "usage: $0 start|stop|status|target JOB HOST:PORT...|untarget JOB|url" >&2; exit 2 ;;
esac
