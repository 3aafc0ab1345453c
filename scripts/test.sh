#!/usr/bin/env bash
# Runs the whole test suite against real services: installs what is missing, starts the local
# Kafka broker (idempotent), lints, then pytest. Extra arguments go to pytest.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
bash scripts/install.sh
bash services/kafka/kafka.sh start
python3 -m ruff check .
python3 -m ruff format --check .
python3 -m pytest -q "$@"
