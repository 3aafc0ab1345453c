"""The sibling-relative statistical GPU detector."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from fleetwatch import schemas
from fleetwatch.detectors.gpu_stats import GpuStats
from tests.helpers.admission import observe
from tests.helpers.detector_inputs import T0, fleet


def run(det: GpuStats, ticks: list[list[dict[str, Any]]], per_batch: int = 1) -> list[dict[str, Any]]:
    out = []
    for i in range(0, len(ticks), per_batch):
        msgs = [m for tick in ticks[i : i + per_batch] for m in tick]
        out += observe(det, det.index, msgs)  # through the task's admission
    return out


def test_workload_changes_are_not_anomalies() -> None:
    findings = run(GpuStats(), fleet(24, 1500, seed=1))
    assert findings == []


def test_a_heating_gpu_is_found_on_the_right_gpu_and_signal() -> None:
    # 20 minutes of history first: in its first minutes a fleet's calibration is a few thousand
    # samples, and a drifting GPU's own recent values are a visible part of its tail
    findings = run(GpuStats(), fleet(16, 1500, seed=2, hot=(5, 3, 1200)))
    opened = [f for f in findings if not f["resolved"]]
    assert opened, "the heating GPU must be found"
    first = opened[0]
    schemas.validate(first)
    assert (first["node"], first["gpu"], first["evidence"]["signal"]) == ("n005", 3, "temp_c")
    assert first["kind"] == "statistical" and first["severity"] == "warning"
    assert first["ts"] - (T0 + 1200) <= 90  # 0.15 C/s: found within ~13 C of drift
    assert {(f["node"], f["gpu"]) for f in opened} == {("n005", 3)}


def test_batching_and_snapshots_do_not_change_findings() -> None:
    ticks = fleet(12, 1400, seed=3, hot=(2, 6, 1150))
    whole = run(GpuStats(), ticks)
    det = GpuStats()
    pieces: list[dict[str, Any]] = []
    for i in range(0, len(ticks), 7):
        pieces += run(det, ticks[i : i + 7], per_batch=7)  # several samples of each node per batch
        det = GpuStats.from_state(orjson.loads(orjson.dumps(det.to_state())))
    assert [f["id"] for f in pieces] == [f["id"] for f in whole]
    assert whole


def test_state_size_per_gpu() -> None:
    det = GpuStats()
    run(det, fleet(64, 60, seed=4))
    per_gpu = len(orjson.dumps(det.to_state())) / (64 * 8)
    assert per_gpu < 2048


def test_restoring_a_snapshot_of_the_per_series_scorer_keeps_its_incidents() -> None:
    """A snapshot written before the multivariate scorer (version 1): its open incidents carry
    on, its baselines are learnt again."""
    det = GpuStats()
    run(det, fleet(4, 30, seed=5))
    old = det.to_state()
    old.pop("version")
    old["series"], old["hists"] = {}, {"hist_point": old.pop("hists")["hist"]}  # the old shape's keys
    del old["groups"], old["run_signal"]
    restored = GpuStats.from_state(orjson.loads(orjson.dumps(old)))
    assert restored.index.names == det.index.names
    assert (restored.scorer.count == 0).all()  # relearnt
    assert run(restored, fleet(4, 30, seed=6)) == []


def test_sparse_update_equals_the_full_tick() -> None:
    """RobustScorer.update_ids (what the worker uses) is update() with NaN elsewhere, exactly."""
    from fleetwatch.detectors.statistical import RobustScorer

    rng = np.random.default_rng(0)
    k = 400
    groups = np.tile(np.arange(4), k // 4)
    full, sparse = RobustScorer(k, groups=groups), RobustScorer(k, groups=groups)
    for _ in range(300):
        ids = np.sort(rng.choice(k, size=150, replace=False))
        xv = rng.standard_t(3, size=len(ids))
        xv[rng.random(len(ids)) < 0.05] = np.nan
        x = np.full(k, np.nan)
        x[ids] = xv
        a, b = full.update(x)[ids], sparse.update_ids(ids, xv)
        assert np.array_equal(a, b, equal_nan=True)
    for key, value in full.to_state().items():
        assert np.array_equal(value, sparse.to_state()[key], equal_nan=True), key


def test_a_snapshot_of_a_detector_that_saw_nothing_restores_and_goes_on() -> None:
    """A worker's first snapshot of a partition is written at assignment, before any sample."""
    restored = GpuStats.from_state(orjson.loads(orjson.dumps(GpuStats().to_state())))
    ticks = fleet(16, 1500, seed=2, hot=(5, 3, 1200))
    opened = [f for f in run(restored, ticks) if not f["resolved"]]
    assert {(f["node"], f["gpu"]) for f in opened} == {("n005", 3)}
