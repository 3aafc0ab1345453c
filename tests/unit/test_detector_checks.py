"""Generic checks every registered per-node detector passes (detectors/registry.py), in the manner
of river's `river/checks`: a detector added to the registry is checked here with no test of its
own needed for these properties.

Each check drives the detector through its protocol only (detectors/protocol.NodeDetector) with
what the node stage gives it: batches of fresh samples (each (node, ts) once, in increasing ts per
node: the one place duplicates and late samples are dropped is the task's admission, which `Feed`
goes through)
and their context. The stream is the simulator's default scenario (every fault kind once, 32
nodes); every detector in the registry finds something in it, so each check has something to
compare.
"""

from __future__ import annotations

import random
from functools import cache
from typing import Any

import orjson
import pytest

from fleetwatch import topics
from fleetwatch.collectors.sim import Simulation, load_scenario, packaged_path
from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.detectors.findings import Forgotten
from fleetwatch.detectors.job_batch import JobBatch
from fleetwatch.detectors.lemon import LemonConfig
from fleetwatch.detectors.node_index import NodeIndex
from fleetwatch.detectors.protocol import NodeDetector
from fleetwatch.detectors.registry import JOB_DETECTORS, NODE_DETECTORS, Registered
from fleetwatch.pipeline.job_stage import JobTask
from fleetwatch.pipeline.job_table import JobTable
from fleetwatch.pipeline.node_stage import NodeTask
from tests.helpers.admission import observe, restored_index
from tests.helpers.detector_inputs import fleet, job_start, steps

# The lemon's windows are days; the stream is minutes. Shortened, it judges and finds within it.
CONFIGS: dict[str, Any] = {
    "lemon": LemonConfig(
        tau_s=900.0, judge_every_s=10.0, episode_gap_s=5.0, min_events=2.0, clear_after_s=300.0
    )
}


def config(reg: Registered) -> Any:
    return CONFIGS.get(reg.name, reg.config())


class Feed:
    """A detector fed as the node stage feeds it: through the task's own admission on the stage's
    node index (detectors/protocol.admit: duplicates and late samples dropped, event times), with the
    context it gives."""

    def __init__(self, reg: Registered, state: Any = None, index: NodeIndex | None = None) -> None:
        self.index = NodeIndex() if index is None else index
        if state is None:
            self.detector = reg.detector(config(reg), self.index)
        else:
            self.detector = reg.detector.from_state(state, config(reg), self.index)

    def __call__(self, msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return observe(self.detector, self.index, msgs)

    def forget(self, gone: Forgotten) -> list[dict[str, Any]]:
        """As the task forgets: the index drops the nodes, then the detector, with its renumbering."""
        return self.detector.forget(gone, self.index.drop(gone))

    def restored(self, reg: Registered) -> Feed:
        """A new feed from this one's snapshot: the index as the task restores it, the detector's state."""
        return Feed(reg, orjson.loads(state_bytes(self.detector)), restored_index(self.index))


CLOCK_STEPPED = "gpu-node-0003"  # its clock is stepped back 30 s half-way through the stream


@cache
def stream() -> tuple[tuple[dict[str, Any], ...], ...]:
    """Batches of 2 s of the default scenario (32 nodes, 5 min, every fault kind once), and one
    node whose clock is stepped back 30 s at its 150th sample (the clock detector's case)."""
    scenario = load_scenario(str(packaged_path("default.yaml")), {})
    ticks = [[m for t, _k, m in msgs if t == topics.TELEMETRY] for msgs in Simulation(scenario).ticks()]
    for tick in ticks[150:]:
        for m in tick:
            if m["node"] == CLOCK_STEPPED:
                m["ts"] -= 30.0
    return tuple(tuple(ticks[i] + ticks[i + 1]) for i in range(0, len(ticks) - 1, 2))


def run(feed: Feed, batches: Any) -> list[dict[str, Any]]:
    return [f for b in batches for f in feed([dict(m) for m in b])]


def state_bytes(detector: NodeDetector) -> bytes:
    return orjson.dumps(detector.to_state(), option=orjson.OPT_SERIALIZE_NUMPY)


ALL = pytest.mark.parametrize("reg", NODE_DETECTORS, ids=[r.name for r in NODE_DETECTORS])


def test_the_stream_gives_every_detector_something_to_find() -> None:
    """The checks below compare findings: each registered detector has some on this stream."""
    for reg in NODE_DETECTORS:
        assert run(Feed(reg), stream()), f"{reg.name} found nothing on the check stream"


@ALL
def test_deterministic(reg: Registered) -> None:
    a, b = Feed(reg), Feed(reg)
    assert run(a, stream()) == run(b, stream())
    assert state_bytes(a.detector) == state_bytes(b.detector)


@ALL
def test_a_snapshot_mid_stream_resumes_as_if_never_interrupted(reg: Registered) -> None:
    batches = stream()
    half = len(batches) // 2
    whole = Feed(reg)
    first = run(whole, batches[:half])
    rest = run(whole, batches[half:])

    before = Feed(reg)
    assert run(before, batches[:half]) == first
    restored = before.restored(reg)
    assert run(restored, batches[half:]) == rest
    assert state_bytes(restored.detector) == state_bytes(whole.detector)


@ALL
def test_duplicate_and_late_samples_change_nothing(reg: Registered) -> None:
    """Redelivered batches (at-least-once upstream) and late copies of older samples: dropped
    where the task drops them; no detector needs a dedupe of its own."""
    rng = random.Random(7)
    clean = stream()
    noisy: list[list[dict[str, Any]]] = []
    for i, b in enumerate(clean):
        batch = list(b)
        if i and rng.random() < 0.3:
            batch = list(clean[i - 1]) + batch  # the previous batch again, first
        if i > 2 and rng.random() < 0.3:
            batch += rng.sample(list(clean[i - 2]), 4)  # late copies of older samples, last
        noisy.append(batch)
    assert sum(map(len, noisy)) > sum(map(len, clean))
    assert run(Feed(reg), noisy) == run(Feed(reg), clean)


@ALL
def test_constant_healthy_input_gives_no_findings(reg: Registered) -> None:
    """16 nodes reporting the same healthy values every second for 10 minutes."""
    [tick] = fleet(16, 1, seed=3)
    batches = [[{**m, "ts": m["ts"] + t, "seq": m["seq"] + t} for m in tick] for t in range(600)]
    assert run(Feed(reg), batches) == []


@cache
def steady_fleet() -> list[list[dict[str, Any]]]:
    return fleet(16, 600, seed=5)


@ALL
def test_state_is_bounded_by_the_nodes_not_by_time(reg: Registered) -> None:
    """The same 16 nodes for 2.5 and then 10 minutes of healthy, varying load: the state does not
    grow with time."""
    ticks = steady_fleet()
    short, long = Feed(reg), Feed(reg)
    run(short, ticks[:150])
    run(long, ticks)
    assert len(state_bytes(long.detector)) <= 1.1 * len(state_bytes(short.detector)) + 256


@ALL
def test_forgetting_every_node_leaves_no_trace_of_them_and_no_open_incident(reg: Registered) -> None:
    """What a detector learned about the fleet as a whole may stay; nothing of a forgotten node."""
    feed = Feed(reg)
    run(feed, stream())
    names = list(feed.index.names)
    resolved = feed.forget(Forgotten(dict(zip(names, feed.index.last_ts.tolist(), strict=True)), 3600.0))
    assert all(f["resolved"] for f in resolved)
    assert not feed.detector.book.open
    kept = state_bytes(feed.detector)
    assert [n for n in names if f'"{n}"'.encode() in kept] == []


def test_a_snapshot_from_before_the_protocol_keeps_the_lemons_timing() -> None:
    """Until the detector protocol the task kept when the lemon judges next ("next_lemon")."""
    task = NodeTask(JobTable())
    for b in stream()[:20]:
        task.process(topics.TELEMETRY, TelemetryBatch.from_messages([dict(m) for m in b]))
    due = task.lemon.next_judgement
    assert due > 0
    old = orjson.loads(task.to_bytes())
    del old["lemon"]["next_judgement"]
    assert old["next_lemon"] == due
    restored = NodeTask.from_bytes(orjson.dumps(old), JobTable())
    assert restored.lemon.next_judgement == due
    task.close()
    restored.close()


# ---------------------------------------------------------------- the job stage's detectors

JOBS = pytest.mark.parametrize("reg", JOB_DETECTORS, ids=[r.name for r in JOB_DETECTORS])


@cache
def job_stream() -> tuple[tuple[dict[str, Any], ...], ...]:
    """Two 8-node jobs' step records (one rank 20% slow from step 100), then one job's end: batches
    of 40 records, as a job partition delivers them."""
    recs = steps(8, 200, slow={3: 0.2}, slow_from=100, seed=1)
    recs += steps(8, 200, seed=2, job="job-2")
    recs.sort(key=lambda m: m["ts"])
    recs[:0] = [job_start(8), job_start(8, "job-2")]  # the job stage judges only the nodes listed
    end = {"schema": "job/1", "job": "job-1", "state": "finished", "ts": recs[-1]["ts"] + 1, "nodes": []}
    recs.append(end)
    return tuple(tuple(recs[i : i + 40]) for i in range(0, len(recs), 40))


def run_jobs(detector: Any, batches: Any) -> list[dict[str, Any]]:
    return [f for b in batches for f in detector.observe(JobBatch.from_records([dict(m) for m in b]))]


@JOBS
def test_job_detectors_find_something_and_are_deterministic(reg: Registered) -> None:
    a, b = reg.detector(reg.config()), reg.detector(reg.config())
    found = run_jobs(a, job_stream())
    assert found and found == run_jobs(b, job_stream())
    assert any(f["resolved"] for f in found)  # the job's end resolves its incident


def _batches(recs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    return [recs[i : i + 40] for i in range(0, len(recs), 40)]


@JOBS
def test_job_detectors_give_no_findings_on_constant_healthy_input(reg: Registered) -> None:
    """A 16-node job whose every rank takes the same time at every step, for 600 steps."""
    assert run_jobs(reg.detector(reg.config()), _batches(steps(16, 600, jitter=0.0))) == []


@JOBS
def test_job_detectors_state_is_bounded_by_the_nodes_not_by_time(reg: Registered) -> None:
    """The same healthy 16-node job for 150 and then 600 steps: the state does not grow with time;
    and the job's end leaves nothing of it."""
    recs = steps(16, 600, seed=9)
    short, long = reg.detector(reg.config()), reg.detector(reg.config())
    run_jobs(short, _batches(recs[: 16 * 150]))
    run_jobs(long, _batches(recs))
    assert len(state_bytes(long)) <= 1.1 * len(state_bytes(short)) + 256
    end = {"schema": "job/1", "job": "job-1", "state": "finished", "ts": recs[-1]["ts"] + 1, "nodes": []}
    run_jobs(long, [[end]])
    assert b"job-1" not in state_bytes(long)


@JOBS
def test_job_detectors_resume_from_a_snapshot_mid_stream(reg: Registered) -> None:
    batches = job_stream()
    half = len(batches) // 2
    whole = reg.detector(reg.config())
    first = run_jobs(whole, batches[:half])
    rest = run_jobs(whole, batches[half:])
    before = reg.detector(reg.config())
    assert run_jobs(before, batches[:half]) == first
    restored = reg.detector.from_state(orjson.loads(state_bytes(before)), reg.config())
    assert run_jobs(restored, batches[half:]) == rest
    assert state_bytes(restored) == state_bytes(whole)


def test_the_job_stage_drops_redelivered_and_late_step_records() -> None:
    """At-least-once delivery redelivers step records: the job stage drops them once for its
    detectors (until this check existed a redelivered step was counted twice and moved the
    medians). Its state, with what it has taken, survives a snapshot."""
    clean = job_stream()
    rng = random.Random(11)
    noisy = []
    for i, b in enumerate(clean):
        batch = list(b)
        if i and rng.random() < 0.4:
            batch = list(clean[i - 1]) + batch
        noisy.append(batch)
    a, b = JobTask(), JobTask()
    want = [o for batch in clean for o in a.process(topics.STEPS, [dict(m) for m in batch])]
    got = []
    for k, batch in enumerate(noisy):
        if k == len(noisy) // 2:
            restored = JobTask.from_bytes(b.to_bytes())
            b.close()
            b = restored
        got += b.process(topics.STEPS, [dict(m) for m in batch])
    assert want and got == want
    assert "job-1" not in b.last_ts  # forgotten with the job's end
    a.close()
    b.close()
