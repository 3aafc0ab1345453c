"""Straggler detection by peer comparison inside a job."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from fleetwatch import schemas
from fleetwatch.detectors.job_batch import JobBatch
from fleetwatch.detectors.straggler import StragglerConfig, StragglerDetector, loo_median
from tests.helpers.detector_inputs import T0, steps


def feed(det: StragglerDetector, msgs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Records of the three schemas as the job stage hands them to its detectors."""
    return det.observe(JobBatch.from_records(msgs))


def test_loo_median_matches_definition() -> None:
    rng = np.random.default_rng(3)
    for n in (2, 3, 4, 7, 10):
        v = rng.normal(size=n)
        expect = [np.median(np.delete(v, i)) for i in range(n)]
        assert np.allclose(loo_median(v), expect)


@pytest.mark.parametrize("slowdown", [0.10, 0.20, 0.30])
def test_straggler_found_named_and_quantified(slowdown: float) -> None:
    msgs = steps(8, 200, slow={5: slowdown}, slow_from=50)
    det = StragglerDetector()
    findings = feed(det, msgs)
    assert findings, "the straggler must be found"
    first = findings[0]
    schemas.validate(first)
    assert (first["node"], first["job"], first["kind"]) == ("node-05", "job-1", "straggler")
    assert first["evidence"]["slowdown"] == pytest.approx(slowdown, abs=0.03)
    assert f"{round(100 * first['evidence']['slowdown'])}% slower" in first["summary"]
    onset_ts = msgs[50 * 8]["ts"]
    samples_to_detect = sum(1 for m in msgs if m["node"] == "node-05" and onset_ts <= m["ts"] <= first["ts"])
    assert samples_to_detect <= 60
    # the waiting ranks (which look slow in wall time) are never blamed
    assert {f["node"] for f in findings} == {"node-05"}


def test_two_node_job_blames_the_slow_one() -> None:
    findings = feed(StragglerDetector(), steps(2, 120, slow={1: 0.15}))
    assert {f["node"] for f in findings} == {"node-01"}


def test_healthy_jitter_is_quiet() -> None:
    det = StragglerDetector()
    findings = []
    for seed in range(5):
        findings += feed(det, steps(16, 400, jitter=0.03, seed=seed, job=f"job-{seed}"))
    assert findings == []


def test_escalates_when_persistent_and_resolves_after_recovery() -> None:
    cfg = StragglerConfig(critical_after_s=60, clear_after_s=30)
    det = StragglerDetector(cfg)
    slow = steps(6, 150, slow={2: 0.2})
    healthy = steps(6, 200, seed=1)
    shift = slow[-1]["ts"] - T0 + 1
    for m in healthy:
        m["ts"] += shift
    out = feed(det, slow) + feed(det, healthy)
    sev = [(f["severity"], f["resolved"]) for f in out]
    assert sev == [("warning", False), ("critical", False), ("critical", True)]
    assert len({f["id"] for f in out}) == 1  # one incident, one id


def test_job_end_resolves() -> None:
    det = StragglerDetector()
    out = feed(det, steps(4, 100, slow={0: 0.2}))
    assert out and not out[-1]["resolved"]
    done = det.job_ended("job-1", T0 + 1000)
    assert [f["resolved"] for f in done] == [True]
    assert det.windows == {}


def test_sm_clock_throttled_node_from_features() -> None:
    det = StragglerDetector()
    msgs = []
    for s in range(100):
        for i in range(8):
            clock = 1980.0 * (0.85 if i == 3 and s > 20 else 1.0) + np.sin(s + i) * 5
            msgs.append(
                {
                    "schema": "nodefeatures/1",
                    "job": "job-9",
                    "node": f"node-{i:02d}",
                    "ts": T0 + s,
                    "sm_clock_mhz": clock,
                    "util": 97.0,
                }
            )
    findings = feed(det, msgs)
    assert {f["node"] for f in findings} == {"node-03"}
    assert findings[0]["evidence"]["signal"] == "sm_clock_mhz"


def test_batching_and_snapshot_do_not_change_results() -> None:
    msgs = steps(8, 200, slow={5: 0.12}, slow_from=40, seed=7)
    whole = feed(StragglerDetector(), msgs)
    det = StragglerDetector()
    pieces: list[dict[str, Any]] = []
    for i in range(0, len(msgs), 37):
        pieces += feed(det, msgs[i : i + 37])
        det = StragglerDetector.from_bytes(det.to_bytes())  # a restart between every batch
    assert [f["id"] for f in pieces] == [f["id"] for f in whole]
    assert [f["ts"] for f in pieces] == [f["ts"] for f in whole]


def test_second_straggler_beside_a_slow_peer_is_found_by_its_own_slowdown() -> None:
    """A 2-node job whose node 0 is slow from the start and node 1 slows down later: peers alone
    would see node 1 as the fast one; its slowdown against its own start gives it away."""
    early = steps(2, 60, slow={0: 0.20})
    late = steps(2, 120, slow={0: 0.20, 1: 0.12}, seed=3)
    shift = early[-1]["ts"] - T0 + 1
    for m in late:
        m["ts"] += shift
    det = StragglerDetector()
    findings = feed(det, early) + feed(det, late)
    found = {f["node"] for f in findings if not f["resolved"]}
    assert found == {"node-00", "node-01"}
    late_one = next(f for f in findings if f["node"] == "node-01")
    assert late_one["evidence"]["vs_own_start"] == pytest.approx(0.12, abs=0.04)


def test_job_wide_slowdown_blames_nobody() -> None:
    early = steps(6, 60)
    late = steps(6, 120, slow=dict.fromkeys(range(6), 0.25), seed=4)  # every rank slower: a new phase
    shift = early[-1]["ts"] - T0 + 1
    for m in late:
        m["ts"] += shift
    det = StragglerDetector()
    assert feed(det, early) + feed(det, late) == []


def test_idle_clocks_are_not_compared() -> None:
    """Startup and checkpoints idle the clocks of some nodes before others: not a straggler."""
    det = StragglerDetector()
    msgs = []
    for s in range(120):
        for i in range(4):
            idle = (i == 2 and s % 40 < 25) or s < 10 * (i + 1)
            clock, util = (345.0, 5.0) if idle else (1980.0, 97.0)
            msgs.append(
                {
                    "schema": "nodefeatures/1",
                    "job": "job-3",
                    "node": f"node-{i:02d}",
                    "ts": T0 + s,
                    "sm_clock_mhz": clock,
                    "util": util,
                }
            )
    assert feed(det, msgs) == []
