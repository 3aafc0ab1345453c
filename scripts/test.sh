#!/usr/bin/env bash
# Runs the whole test suite against real services: installs what is missing, starts the local
# Kafka broker (idempotent), lints, then pytest: the unit tier in two processes (pytest-xdist: it
# needs no service, so its tests can run side by side), then the integration tier in one (its tests
# share the real services). Extra arguments go to a single pytest run instead (e.g. -k, a file).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
bash scripts/install.sh
# the scanner compiled with bounds checks, which one unit test runs: a build step (~2 min of one
# core on a fresh clone, a second once cached), kept out of the unit tier's own time and run
# beside the services' start and the lint, which mostly wait
warm_pid=""
if [[ $# -eq 0 ]]; then
  python3 -c "from tests.helpers.bounds_checked import warm; warm()" &
  warm_pid=$!
fi
bash services/kafka/kafka.sh start
python3 -m ruff check .
python3 -m ruff format --check .
if [[ $# -gt 0 ]]; then
  exec python3 -m pytest -q "$@"
fi
wait "$warm_pid"
python3 -m pytest -q -n 2 tests/unit
python3 -m pytest -q tests/integration
