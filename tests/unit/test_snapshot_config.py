"""A restored detector or task runs on the deployment's configuration and the snapshot's state.

Every detector and task with a configuration is snapshotted under config A and restored under
config B: the restored object must use B (its thresholds, windows and the clear-after periods of
the incidents it restores) while keeping what it had learned and had open under A. Snapshots
written before configuration was left out of them (a "config" key, the decays' "tau", the
incidents' "clear_after") must restore the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
import orjson
import pytest

from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.detectors.findings import Incident, IncidentBook
from fleetwatch.detectors.gpu_stats import GpuStats, GpuStatsConfig
from fleetwatch.detectors.hardware import HardwareConfig, HardwareDetector
from fleetwatch.detectors.job_batch import JobBatch
from fleetwatch.detectors.lemon import LemonConfig, LemonScorer
from fleetwatch.detectors.node_index import NodeIndex
from fleetwatch.detectors.silence import SilenceConfig, SilenceDetector
from fleetwatch.detectors.straggler import JobWindow, StragglerConfig, StragglerDetector
from fleetwatch.pipeline.job_stage import JobTask, JobTaskConfig
from fleetwatch.pipeline.job_table import JobTable
from fleetwatch.pipeline.node_stage import NodeTask, NodeTaskConfig
from tests.helpers.admission import observe, restored_index
from tests.helpers.detector_inputs import fleet, job_start, series, steps

DAY = 86400.0
T0 = 1_764_000_000.0

# Hardware under A: PCIe replays at 60/min on GPU 6 (a warning at A's 8/min) and an XID 79 burst
# on GPU 1, both open when the snapshot is taken.
HW_A = HardwareConfig()
HW_B = HardwareConfig(
    clear_after_s=30.0, xid_quiet_s=20.0, pcie_replay_per_min=1000.0, rate_window_s=120.0, thermal_samples=2
)


def _hw_fault(k: int) -> dict[int, dict[str, Any]]:
    return {6: {"pcie_replay": k}, 1: {"xids": [79] if k == 5 else []}}


@dataclass
class Restored:
    """One detector or task snapshotted under A and restored under B, and what must hold."""

    configs: list[tuple[Any, Any]]  # (config the restored object runs on, B's)
    books: list[tuple[IncidentBook, IncidentBook, Callable[[Incident], float]]]  # before, after, B's period
    state: list[tuple[Any, Any]] = field(default_factory=list)  # (before, after) that must be equal
    then: Callable[[], None] = lambda: None  # B's thresholds at work on the restored object


def _hardware() -> Restored:
    before = HardwareDetector(HW_A)
    observe(before, before.index, series(40, _hw_fault))
    # restored as the task restores it: its index first, then the detector on it
    after = HardwareDetector.from_state(orjson.loads(before.to_bytes()), HW_B, restored_index(before.index))

    def then() -> None:
        # Still 60 PCIe replays a minute: bad under A, fine under B, so the open warning resolves
        # after B's 30 s without a bad sample. The XID burst (at 1005) is past B's 20 s of quiet
        # already: it resolves on the first sample after the restore (A would hold it to 1185).
        out = observe(after, after.index, series(80, _hw_fault)[40:])
        resolved = {f["evidence"]["rule"]: f["ts"] for f in out if f["resolved"]}
        assert resolved == {"pcie_replay": 1039.0 + 30.0, "xid_burst": 1040.0}
        assert not [f for f in out if not f["resolved"]]

    return Restored(
        configs=[(after.cfg, HW_B)],
        books=[(before.book, after.book, lambda i: 20.0 if i.kind == "xid" else 30.0)],
        state=[
            # the GPUs' rows (a snapshot leaves out the arrays' spare rows)
            (before.gpu_decay.s[: before.n_gpu], after.gpu_decay.s),
            (before.gpu_decay.t[: before.n_gpu], after.gpu_decay.t),
            (before.gpu_counters.last_val[: before.n_gpu], after.gpu_counters.last_val),
            (before.gpu_runs.run[: before.n_gpu], after.gpu_runs.run),
            # the windows are B's: the SBE hour, then B's rate window
            (after.gpu_decay.tau, np.array([3600.0, 120.0, 120.0, 120.0])),
        ],
        then=then,
    )


def _gpu_stats() -> Restored:
    before = GpuStats()
    for tick in fleet(16, 320, seed=2, hot=(5, 3, 200)):
        observe(before, before.index, tick)
    b = GpuStatsConfig(threshold=0.99, persist_samples=10, clear_after_s=5.0)
    after = GpuStats.from_state(orjson.loads(orjson.dumps(before.to_state())), b)
    st_before, st_after = before.scorer.to_state(), after.scorer.to_state()
    n = len(before.index) * 8  # GPU groups
    return Restored(
        configs=[(after.cfg, b)],
        books=[(before.book, after.book, lambda _i: 5.0)],
        state=[(before.run[:n], after.run[:n])]
        + [(st_before[k][:n], st_after[k][:n]) for k in ("count", "level", "scale", "cusum_pos", "cov")]
        + [(st_before[k], st_after[k]) for k in ("hist", "comb")],
    )


def _lemon() -> Restored:
    before = LemonScorer(LemonConfig())
    nodes = [f"n{i}" for i in range(20)]
    before.observe_samples(nodes, np.full(20, T0))
    before.observe_events(["n3"] * 5, [T0 + 3600.0 * j for j in range(5)])
    before.observe_samples(nodes, np.full(20, T0 + DAY))
    assert [f["node"] for f in before.judge(T0 + DAY)] == ["n3"]
    b = LemonConfig(clear_after_s=3600.0, p_lemon=1e-300)  # B: nothing is a lemon any more
    after = LemonScorer.from_state(orjson.loads(orjson.dumps(before.to_state())), b)

    def then() -> None:
        # no longer judged a lemon, n3's incident resolves B's hour after it was last bad (A: a day)
        assert after.judge(T0 + DAY + 3599.0) == []
        (done,) = after.judge(T0 + DAY + 3600.0)
        assert done["resolved"] and done["node"] == "n3"

    return Restored(
        configs=[(after.cfg, b)],
        books=[(before.book, after.book, lambda _i: 3600.0)],
        state=[(before.events, after.events), (before.exposure, after.exposure)],
        then=then,
    )


def _silence() -> Restored:
    before, index = SilenceDetector(SilenceConfig()), NodeIndex()
    nodes = [f"n{i}" for i in range(10)]

    def report(det: SilenceDetector, names: list[str], ts: float) -> list[dict[str, Any]]:
        msgs = [
            {"schema": "telemetry/1", "node": n, "ts": ts, "seq": int(ts - T0), "gpus": []} for n in names
        ]
        return observe(det, index, msgs)

    # n3 stops after T0 + 5: silent under A's 10 s by T0 + 30
    assert [
        f for t in range(0, 31, 5) for f in report(before, [n for n in nodes if n != "n3" or t <= 5], T0 + t)
    ]
    b = SilenceConfig(silent_after_s=30.0)
    after = SilenceDetector.from_state(orjson.loads(orjson.dumps(before.to_state())), b)
    index = restored_index(index)

    def then() -> None:
        # n5 quiet for 20 s after T0 + 30: silent under A's 10 s, not under B's 30 s
        for t in range(35, 51, 5):
            assert report(after, [n for n in nodes if n not in ("n3", "n5")], T0 + t) == []

    return Restored(
        configs=[(after.cfg, b)],
        books=[(before.book, after.book, lambda _i: 30.0)],
        then=then,
    )


def _straggler() -> Restored:
    before = StragglerDetector(StragglerConfig())
    msgs = steps(4, 240, slow={2: 0.3}, seed=1)
    before.observe(JobBatch.from_records(msgs[: 4 * 120]))
    b = StragglerConfig(window=6, clear_after_s=10.0, min_slowdown=0.5)
    after = StragglerDetector.from_bytes(before.to_bytes(), b)
    ((key, w_before),) = before.windows.items()
    w_after = after.windows[key]

    def then() -> None:
        # the 30% straggler is below B's 50%: its incident resolves once B's 10 s have passed
        out = after.observe(JobBatch.from_records(msgs[4 * 120 :]))
        (done,) = out
        (inc,) = before.book.open.values()
        assert done["resolved"] and done["node"] == "node-02"
        assert inc.last_bad + 10.0 <= done["ts"] < inc.last_bad + 10.0 + 2 * b.eval_every_s
        assert w_after.ring.shape == (4, 6)

    return Restored(
        configs=[(after.cfg, b)],
        books=[(before.book, after.book, lambda _i: 10.0)],
        state=[
            (w_before.count, w_after.count),
            (w_before.ref, w_after.ref),
            (w_before.bad_since, w_after.bad_since),
            (w_after.ring.shape, (4, 6)),  # B's window
            # the newest six values are kept, so the medians over B's window are the same
            (np.sort(_newest(w_before, 6), axis=1), np.sort(w_after.ring, axis=1)),
        ],
        then=then,
    )


def _newest(w: JobWindow, k: int) -> np.ndarray:
    """Each node's k newest values, from its ring."""
    width = w.ring.shape[1]
    idx = (w.count[:, None] - 1 - np.arange(k)[None, :]) % width
    return np.take_along_axis(w.ring, idx, axis=1)


def _job_task() -> Restored:
    before = JobTask(straggler=StragglerDetector(StragglerConfig()))
    before.process("fleet.jobs.v1", [job_start(4)])
    before.process("fleet.steps.v1", steps(4, 120, slow={2: 0.3}, seed=1))
    b = StragglerConfig(window=20, clear_after_s=10.0)
    after = JobTask.from_bytes(before.to_bytes(), JobTaskConfig(straggler=b))
    before.close()
    after.close()
    ((key, w_before),) = before.straggler.windows.items()
    return Restored(
        configs=[(after.straggler.cfg, b)],
        books=[(before.straggler.book, after.straggler.book, lambda _i: 10.0)],
        state=[
            (w_before.count, after.straggler.windows[key].count),
            (after.straggler.windows[key].ring.shape[1], 20),
        ],
    )


def _node_task() -> Restored:
    before = NodeTask(JobTable(), NodeTaskConfig())
    before.process("fleet.telemetry.v1", TelemetryBatch.from_messages(series(40, _hw_fault)))
    b = NodeTaskConfig(
        hardware=HW_B,
        stats=GpuStatsConfig(threshold=0.99),
        lemon=LemonConfig(clear_after_s=3600.0, judge_every_s=600.0),
        silence=SilenceConfig(silent_after_s=30.0),
    )
    after = NodeTask.from_bytes(before.to_bytes(), JobTable(), b)
    before.close()
    after.close()
    return Restored(
        configs=[
            (after.config, b),
            (after.hardware.cfg, b.hardware),
            (after.stats.cfg, b.stats),
            (after.lemon.cfg, b.lemon),
            (after.silence.cfg, b.silence),
        ],
        books=[(before.hardware.book, after.hardware.book, lambda i: 20.0 if i.kind == "xid" else 30.0)],
        state=[
            (before.index.names, after.index.names),
            (before.index.last_ts, after.index.last_ts),
            (before.lemon.next_judgement, after.lemon.next_judgement),
            (before.hardware.gpu_decay.s[: before.hardware.n_gpu], after.hardware.gpu_decay.s),
        ],
    )


@pytest.mark.parametrize(
    "restore",
    [_hardware, _gpu_stats, _lemon, _silence, _straggler, _job_task, _node_task],
    ids=lambda f: f.__name__.strip("_"),
)
def test_restore_takes_config_from_the_deployment_and_state_from_the_snapshot(
    restore: Callable[[], Restored],
) -> None:
    r = restore()
    for got, want in r.configs:
        assert got == want
    for before, after, period in r.books:
        assert before.open, "the snapshot must hold open incidents"
        assert list(after.open) == list(before.open)
        for key, inc in after.open.items():
            old = before.open[key]
            assert inc.clear_after == period(inc) != old.clear_after, key
            same = [f.name for f in fields(Incident) if f.name != "clear_after"]
            assert {k: getattr(inc, k) for k in same} == {k: getattr(old, k) for k in same}
    for before, after in r.state:
        if isinstance(before, np.ndarray):
            assert np.array_equal(before, after, equal_nan=True)
        else:
            assert before == after
    r.then()


def test_gpu_stats_threshold_comes_from_the_deployment() -> None:
    """The worker's path: NodeTask.from_bytes with the worker's NodeTaskConfig. The snapshot is
    taken under the default threshold before a GPU starts heating; what the restored task finds
    depends only on the threshold it is restored with."""
    ticks = fleet(16, 400, seed=2, hot=(5, 3, 200))
    task = NodeTask(JobTable(), NodeTaskConfig(emit_features=False))
    for tick in ticks[:150]:  # the census of its nodes, and no finding
        assert {
            t for t, _k, _m in task.process("fleet.telemetry.v1", TelemetryBatch.from_messages(tick))
        } <= {"fleet.nodes.v1"}
    raw = task.to_bytes()
    task.close()

    def statistical(threshold: float) -> list[dict[str, Any]]:
        cfg = NodeTaskConfig(emit_features=False, stats=GpuStatsConfig(threshold=threshold))
        restored = NodeTask.from_bytes(raw, JobTable(), cfg)
        assert restored.stats.cfg.threshold == threshold
        out = []
        for i in range(150, len(ticks), 10):
            msgs = [m for tick in ticks[i : i + 10] for m in tick]
            out += [
                f for _t, _k, f in restored.process("fleet.telemetry.v1", TelemetryBatch.from_messages(msgs))
            ]
        restored.close()
        return [f for f in out if f["kind"] == "statistical" and not f["resolved"]]

    found = statistical(0.999)  # the snapshot's own threshold: the heating GPU is found
    assert {(f["node"], f["gpu"]) for f in found} == {("n005", 3)}
    assert {f["evidence"]["threshold"] for f in found} == {0.999}
    looser = statistical(0.995)
    assert {f["evidence"]["threshold"] for f in looser} == {0.995}
    assert looser[0]["first_seen"] <= found[0]["first_seen"]
    assert statistical(2.0) == []  # no calibrated score reaches it: nothing can be flagged


def test_old_snapshots_with_config_restore_on_the_deployments_config() -> None:
    task = NodeTask(JobTable(), NodeTaskConfig())
    task.process("fleet.telemetry.v1", TelemetryBatch.from_messages(series(40, _hw_fault)))
    d = orjson.loads(task.to_bytes())
    task.close()
    assert "config" not in d["hardware"] and "config" not in d["stats"]
    assert "tau" not in d["hardware"]["gpu_decay"]
    assert d["hardware"]["incidents"] and all("clear_after" not in i for i in d["hardware"]["incidents"])
    # what snapshots carried before: the writer's configuration
    d["hardware"]["config"] = asdict(HardwareConfig())
    d["hardware"]["gpu_decay"]["tau"] = [3600.0, 60.0, 60.0, 60.0]
    d["hardware"]["ib_decay"]["tau"] = [3600.0] * 3
    for inc in d["hardware"]["incidents"]:
        inc["clear_after"] = 300.0
    d["stats"]["config"] = asdict(GpuStatsConfig())
    b = NodeTaskConfig(hardware=HW_B, stats=GpuStatsConfig(threshold=0.99))
    restored = NodeTask.from_bytes(orjson.dumps(d), JobTable(), b)
    restored.close()
    assert restored.hardware.cfg == HW_B and restored.stats.cfg == b.stats
    assert restored.hardware.gpu_decay.tau.tolist() == [3600.0, 120.0, 120.0, 120.0]
    assert {i.clear_after for i in restored.hardware.book.open.values()} == {20.0, 30.0}


def test_job_window_changes_width_keeping_the_newest_values() -> None:
    w = JobWindow()
    r = w.rows(["a", "b"], 12)
    for v in range(20):  # a gets 0..19, b gets 100..104
        w.push(r[:1], np.array([float(v)]), 12)
        if v < 5:
            w.push(r[1:], np.array([100.0 + v]), 12)
    state = orjson.loads(orjson.dumps(w.to_state()))

    shorter = JobWindow.from_state(state, 5)
    assert shorter.ring.shape == (2, 5)
    assert sorted(shorter.ring[0]) == [15, 16, 17, 18, 19]
    assert sorted(shorter.ring[1]) == [100, 101, 102, 103, 104]
    shorter.push(shorter.rows(["a"], 5), np.array([20.0]), 5)  # replaces the oldest, 15
    assert sorted(shorter.ring[0]) == [16, 17, 18, 19, 20]

    longer = JobWindow.from_state(state, 30)
    assert longer.ring.shape == (2, 30)
    assert sorted(longer.ring[0][~np.isnan(longer.ring[0])]) == list(range(8, 20))  # all the old ring had
    assert np.isnan(longer.ring[1]).sum() == 25
    longer.push(longer.rows(["a"], 30), np.array([20.0]), 30)  # a free slot: nothing lost
    assert sorted(longer.ring[0][~np.isnan(longer.ring[0])]) == list(range(8, 21))
    assert longer.count.tolist() == [21, 5]
