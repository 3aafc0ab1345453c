"""The paper's figures reproduced through the real pipeline (benchmarks/rsc1.py) on a shorter run:
a week of a 1,024-node cluster at a high failure rate (enough failures for tight intervals), on a
private broker, through a real `fleetwatch detect` and `fleetwatch account`. The simulator's true
failure rate and the true MTTF of the large jobs lie inside the measured 95% intervals, and every
component's failures are found about as many times as they happened. A second run with lemons:
the report names them (and no healthy node), and their drains cut the large jobs' failure share.

The benchmark runs as the command the README gives, in a process of its own: its Kafka clients
(librdkafka) live there, so a crash of theirs fails this test instead of taking the whole test
process (and every report before it) down. faulthandler prints the Python threads of a crash in
Python's own threads; for one in librdkafka's threads (which block signals) the failure carries the
crashing thread's native backtrace from its core file (tests/helpers/crash.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from scipy.stats import fisher_exact

from tests.helpers.crash import dumping_core, native_backtrace
from tests.integration.services import APART

# its own private brokers only; ~75 s, run in the Slurm tests' process to balance the two (scripts/test.sh)
pytestmark = APART

REPO = Path(__file__).resolve().parents[2]


def rsc1(work: Path, port: int, *args: str) -> dict:
    """`python -m benchmarks.rsc1 --json ARGS` in a process of its own, on a private broker on
    `port` (each run its own: no run starts a broker on a port the last one is still leaving)."""
    # run in `work`, so that a crash's core file lands there (tests/helpers/crash.py)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    r = subprocess.run(
        dumping_core([sys.executable, "-X", "faulthandler", "-m", "benchmarks.rsc1", "--json", "--keep",
                      str(work), "--broker-port", str(port), "--timeout", "240", *args]),
        capture_output=True, text=True, timeout=600, cwd=work, env=env,
    )  # fmt: skip
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(work.glob("*.log")))
    crash = native_backtrace(r.returncode, work)
    assert r.returncode == 0, f"benchmarks.rsc1 exited {r.returncode}:\n{r.stderr[-3000:]}\n{logs}\n{crash}"
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("rsc1")
    return rsc1(work, 19792, "--nodes", "1024", "--days", "7", "--r-f", "50", "--seed", "0")


@pytest.fixture(scope="module")
def lemon_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A week of a 512-node cluster at RSC-1's rate where 3% of the nodes are lemons (failing
    rates.LEMON_RATE_MULTIPLIER times as often), drained and repaired at mid-week."""
    work = tmp_path_factory.mktemp("rsc1-lemons")
    return rsc1(work, 19796, "--nodes", "512", "--days", "7", "--lemon-fraction", "0.03", "--seed", "0")


def test_the_true_failure_rate_is_inside_the_measured_interval(run: dict) -> None:
    rf = run["r_f"]
    assert rf["failures"] >= 50, rf
    assert rf["ci_low"] <= rf["true"] <= rf["ci_high"], rf


def test_the_true_mttf_of_large_jobs_is_inside_each_measured_interval(run: dict) -> None:
    large = [r for r in run["mttf_by_gpus"] if r["gpus"] >= 128]
    assert len(large) >= 4
    for r in large:
        assert r["failures"] >= 10, r
        assert r["ci_low_h"] <= r["true_h"] <= r["ci_high_h"], r


def test_every_component_is_found_as_often_as_it_failed(run: dict) -> None:
    true, measured = run["by_component"]["true"], run["by_component"]["measured"]
    assert set(measured) == set(true)
    # Not exactly: a user failure in a fault's window is blamed on it too, as the paper's rule
    # does, and where two faults share a failed job's window the more specific one wins
    for comp, n in true.items():
        assert abs(measured[comp] - n) <= 0.1 * n + 3, (comp, n, measured[comp])
    assert abs(sum(measured.values()) - sum(true.values())) <= 0.05 * sum(true.values())


def test_the_report_names_the_lemons_and_no_healthy_node(lemon_run: dict) -> None:
    true, found = set(lemon_run["lemons"]["true"]), set(lemon_run["lemons"]["found"])
    assert len(true) >= 10
    assert found <= true, f"healthy nodes named lemons: {sorted(found - true)}"
    # a lemon whose few failures in the range happened to stay near the fleet's can be missed
    assert len(found) >= 0.8 * len(true), (sorted(true - found), lemon_run["lemons"])


def test_draining_the_lemons_cuts_the_large_jobs_failure_share(lemon_run: dict) -> None:
    ba = lemon_run["lemons"]["before_after"]
    before, after = ba["before"], ba["after"]
    assert before["jobs"] >= 30 and after["jobs"] >= 30, ba
    assert after["failure_share"] <= 0.5 * before["failure_share"], ba
    # and not by chance: one-sided Fisher exact test on the two shares
    table = [
        [before["failures"], before["jobs"] - before["failures"]],
        [after["failures"], after["jobs"] - after["failures"]],
    ]
    assert fisher_exact(table, alternative="greater").pvalue < 0.01, ba
