"""Node-name churn (issue 15, item 17): nodes unseen for forget_after_s are forgotten by every
detector (state, series, open incidents resolved with the reason), the census forgets them, act
ends their alerts, and the tables that used to grow with every name or failed job are bounded."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from fleetwatch import schemas, topics
from fleetwatch.census import Census, CensusConfig
from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.detectors.findings import FORGOTTEN
from fleetwatch.pipeline import fleet_metrics
from fleetwatch.pipeline.job_table import JobTable
from fleetwatch.pipeline.node_stage import NodeTask, NodeTaskConfig
from fleetwatch.pipeline.tasks import Output
from fleetwatch.signing import signed as sign
from tests.helpers.act import Rig
from tests.helpers.findings import T0, finding
from tests.helpers.messages import telemetry

STEADY = [f"steady-{i:03d}" for i in range(50)]


def churn(n_names: int, per_tick: int, life: int, tail: int, steady: list[str]) -> Iterator[list[str]]:
    """Node names reporting at each tick (1 s): `steady` throughout; `n_names` churned names,
    `per_tick` new ones a tick, each reporting for `life` ticks and never again; then `tail`
    ticks of the steady nodes alone."""
    churn_ticks = -(-n_names // per_tick) + life
    for t in range(churn_ticks + tail):
        lo, hi = max(0, t - life + 1) * per_tick, min(n_names, (t + 1) * per_tick)
        yield steady + [f"churn-{i:05d}" for i in range(lo, hi)]


def feed(task: NodeTask, ticks: list[list[str]], start: int = 0) -> list[Output]:
    out: list[Output] = []
    for t, names in enumerate(ticks[start:], start):
        out += task.process(
            topics.TELEMETRY,
            TelemetryBatch.from_messages([telemetry(node=n, ts=T0 + t, seq=t) for n in names]),
        )
    return out


def series(task: NodeTask) -> int:
    """The Prometheus samples the task exports (fleet_metrics reads them at scrape time)."""
    collector = fleet_metrics.FleetStateCollector()
    collector.add_nodes(task)
    return sum(len(family.samples) for family in collector.collect())


def unexported(task: NodeTask) -> float:
    """fleetwatch_detect_nodes_unexported as the task's collector reports it."""
    collector = fleet_metrics.FleetStateCollector()
    collector.add_nodes(task)
    return next(
        f.samples[0].value for f in collector.collect() if f.name == "fleetwatch_detect_nodes_unexported"
    )


def per_node_sizes(task: NodeTask) -> dict[str, int]:
    """Every per-node table of the task and its detectors, and the rows of their dense arrays."""
    hw, st = task.hardware, task.stats
    return {
        "index": len(task.index),
        "index.last_ts": task.index.allocated,
        "first_seen": len(task.first_seen),
        "census_at": len(task.census_at),
        "clock_skew": len(task.clock_skew),
        "hardware.gpu_rows": len(hw.gpu_rows),
        "hardware.gpu_counters": len(hw.gpu_counters.last_val),
        "hardware.gpu_decay": len(hw.gpu_decay.s),
        "hardware.gpu_runs": len(hw.gpu_runs.run),
        "hardware.ib_ports": hw.ib_map.n,
        "hardware.ib_names": len(hw.ib_map.names),
        "hardware.ib_counters": len(hw.ib_counters.last_val),
        "hardware.ib_decay": len(hw.ib_decay.s),
        "lemon.events": len(task.lemon.events),
        "stats.gpus": len(st.scorer.count),
        "stats.run": len(st.run),
        "stats.last_value": len(st.last_value),
        "open incidents": sum(len(b.open) for b in (hw.book, task.silence.book, st.book, task.lemon.book)),
    }


def forgotten(out: list[Output]) -> list[dict[str, Any]]:
    return [m for t, _k, m in out if t == topics.FINDINGS and m["evidence"].get("resolution") == FORGOTTEN]


def tombstones(out: list[Output]) -> list[str | None]:
    return [k for t, k, m in out if t == topics.NODES and m is None]


def test_state_series_and_snapshot_are_bounded_by_the_steady_nodes_not_by_the_names_seen() -> None:
    ticks = list(churn(3000, per_tick=30, life=5, tail=80, steady=STEADY))
    forgetting = NodeTaskConfig(forget_after_s=60.0, forget_every_s=10.0)
    tasks = {
        "steady only": (NodeTask(JobTable(), forgetting), [STEADY] * len(ticks)),
        "churn, forgetting": (NodeTask(JobTable(), forgetting), ticks),
        "churn, never forgetting": (NodeTask(JobTable(), NodeTaskConfig(forget_after_s=np.inf)), ticks),
    }
    outs = {case: feed(task, names) for case, (task, names) in tasks.items()}
    steady, churned, kept = (t for t, _names in tasks.values())
    try:
        assert len(steady.index) == len(churned.index) == 50 and len(kept.index) == 3050
        sizes = per_node_sizes(churned)
        bound = per_node_sizes(steady)  # grown by doubling: up to 2x the steady set's rows
        assert {k: v for k, v in sizes.items() if v > max(2 * bound[k], 64 * 8 * 3)} == {}
        assert sizes["open incidents"] == 0
        grown = per_node_sizes(kept)
        assert grown["hardware.gpu_counters"] >= 3050 * 8 and grown["open incidents"] > 2000

        snap = {case: len(t.to_bytes()) for case, (t, _n) in tasks.items()}
        assert snap["churn, forgetting"] < 1.2 * snap["steady only"]
        assert snap["churn, never forgetting"] > 30 * snap["steady only"]
        # never forgetting, the per-node series are still bounded: those of at most COLD_NODES nodes
        # not warm yet (all of them here) are exported, the rest are counted (issue 23, item 9)
        assert (
            series(churned) == series(steady) < series(kept) < series(steady) * fleet_metrics.COLD_NODES / 50
        )
        assert unexported(kept) == 3050 - fleet_metrics.COLD_NODES and unexported(steady) == 0

        # every churned name was forgotten once: its silence resolved as forgotten, a tombstone sent
        out = outs["churn, forgetting"]
        assert sorted(tombstones(out)) == [f"churn-{i:05d}" for i in range(3000)]
        resolved = forgotten(out)
        assert len(resolved) == 3000 and {f["evidence"]["rule"] for f in resolved} == {"silent"}
        assert tombstones(outs["churn, never forgetting"]) == forgotten(outs["churn, never forgetting"]) == []
    finally:
        for task in (steady, churned, kept):
            task.close()


def _stops(gone: str = "gone", stop: int = 5, until: int = 200, n: int = 20) -> list[list[str]]:
    """n steady nodes reporting every second until `until`; `gone` only until `stop`."""
    steady = [f"n{i:02d}" for i in range(n)]
    return [steady + ([gone] if t <= stop else []) for t in range(until + 1)]


def test_a_silent_node_is_forgotten_its_silence_resolves_and_the_census_drops_it() -> None:
    task = NodeTask(JobTable(), NodeTaskConfig(forget_after_s=120.0, forget_every_s=10.0))
    try:
        ticks = _stops()
        per_tick = [
            task.process(
                topics.TELEMETRY,
                TelemetryBatch.from_messages([telemetry(node=n, ts=T0 + t, seq=t) for n in names]),
            )
            for t, names in enumerate(ticks)
        ]
        out = [o for tick in per_tick for o in tick]
        silent = [m for t, _k, m in out if t == topics.FINDINGS and m["node"] == "gone"]
        assert [(f["evidence"]["rule"], f["severity"], f["resolved"]) for f in silent] == [
            ("silent", "critical", False),
            ("silent", "critical", True),
        ]
        opened, done = silent
        assert done["id"] == opened["id"] and opened["first_seen"] == T0 + 5 + 10
        # resolved at its last sample + forget_after_s, whenever the check ran, saying why
        assert done["ts"] == T0 + 5 + 120
        assert done["evidence"]["resolution"] == FORGOTTEN and done["evidence"]["unseen_for_s"] == 120.0
        assert done["summary"].startswith("resolved (node forgotten: no telemetry for 120 s)")
        # the same output list carries the census tombstone, and only gone's
        when = next(i for i, tick in enumerate(per_tick) if done in [m for _t, _k, m in tick])
        assert (topics.NODES, "gone", None) in per_tick[when] and tombstones(out) == ["gone"]
        assert 125 <= when <= 125 + 10  # the first check of the partition's clock past 125 s
        assert "gone" not in task.index.rows and "gone" not in {n for n, _h, _s in task.node_health()}
        assert b'"gone"' not in task.to_bytes()
    finally:
        task.close()


def test_a_forgotten_node_that_reports_again_starts_fresh_and_its_faults_are_found() -> None:
    task = NodeTask(JobTable(), NodeTaskConfig(forget_after_s=120.0, forget_every_s=10.0))
    try:
        out = feed(task, _stops())
        assert tombstones(out) == ["gone"]
        first = [m for t, k, m in out if t == topics.NODES and k == "gone" and m and not m.get("gone")]
        assert [m["first_seen"] for m in first] == [T0]
        back = telemetry(node="gone", ts=T0 + 201, seq=1)  # re-imaged: its agent's seq starts again
        back["gpus"][3]["xids"] = [79]
        again = task.process(
            topics.TELEMETRY,
            TelemetryBatch.from_messages(
                [telemetry(node=f"n{i:02d}", ts=T0 + 201, seq=201) for i in range(20)] + [back]
            ),
        )
        census = [m for t, k, m in again if t == topics.NODES and k == "gone"]
        assert [(m["first_seen"], m["last_seen"]) for m in census] == [(T0 + 201, T0 + 201)]
        xid = [m for t, _k, m in again if t == topics.FINDINGS and m["kind"] == "xid"]
        assert [(f["node"], f["gpu"], f["severity"], f["first_seen"]) for f in xid] == [
            ("gone", 3, "critical", T0 + 201)
        ]
        assert [m for t, _k, m in again if t == topics.FINDINGS and m["kind"] != "xid"] == []
        row = task.index.rows["gone"]
        assert task.first_seen[row] == T0 + 201 and task.index.last_ts[row] == T0 + 201
    finally:
        task.close()


def test_snapshot_and_restore_mid_churn_give_the_outputs_of_an_uninterrupted_run() -> None:
    """A worker restarted from a snapshot taken between forget checks, while forgotten and not yet
    forgotten names are both in the state, produces exactly what one that never stopped does."""
    cfg = NodeTaskConfig(forget_after_s=15.0, forget_every_s=10.0)
    ticks = list(churn(1800, per_tick=30, life=5, tail=30, steady=STEADY[:30]))
    straight = NodeTask(JobTable(), cfg)
    want = feed(straight, ticks)
    task = NodeTask(JobTable(), cfg)
    got: list[Output] = []
    try:
        gone_at_restore = []
        for a, b in ((0, 31), (31, 57), (57, len(ticks))):  # between checks (every 10 s)
            got += feed(task, ticks[:b], a)
            gone_at_restore.append(len(tombstones(got)))
            raw = task.to_bytes()
            task.close()
            task = NodeTask.from_bytes(raw, JobTable(), cfg)
        assert 0 < gone_at_restore[0] < gone_at_restore[1] < 1800 - 30 * 5  # some forgotten, more to come
        assert got == want and len(tombstones(want)) == 1800
        assert task.to_bytes() == straight.to_bytes()
    finally:
        task.close()
        straight.close()


def _job(job: str, state: str, ts: float, nodes: tuple[str, ...] = ("a", "b")) -> dict[str, Any]:
    return {"schema": "job/1", "job": job, "nodes": list(nodes), "state": state, "ts": ts}


def test_failed_jobs_are_kept_for_a_window_and_up_to_a_cap() -> None:
    table = JobTable(failed_keep_s=3600.0, max_failed=100)
    for i in range(1000):  # one failure a minute for 1000 minutes
        table.apply(_job(f"j{i}", "failed", T0 + 60 * i))
    assert list(table.failed_jobs) == [f"j{i}" for i in range(939, 1000)]  # the last hour's
    table.apply(_job("late", "failed", T0))  # a replayed failure from long before the window
    assert "late" not in table.failed_jobs and table.failed_version == 1000
    for i in range(500):  # a burst: 500 at once, more than the cap
        table.apply(_job(f"burst{i}", "failed", T0 + 60_000))
    assert list(table.failed_jobs) == [f"burst{i}" for i in range(400, 500)]
    default = JobTable()  # the default window: a week of event time
    default.apply(_job("old", "failed", T0))
    default.apply(_job("running", "running", T0 + 8 * 86400))
    assert default.failed_jobs == {} and default.jobs_on("a") == ("running",)


def test_a_task_remembers_only_failed_jobs_the_table_still_offers() -> None:
    jobs = JobTable(failed_keep_s=60.0)
    task = NodeTask(jobs, NodeTaskConfig(forget_after_s=3600.0, forget_every_s=10.0))
    counted: set[str] = set()
    try:
        for t in range(200):
            if t < 100:
                jobs.apply(_job(f"j{t}", "failed", T0 + t, nodes=("a", "b")))
            task.process(
                topics.TELEMETRY,
                TelemetryBatch.from_messages([telemetry(node=n, ts=T0 + t, seq=t) for n in ("a", "b")]),
            )
            counted |= task.failed_jobs_seen
            # the jobs the table still holds, and those it dropped since the last check (10 s)
            assert len(task.failed_jobs_seen) <= 61 + 10
        assert counted == {f"j{t}" for t in range(100)}  # each counted into the lemon history
        jobs.apply(_job("now", "running", T0 + 200))  # the table's clock moves on: j* leave it
        assert jobs.failed_jobs == {}
        for t in range(200, 215):
            task.process(
                topics.TELEMETRY,
                TelemetryBatch.from_messages([telemetry(node=n, ts=T0 + t, seq=t) for n in ("a", "b")]),
            )
        assert task.failed_jobs_seen == set()
    finally:
        task.close()


def test_act_ends_the_alerts_of_a_forgotten_node_and_drops_it_from_the_fleet() -> None:
    key = b"test-census-key-0123456789"
    census = Census(key, CensusConfig(warm_up_s=0.0))  # every node counts at once
    rig = Rig(census, budget_min_nodes=1)  # type: ignore[arg-type]
    task = NodeTask(JobTable(), NodeTaskConfig(forget_after_s=120.0, forget_every_s=10.0))
    try:
        for t, names in enumerate(_stops()):
            out = task.process(
                topics.TELEMETRY,
                TelemetryBatch.from_messages([telemetry(node=n, ts=T0 + t, seq=t) for n in names]),
            )
            for topic, node, msg in out:
                if topic == topics.NODES:
                    census.apply(node.encode(), None if msg is None else schemas.encode(sign(msg, key)))
            rig.feed(*(m for topic, _k, m in out if topic == topics.FINDINGS))
            if t == 20:
                assert "gone" in census and len(census) == 21
                alert = [r for r in rig.task.book.records.values() if r.labels.get("node") == "gone"]
                assert [(r.labels["alertname"], r.ends_at) for r in alert] == [("FleetwatchHost", None)]
        assert "gone" not in census and len(census) == 20 and rig.actor.fleet_size() == 20
        alert = [r for r in rig.task.book.records.values() if r.labels.get("node") == "gone"]
        assert [r.ends_at for r in alert] == [T0 + 125] and not rig.task.book.active_sources("")
        rig.decide(T0 + 400)
        assert "gone" not in rig.task.nodes  # nothing open, nothing drained: pruned
    finally:
        task.close()


def test_a_drained_node_is_resumed_when_healthy_but_not_when_forgotten() -> None:
    rig = Rig({"healed", "gone"}, budget_min_nodes=2)
    reqs = rig.feed(finding("healed", ts=T0 - 100), finding("gone", ts=T0))
    assert [(m["action"], m["node"]) for m in reqs] == [("drain", "healed"), ("drain", "gone")]
    for req in reqs:
        rig.result(req, "executed")
    xid = {"xids": {"79": 1}, "worst_xid": 79, "action": "drain_node"}
    forgot = {"resolution": FORGOTTEN, "unseen_for_s": 86400.0}
    rig.feed(
        finding("healed", ts=T0 + 10, first_seen=T0 - 100, resolved=True, **xid),
        finding("gone", ts=T0 + 10, first_seen=T0, resolved=True, **xid, **forgot),
    )
    assert sorted(rig.task.book.active_sources("")) == ["drained:gone", "drained:healed"]  # findings' ended
    out = rig.decide(T0 + 10 + 900 + 1)  # past resume_after_s
    assert [(m["action"], m["node"]) for m in out] == [("resume", "healed")]
    # gone for good is not repaired: it stays drained, in Slurm and in the budget
    assert rig.task.nodes["gone"].drained and rig.task.nodes["gone"].healthy_since is None
