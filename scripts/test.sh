#!/usr/bin/env bash
# Runs the whole test suite against real services: installs what is missing, starts the local
# Kafka broker (idempotent), lints, then pytest: the unit tier in two processes (pytest-xdist: it
# needs no service, so its tests can run side by side), then the integration tier as three pytest
# processes (below). Extra arguments go to a single pytest run instead (e.g. -k, a file).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
# the scanner compiled with bounds checks, which one unit test runs: a build step (~2 min of one
# core on a fresh clone, a second once cached), kept out of the unit tier's own time. Where numba is
# installed already (a clean clone on a machine that ran the suite before, as CI's) it starts before
# the install, beside its downloads and its own compile of the project's kernels; otherwise after
# it, beside the services' start and the lint, which mostly wait.
warm_pid="" early=""
start_warm() {
  python3 -c "from tests.helpers.bounds_checked import warm; warm()" &
  warm_pid=$!
}
stop_warm() {  # on any exit: a failed install or lint leaves no compile running
  if [[ -n "$warm_pid" ]]; then pkill -P "$warm_pid" 2>/dev/null || true; kill "$warm_pid" 2>/dev/null || true; fi
}
trap stop_warm EXIT
if [[ $# -eq 0 ]] && python3 -c "import numba, numpy" 2>/dev/null; then
  start_warm
  early=1
fi
bash scripts/install.sh
if [[ $# -eq 0 && -z "$early" ]]; then
  start_warm
fi
bash services/kafka/kafka.sh start
if [[ $# -eq 0 ]]; then  # the brokers of the Slurm integration process and of the third (below),
  # the suite's own: started empty, as on CI's clean clone (the first broker is the demo's too)
  KAFKA_PORT=19992 KAFKA_CONTROLLER_PORT=19993 bash services/kafka/kafka.sh fresh
  KAFKA_PORT=18892 KAFKA_CONTROLLER_PORT=18893 bash services/kafka/kafka.sh fresh
fi
python3 -m ruff check .
python3 -m ruff format --check .
if [[ $# -gt 0 ]]; then
  exec python3 -m pytest -q "$@"
fi
# An early build ran on what was installed before the install, which may have added what it lacked
# or upgraded numba (whose cache then serves no build of another version): once more after it, a
# few seconds where its cache stands
if [[ -n "$early" ]]; then
  wait "$warm_pid" || true
  start_warm
fi
wait "$warm_pid"
warm_pid=""
echo "--- set up in ${SECONDS} s (install, services, lint, the bounds-checked build)"
# each process's slowest tests in its output (--durations): where the suite's time goes, on CI too
python3 -m pytest -q -n 2 --durations=8 tests/unit
# The integration tier mostly waits on its services (paced producers, session timeouts), so it runs
# as three pytest processes side by side: the files that use the one Slurm cluster (marker `slurm`),
# one after the other, with a few files that need no shared service (marker `beside_slurm`); long
# files that need no shared service (marker `apart`); and the rest. Each has a broker of its own,
# and a private one that its tests stop and restart (tests/integration/conftest.py): the tests use
# the pipeline's own topics, and one process's detect or act would read another's telemetry,
# findings and census as its own. The markers even out the three processes' times. Not
# pytest-xdist's groups: with pytest 9 its --dist loadgroup no longer keeps a group in one process.
slurm_log="$(mktemp)" apart_log="$(mktemp)"
# each failure as it happens (tests/integration/conftest.py): shown if a process dies before its summary
rest_failures="$(mktemp)" slurm_failures="$(mktemp)" apart_failures="$(mktemp)"
trap 'rm -f "$slurm_log" "$apart_log" "$rest_failures" "$slurm_failures" "$apart_failures"' EXIT
FLEETWATCH_TEST_FAILURE_LOG="$slurm_failures" FLEETWATCH_TEST_KAFKA_PORT=19992 \
  FLEETWATCH_TEST_PRIVATE_PORT=19592 python3 -m pytest -q -p no:cacheprovider --durations=8 -m "slurm or beside_slurm" tests/integration \
  >"$slurm_log" 2>&1 &
slurm_pid=$!
FLEETWATCH_TEST_FAILURE_LOG="$apart_failures" FLEETWATCH_TEST_KAFKA_PORT=18892 \
  FLEETWATCH_TEST_PRIVATE_PORT=18992 python3 -m pytest -q -p no:cacheprovider --durations=8 -m "apart" tests/integration \
  >"$apart_log" 2>&1 &
apart_pid=$!
rest=0
FLEETWATCH_TEST_FAILURE_LOG="$rest_failures" python3 -m pytest -q --durations=8 -m "not slurm and not beside_slurm and not apart" \
  tests/integration || rest=$?
if ((rest > 5)); then  # not one of pytest's own exit codes: the process died
  echo "--- the integration process died (exit $rest); its failures until then:"
  cat "$rest_failures"
fi
slurm=0 apart=0
wait "$slurm_pid" || slurm=$?
wait "$apart_pid" || apart=$?
echo "--- tests/integration, the files that use Slurm and those run beside them (beside the above) ---"
cat "$slurm_log"
if ((slurm > 5)); then
  echo "--- the Slurm integration process died (exit $slurm); its failures until then:"
  cat "$slurm_failures"
fi
echo "--- tests/integration, the long files run apart (beside the above) ---"
cat "$apart_log"
if ((apart > 5)); then
  echo "--- the third integration process died (exit $apart); its failures until then:"
  cat "$apart_failures"
fi
echo "--- the suite took ${SECONDS} s"
((rest == 0 && slurm == 0 && apart == 0))
