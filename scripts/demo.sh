#!/usr/bin/env bash
# The demo on one machine: installs what is missing, then `fleetwatch demo` (local Kafka, a
# simulated cluster with injected faults, the detectors and actions, a live view and a scorecard).
# Extra arguments go to `fleetwatch demo` (e.g. --nodes 64 --duration 120).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
bash scripts/install.sh
exec python3 -m fleetwatch.cli demo "$@"
