"""Silent nodes, judged by the other nodes' clocks."""

from __future__ import annotations

from typing import Any

from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.detectors.node_index import NodeIndex
from fleetwatch.detectors.silence import SilenceDetector
from tests.helpers.admission import observe

T0 = 1_764_000_000.0


def report(det: SilenceDetector, index: NodeIndex, nodes: list[str], ts: float) -> list[dict[str, Any]]:
    """One sample of each of `nodes` at `ts`, through the node stage's admission on `index`."""
    msgs = [{"schema": "telemetry/1", "node": n, "ts": ts, "seq": int(ts - T0), "gpus": []} for n in nodes]
    return observe(det, index, msgs)


def test_a_silent_node_is_reported_and_resolves() -> None:
    det, index = SilenceDetector(), NodeIndex()
    nodes = [f"n{i}" for i in range(10)]
    out = []
    for t in range(0, 31, 5):  # n3 stops after T0 + 5
        out += report(det, index, [n for n in nodes if n != "n3" or t <= 5], T0 + t)
    assert [(f["node"], f["severity"], f["resolved"]) for f in out] == [("n3", "critical", False)]
    out = report(det, index, ["n3"], T0 + 31)
    assert [(f["node"], f["resolved"]) for f in out] == [("n3", True)]


def test_one_node_with_a_clock_ahead_does_not_silence_the_rest() -> None:
    det, index = SilenceDetector(), NodeIndex()
    nodes = [f"n{i}" for i in range(20)]
    for t in range(0, 31, 5):
        assert report(det, index, nodes, T0 + t) == []
        assert report(det, index, ["skewed"], T0 + 3600 + t) == []  # an hour ahead


def test_a_rack_going_quiet_is_still_seen() -> None:
    det, index = SilenceDetector(), NodeIndex()
    nodes = [f"n{i}" for i in range(20)]
    out = []
    for t in range(0, 61, 5):  # 30% of the nodes stop at once, after T0 + 20
        out += report(det, index, nodes if t <= 20 else nodes[6:], T0 + t)
    assert {f["node"] for f in out} == set(nodes[:6])


def _ticks(nodes: int, duration: int, faults: list[dict[str, object]]) -> list[list[dict[str, object]]]:
    import tempfile

    import yaml

    from fleetwatch import topics
    from fleetwatch.collectors.sim import Simulation, load_scenario

    doc = {"name": "silence", "seed": 3, "nodes": nodes, "node_prefix": "sil", "duration_s": duration}
    doc["faults"] = faults
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(doc, f)
    return [
        [m for t, _k, m in ms if t == topics.TELEMETRY]
        for ms in Simulation(load_scenario(f.name, {})).ticks()
    ]


def _silences(ticks: list[list[dict[str, object]]], ticks_per_batch: int) -> list[tuple[object, ...]]:
    from fleetwatch import topics
    from fleetwatch.pipeline.job_table import JobTable
    from fleetwatch.pipeline.node_stage import NodeTask

    task = NodeTask(JobTable())
    out = []
    for i in range(0, len(ticks), ticks_per_batch):
        batch = [m for t in ticks[i : i + ticks_per_batch] for m in t]
        out += [
            m
            for topic, _k, m in task.process(topics.TELEMETRY, TelemetryBatch.from_messages(batch))
            if topic == topics.FINDINGS
        ]
    return sorted(
        (f["id"], f["node"], f["first_seen"], f["ts"], f["resolved"])
        for f in out
        if f["evidence"].get("rule") == "silent"
    )


def test_silences_are_found_however_the_stream_is_batched() -> None:
    """A worker catching up on a backlog sees a silence begin and end inside one batch: it reports
    the same findings (ids, times, resolution) as one that read the stream tick by tick."""
    faults = [
        {"kind": "node_down", "node": 2, "onset_s": 30, "duration_s": 25},
        {"kind": "node_down", "node": 5, "onset_s": 40, "duration_s": 40},
        {"kind": "node_down", "node": 9, "onset_s": 100, "duration_s": 12},
    ]
    ticks = _ticks(12, 150, faults)
    live = _silences(ticks, 1)
    assert {(n, r) for _i, n, _f, _t, r in live} == {
        (f"sil{k:04d}", r) for k in (2, 5, 9) for r in (False, True)
    }
    for per_batch in (3, 17, 60, len(ticks)):
        assert _silences(ticks, per_batch) == live, per_batch


def test_a_partition_that_pauses_as_a_whole_is_not_a_silence() -> None:
    """Every node's samples stop and resume together (the pipeline, not the nodes, paused): no
    node fell behind the others, in one batch or tick by tick."""
    det, index = SilenceDetector(), NodeIndex()
    nodes = [f"n{i}" for i in range(10)]
    assert report(det, index, nodes, T0) == []  # each node's latest before the batch
    samples = [  # one sample each, then 59 s of nothing
        {"schema": "telemetry/1", "node": n, "ts": t, "seq": seq, "gpus": []}
        for seq, t in ((1, T0 + 1), (2, T0 + 60))
        for n in nodes
    ]
    assert observe(det, index, samples) == []
