"""The node stage's one index of nodes (detectors/node_index.py): admission of fresh samples, and
the rows every detector's per-node arrays are indexed by."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwatch import topics
from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.detectors.node_index import NodeIndex
from fleetwatch.detectors.rows import RowIndex
from fleetwatch.pipeline.job_table import JobTable
from fleetwatch.pipeline.node_stage import NodeTask

NAMES = st.sampled_from("abcde")
FIXTURES = Path(__file__).parents[1] / "fixtures" / "snapshots"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(NAMES, st.integers(0, 8).map(float)), max_size=8), min_size=1, max_size=8))
def test_admit_keeps_each_nodes_newer_samples_in_order(batches: list[list[tuple[str, float]]]) -> None:
    """On batches with and without a node twice (two code paths): a sample is kept when it is
    newer than every earlier sample of its node, each sample is told its node's latest time
    before the batch, and the index ends with every node's latest time."""
    index = NodeIndex()
    latest: dict[str, float] = {}
    for batch in batches:
        names = [n for n, _t in batch]
        adm = index.admit(names, np.array([t for _n, t in batch], dtype=np.float64))
        want_before = [latest.get(n, np.nan) for n in names]
        want_keep = []
        for node, t in batch:
            new = node not in latest or t > latest[node]
            if new:
                latest[node] = t
            want_keep.append(new)
        assert adm.keep.tolist() == want_keep
        np.testing.assert_array_equal(adm.before, np.array(want_before, dtype=np.float64))
        assert dict(zip(index.names, index.last_ts.tolist(), strict=True)) == latest
        assert index.names == list(dict.fromkeys(n for b in batches for n, _t in b if n in latest))


def test_dropping_nodes_renumbers_the_rest_in_order_and_their_times_follow() -> None:
    index = NodeIndex()
    index.admit([f"n{i}" for i in range(40)], np.arange(40, dtype=np.float64))
    rows = index.drop(["n3", "n0", "unknown", "n39"])
    assert rows is not None
    assert index.names == [f"n{i}" for i in range(40) if i not in (0, 3, 39)]
    assert index.rows == {n: r for r, n in enumerate(index.names)}
    assert index.last_ts.tolist() == [float(n[1:]) for n in index.names]
    # an array indexed by the old rows, rebuilt: each kept node's value in its new row
    before = np.arange(40, dtype=np.float64) * 10
    after = rows.take(before, np.nan)
    assert after[: len(index)].tolist() == [float(n[1:]) * 10 for n in index.names]
    assert index.drop(["unknown"]) is None  # nothing of ours: nothing moves


def test_a_new_node_after_forgetting_gets_a_fresh_row_with_no_time() -> None:
    index = NodeIndex()
    index.admit(["a", "b"], np.array([5.0, 6.0]))
    index.drop(["a"])
    adm = index.admit(["a"], np.array([1.0]))  # older than it was: a new node now, so kept
    assert adm.keep.tolist() == [True] and np.isnan(adm.before[0])
    assert index.names == ["b", "a"] and index.last_ts.tolist() == [6.0, 1.0]


def test_place_puts_a_snapshots_rows_at_this_index_rows() -> None:
    """Snapshots from before the shared index kept each detector's own node order."""
    index = NodeIndex(["a", "b", "c"])
    into = np.full((3, 2), -1.0)
    saved = ["c", "x", "a"]  # another order, a node the index lacks, one it has not
    index.place(saved, np.array([[3.0, 3.0], [9.0, 9.0], [1.0, 1.0]]), into)
    assert into.tolist() == [[1.0, 1.0], [-1.0, -1.0], [3.0, 3.0]]
    same = np.zeros(3)
    index.place(["a", "b", "c"], np.array([1.0, 2.0, 3.0]), same)
    assert same.tolist() == [1.0, 2.0, 3.0]


def test_row_index_registers_new_names_in_the_order_given() -> None:
    ports = RowIndex()
    assert ports.lookup(["mlx5_1/1", "mlx5_0/1", "mlx5_1/1"]).tolist() == [0, 1, 0]
    assert ports.lookup(["mlx5_0/1"]).tolist() == [1]
    assert ports.sources(["mlx5_0/1", "other"]).tolist() == [-1, 0]


def _without_xid_wording(output: list[Any]) -> list[Any]:
    topic, key, m = output
    if not (m and m.get("kind") == "xid"):
        return output
    wording = ("action", "bucket", "description", "cause", "first_seen_by")
    ev = {k: v for k, v in m["evidence"].items() if k not in wording}
    return [topic, key, {**{k: v for k, v in m.items() if k != "summary"}, "evidence": ev}]


def _statistical(output: list[Any]) -> bool:
    topic, _key, m = output
    return topic == topics.FINDINGS and bool(m) and m.get("kind") == "statistical"


def _pre_index_fixture() -> tuple[Any, dict[str, Any]]:
    path = FIXTURES / "make_pre_index.py"
    spec = importlib.util.spec_from_file_location("make_pre_index", path)
    assert spec is not None and spec.loader is not None
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    return maker, json.loads(gzip.decompress((FIXTURES / "pre_index.json.gz").read_bytes()))


def test_a_snapshot_from_before_the_index_restores_and_goes_on_as_that_release_did() -> None:
    """Written by the release before the shared index (tests/fixtures/snapshots/make_pre_index.py):
    each detector had its own node order (the statistical detector's differs from the others'),
    and a node had been forgotten. Restored today, the task produces what that release produced
    after the snapshot, finding for finding."""
    maker, fixture = _pre_index_fixture()
    saved = fixture["snapshot"]
    assert saved["stats"]["nodes"] != saved["hardware"]["nodes"]  # the case this is about
    task = NodeTask.from_bytes(json.dumps(saved).encode(), JobTable(), maker.CONFIG)
    try:
        batches = maker.stream()
        then = [
            [
                [t, k, m]
                for t, k, m in task.process(
                    topics.TELEMETRY, TelemetryBatch.from_messages([dict(m) for m in b])
                )
            ]
            for b in batches[len(batches) // 2 :]
        ]

        # issue 23 (item 9): census records carry the node's run on the broker's clock, and one
        # restored from a snapshot without it starts a run at its next sample, written at once;
        # everything else is that release's output, finding for finding
        # issue 25: an XID's action and wording follow NVIDIA's catalogue now (95 and 64 reset the
        # GPU, the evidence names the bucket, and which source saw each XID first); the findings,
        # their ids, severities and codes do not change
        # issue 28: the statistical detector's per-series state (version 1) is not the multivariate
        # scorer's: restored, its open incidents carry on and its baselines are learnt again, so its
        # findings after the snapshot are no longer that release's (the first stays open, below)
        def others(out: list[Any]) -> list[Any]:
            return [
                [_without_xid_wording(o) for o in b if o[0] != topics.NODES and not _statistical(o)]
                for b in out
            ]

        def census(out: list[Any]) -> set[tuple[str, float, float]]:
            return {
                (m["node"], m["first_seen"], m["last_seen"])
                for b in out
                for t, _k, m in b
                if t == topics.NODES and m is not None
            }

        ours = json.loads(json.dumps(then))
        assert others(ours) == others(fixture["then"])
        assert census(fixture["then"]) <= census(ours)
        assert {(k[0], k[1], k[4]) for k in task.stats.book.open} >= {
            (i["node"], i["gpu"], i["rule"]) for i in saved["stats"]["book"]
        } or any(_statistical(o) and o[2]["resolved"] for b in then for o in b)
        # and the snapshot it writes now holds one node order, which the previous release reads
        d = orjson.loads(task.to_bytes())
        assert d["hardware"]["nodes"] == d["stats"]["nodes"] == d["lemon"]["nodes"] == list(d["last_ts"])
    finally:
        task.close()


# ---------------------------------------------------------------- order by the agent's numbering


@st.composite
def agent_streams(draw: st.DrawFn) -> list[tuple[str, int, int, float, float, bool]]:
    """Deliveries of a few nodes' samples: (node, instance code, seq, ts, received, first delivery).
    Each node's agent numbers its samples; a reinstall starts a new instance at seq 0; the clock
    jumps ahead or back now and then; at-least-once delivery repeats samples of the current and the
    replaced instance; the broker's time is known for some samples only."""
    out: list[tuple[str, int, int, float, float, bool]] = []
    for node in draw(st.lists(NAMES, min_size=1, max_size=3, unique=True)):
        t = 1000.0
        sent: list[tuple[str, int, int, float, float, bool]] = []
        instances = draw(st.lists(st.integers(1, 2**40), min_size=1, max_size=3, unique=True))
        for k, inst in enumerate(instances):
            first_seq = draw(st.integers(0, 5)) if k else draw(st.integers(0, 1000))
            for seq in range(first_seq, first_seq + draw(st.integers(1, 6))):
                t += 1.0
                jump = draw(st.sampled_from([0.0, 0.0, 0.0, 50.0, -40.0, -0.5]))
                received = t + 0.01 if draw(st.booleans()) else np.nan
                sent.append((node, inst, seq, t + jump, received, True))
                if (
                    draw(st.integers(0, 3)) == 0
                ):  # a redelivery of an earlier sample of this or the last instance
                    mine = [s for s in sent if s[1] in instances[max(0, k - 1) : k + 1]]
                    sent.append((*draw(st.sampled_from(mine))[:5], False))
        out += sent
    return out


@settings(max_examples=300, deadline=None)
@given(agent_streams(), st.integers(1, 5))
def test_admission_follows_the_agents_numbering_whatever_its_clock(
    stream: list[tuple[str, int, int, float, float, bool]], batch_size: int
) -> None:
    """Each sample is kept on its first delivery and only then, however its clock jumped; event
    times never go back within a node, and pass the broker's time + 2 s only where they cannot go
    back that far; jump is the sample's own time minus its event time."""
    index = NodeIndex()
    last: dict[str, float] = {}
    for i in range(0, len(stream), batch_size):
        part = stream[i : i + batch_size]
        names = [s[0] for s in part]
        adm = index.admit_rows(
            index.lookup(names),
            np.array([s[1] for s in part], dtype=np.int64),
            np.array([s[2] for s in part], dtype=np.int64),
            np.array([s[3] for s in part]),
            np.array([s[4] for s in part]),
        )
        assert adm.keep.tolist() == [s[5] for s in part]
        for k, s in enumerate(part):
            if not s[5]:
                continue
            ets = float(adm.ts[k])
            assert ets >= last.get(s[0], -np.inf)
            assert not ets > max(s[4] + 2.0, last.get(s[0], -np.inf))  # NaN received: no bound
            assert adm.jump[k] == pytest.approx(s[3] - ets)
            last[s[0]] = ets
    assert dict(zip(index.names, index.last_ts.tolist(), strict=True)) == last


def _sample(
    node: str, ts: float, seq: int, xids: tuple[int, ...] = (), instance: str | None = None
) -> dict[str, Any]:
    m: dict[str, Any] = {
        "schema": "telemetry/1",
        "node": node,
        "ts": ts,
        "seq": seq,
        "gpus": [{"index": 0, "util": 50.0, "temp_c": 60.0, "xids": list(xids)}],
    }
    if instance is not None:
        m["agent"] = {"instance": instance}
    return m


def _findings(out: list[Any], kind: str) -> list[dict[str, Any]]:
    return [v for t, _k, v in out if t == topics.FINDINGS and v is not None and v["kind"] == kind]


def test_a_clock_ahead_does_not_hide_the_next_samples_xid_and_is_reported() -> None:
    """The adversarial run's case: +50 s accepted, then the right clock, the next seq and XID 79."""
    task = NodeTask(JobTable())
    out = task.process(
        topics.TELEMETRY, TelemetryBatch.from_messages([_sample("a", 1000.0, 1), _sample("b", 1000.0, 1)])
    )
    out += task.process(topics.TELEMETRY, TelemetryBatch.from_messages([_sample("a", 1050.0, 2)]))
    out += task.process(topics.TELEMETRY, TelemetryBatch.from_messages([_sample("a", 1001.0, 3, (79,))]))
    [xid] = _findings(out, "xid")
    assert xid["node"] == "a" and xid["evidence"]["worst_xid"] == 79 and xid["severity"] == "critical"
    [clock] = [f for f in _findings(out, "host") if f["evidence"]["rule"] == "clock_jump"]
    assert clock["node"] == "a" and clock["severity"] == "warning"
    # without the broker's time (as here) the +50 s stands, and the next sample is 49 s behind it
    assert clock["evidence"]["direction"] == "behind" and clock["evidence"]["jump_s"] == -49.0


def test_a_reinstalled_agent_is_a_new_sequence_and_the_old_ones_copies_stay_duplicates() -> None:
    task = NodeTask(JobTable())
    out = task.process(
        topics.TELEMETRY,
        TelemetryBatch.from_messages([_sample("a", 1000.0 + k, 500 + k, instance="old") for k in range(3)]),
    )
    out += task.process(
        topics.TELEMETRY, TelemetryBatch.from_messages([_sample("a", 1004.0, 0, (79,), instance="new")])
    )
    out += task.process(
        topics.TELEMETRY, TelemetryBatch.from_messages([_sample("a", 1005.0, 501, (48,), instance="old")])
    )
    [xid] = _findings(out, "xid")
    assert xid["evidence"]["worst_xid"] == 79 and "48" not in xid["evidence"]["xids"]


def test_a_record_under_another_instance_does_not_lock_the_nodes_own_agent_out() -> None:
    """A stray or forged sample under another instance (or none) becomes the node's current
    instance for a moment; the agent's own next samples still count, and its copies stay copies."""
    task = NodeTask(JobTable())
    own = [_sample("a", 1000.0 + k, 10 + k, instance="agent") for k in range(3)]
    out = task.process(topics.TELEMETRY, TelemetryBatch.from_messages(own))
    out += task.process(
        topics.TELEMETRY, TelemetryBatch.from_messages([_sample("a", 1003.0, 5, instance="forged")])
    )
    out += task.process(
        topics.TELEMETRY, TelemetryBatch.from_messages([_sample("a", 1003.5, 7)])
    )  # no instance at all
    out += task.process(
        topics.TELEMETRY, TelemetryBatch.from_messages([_sample("a", 1004.0, 13, (79,), instance="agent")])
    )
    out += task.process(
        topics.TELEMETRY, TelemetryBatch.from_messages([_sample("a", 1005.0, 12, (48,), instance="agent")])
    )  # a copy
    [xid] = _findings(out, "xid")
    assert xid["evidence"]["worst_xid"] == 79 and "48" not in xid["evidence"]["xids"]


def test_a_restored_task_still_knows_where_each_agents_numbering_stands() -> None:
    """A redelivery after a restore (the snapshot's offsets lag the input) is still a duplicate,
    whatever its timestamp; a snapshot from before seq was kept admits by time."""
    task = NodeTask(JobTable())
    task.process(
        topics.TELEMETRY,
        TelemetryBatch.from_messages([_sample("a", 1000.0 + k, k, instance="i1") for k in range(5)]),
    )
    raw = task.to_bytes()
    restored = NodeTask.from_bytes(raw, JobTable())
    assert restored.index.last_seq.tolist() == [4]
    again = restored.process(
        topics.TELEMETRY, TelemetryBatch.from_messages([_sample("a", 2000.0, 3, (79,), instance="i1")])
    )
    assert _findings(again, "xid") == []
    d = orjson.loads(raw)
    del d["last_seq"], d["instances"]
    older = NodeTask.from_bytes(orjson.dumps(d), JobTable())
    assert (
        _findings(
            older.process(
                topics.TELEMETRY,
                TelemetryBatch.from_messages([_sample("a", 1002.0, 9, (79,), instance="i1")]),
            ),
            "xid",
        )
        == []
    )
    assert _findings(
        older.process(
            topics.TELEMETRY, TelemetryBatch.from_messages([_sample("a", 1005.0, 10, (79,), instance="i1")])
        ),
        "xid",
    )


def test_the_node_stage_takes_only_a_columnar_batch() -> None:
    """One telemetry form reaches the task: dicts and decoded structs are made into a batch at the
    edge (TelemetryBatch.from_messages / the worker's decoder), never inside the task."""
    from fleetwatch import fast_schema, schemas

    task = NodeTask(JobTable())
    msg = _sample("a", 1000.0, 1)
    for other in ([msg], [fast_schema.decode_telemetry(schemas.encode(msg))]):
        with pytest.raises(TypeError, match="TelemetryBatch"):
            task.process(topics.TELEMETRY, other)  # type: ignore[arg-type]
    assert task.process(topics.TELEMETRY, TelemetryBatch.from_messages([msg]))  # its census record
