"""Structurally hostile JSON through the path the workers take, decode -> detect -> act (issue 15).

Generated messages: valid ones mutated with deep nesting, huge numbers, long strings, duplicate
keys, wrong types, invalid UTF-8 and keys that are not their node. Whatever comes in, no exception
escapes; every record is either processed or refused with one of the fixed reasons; every output
is a valid message under the size the worker lets through; and the acting stage takes whatever
findings come out (drain requests included) without raising.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetwatch import schemas, topics
from fleetwatch.alerts import drain_request
from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.pipeline.job_stage import JobTask
from fleetwatch.pipeline.job_table import JobTable
from fleetwatch.pipeline.node_stage import NodeTask
from fleetwatch.pipeline.telemetry_decode import decode_telemetry
from fleetwatch.pipeline.worker import MAX_OUTPUT_BYTES
from fleetwatch.record_block import RecordBlock
from tests.helpers.act import Rig
from tests.helpers.messages import CHECKS, KERNEL_SECTION, NODE_CHECK_COUNTS, telemetry

NOW = 1_764_000_000.0
CLOCK = schemas.ClockLimits()
NODES = [f"hp-{i}" for i in range(3)]

big_number = st.sampled_from([2**63, 2**64 - 1, 2**64, -(2**63) - 1, 10**30, 1e308, -1e308, 2**32 - 1])
long_text = st.sampled_from([129, 5_000, 300_000]).map(lambda n: "x" * n)
wrong_type = st.sampled_from([None, True, [], {}, "7", [[1]], {"a": {"b": 1}}])
leaf = st.one_of(big_number, long_text, wrong_type, st.integers(-5, 300), st.floats(allow_nan=False)).map(
    copy.deepcopy  # sampled values are shared between examples, and mutations write into them
)


def _containers(m: Any) -> list[tuple[Any, Any]]:
    """(container, key or index) of every value in a parsed message, the message first."""
    out: list[tuple[Any, Any]] = []
    stack = [m]
    while stack:
        c = stack.pop()
        items = c.items() if isinstance(c, dict) else enumerate(c) if isinstance(c, list) else ()
        for k, v in items:
            out.append((c, k))
            stack.append(v)
    return out


@st.composite
def hostile_sample(draw: Any) -> tuple[bytes | None, bytes | None]:
    """(key, value) of one record: a valid sample, mutated."""
    node = draw(st.sampled_from(NODES))
    m = copy.deepcopy(telemetry(node=node, ts=NOW + draw(st.sampled_from([-3, -1, 0, 1, 120, -(10**6)]))))
    m["gpus"][draw(st.integers(0, 7))]["xids"] = draw(
        st.lists(st.sampled_from([79, 48, 13, 2**32]), max_size=3)
    )
    m["net"]["ib"] *= draw(st.sampled_from([1, 2, 256]))
    if draw(st.booleans()):  # what the kernel log said: XIDs, an AER error (read by the detectors)
        m["kernel"] = copy.deepcopy(KERNEL_SECTION)
    if draw(st.booleans()):  # failing mounts and block devices, named (the node checks)
        m["host"].update(NODE_CHECK_COUNTS)
        m["checks"] = copy.deepcopy(CHECKS)
    for _ in range(draw(st.integers(0, 3))):
        container, k = draw(st.sampled_from(_containers(m)))
        how = draw(st.sampled_from(["leaf", "deep", "drop"]))
        if how == "leaf":
            container[k] = draw(leaf)
        elif how == "deep":
            depth = draw(st.sampled_from([3, 70, 1000, 1200]))
            container[k] = json.loads("[" * depth + "]" * depth)
        elif isinstance(container, dict):
            del container[k]
    try:
        raw = json.dumps(m).encode()
    except (ValueError, RecursionError):
        raw = b"[" * 2000
    edit = draw(st.sampled_from(["none", "dup", "utf8", "cut", "unknown"]))
    if edit == "dup":  # a second "node" (or any key) at the end of the object
        raw = raw[:-1] + b', "node": "' + draw(st.sampled_from(NODES)).encode() + b'"}'
    elif edit == "utf8":
        at = draw(st.integers(0, max(0, len(raw) - 1)))
        raw = raw[:at] + b"\xff" + raw[at:]
    elif edit == "cut":
        raw = raw[: draw(st.integers(0, len(raw)))]
    elif edit == "unknown":
        raw = raw[:-1] + b', "ext": {"a": [1, {"b": "\\u00e9"}], "a": 2}}'
    key = draw(st.sampled_from([node.encode(), node.encode(), b"other-node", None]))
    return key, raw


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(st.lists(hostile_sample(), min_size=1, max_size=8))
def test_hostile_telemetry_is_processed_or_refused_and_nothing_escapes(
    records: list[tuple[Any, Any]],
) -> None:
    block = RecordBlock.from_values([v for _k, v in records], keys=[k for k, _v in records])
    batch, bad = decode_telemetry(block, now=NOW, clock=CLOCK)
    accepted = len(batch) if isinstance(batch, TelemetryBatch) else 0
    assert accepted + len(bad) == len(records)
    assert all(e.reason in schemas.REASONS for _i, e in bad)

    task = NodeTask(JobTable())
    outputs = task.process(topics.TELEMETRY, batch) if accepted else []
    findings = []
    for topic, key, msg in outputs:
        value = schemas.encode(msg)
        assert len(value) <= MAX_OUTPUT_BYTES
        decoded = schemas.decode(value, key=key.encode() if key else None)  # a valid message, keyed right
        if topic == topics.FINDINGS:
            findings.append(decoded)
    assert len(findings) <= 8 * 3 * len(records)  # bounded per sample, whatever it held

    rig = Rig(census=set(NODES), drain_budget=1.0)
    rig.feed(*findings)
    for req in rig.decide(NOW + 600):
        drain_request.validate_drain(req)


job = st.fixed_dictionaries(
    {
        "schema": st.just("job/1"),
        "job": st.sampled_from(["j1", "j2"]),
        "nodes": st.just(NODES),
        "state": st.sampled_from(["running", "failed"]),
        "ts": st.just(NOW),
    }
)
step = st.fixed_dictionaries(
    {
        "schema": st.just("step/1"),
        "job": st.sampled_from(["j1", "j2"]),
        "node": st.sampled_from(NODES),
        "rank": st.integers(0, 3),
        "step": st.integers(0, 50),
        "step_time_s": st.floats(0, 5),
        "ts": st.just(NOW),
    }
)


@st.composite
def hostile_job_record(draw: Any) -> tuple[str, bytes | None, bytes]:
    m = copy.deepcopy(draw(st.one_of(job, step)))  # the strategies share their lists
    topic = topics.JOBS if m["schema"] == "job/1" else topics.STEPS
    for _ in range(draw(st.integers(0, 2))):
        container, k = draw(st.sampled_from(_containers(m)))
        container[k] = draw(leaf)
    try:
        raw = orjson.dumps(m)
    except TypeError:  # an integer orjson will not write: the standard library will
        raw = json.dumps(m).encode()
    if draw(st.booleans()):
        raw = raw[:-1] + b',"job":"j2"}'
    return topic, draw(st.sampled_from([b"j1", b"j2", None])), raw


@settings(max_examples=150, deadline=None)
@given(st.lists(hostile_job_record(), min_size=1, max_size=12))
def test_hostile_jobs_and_steps_are_processed_or_refused(records: list[tuple[str, Any, bytes]]) -> None:
    task, table = JobTask(), JobTable()
    for topic, key, raw in records:
        schema = schemas.JOB if topic == topics.JOBS else schemas.STEP
        ok, bad = schemas.decode_batch([raw], schema, keys=[key], ref_ts=NOW, clock=CLOCK)
        assert len(ok) + len(bad) == 1 and all(e.reason in schemas.REASONS for _i, e in bad)
        for m in ok:
            if topic == topics.JOBS:
                table.apply(m)
            for _t, k, out in task.process(topic, [m]):
                assert len(schemas.encode(out)) <= MAX_OUTPUT_BYTES
                schemas.decode(schemas.encode(out), key=k.encode() if k else None)


# ------------------------------------------------------------------ the state topic (issue 23, item 4)

STATE_OF, STATE_IN = "g/detect-node", topics.TELEMETRY
any_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12) | big_number,
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=4),
    max_leaves=10,
)
any_bytes = st.one_of(
    st.binary(max_size=64),
    any_json.map(lambda v: json.dumps(v).encode()),
    st.sampled_from([b"[1,2,3]", b"\xff\xfe", b"", b"{", b"null", b'"manifest"', b"1e999"]),
)


@st.composite
def hostile_state(draw: Any) -> tuple[list[tuple[bytes, bytes | None]], bool]:
    """(the records of one (stage, partition) on the state topic, whether they are untouched): a
    snapshot as write_snapshot writes it, with its manifest or chunks mutated, replaced or gone."""
    from fleetwatch.bus.memory import MemoryBus
    from fleetwatch.pipeline.state_store import write_snapshot

    bus = MemoryBus(partitions=1)
    producer = bus.producer()
    state = draw(st.binary(max_size=40))
    write_snapshot(producer, STATE_OF, 0, {STATE_IN: draw(st.integers(0, 10**6))}, state)
    records = [(r.key, r.value) for r in bus.records(topics.STATE)]
    untouched = True
    for _ in range(draw(st.integers(0, 3))):
        k = draw(st.integers(0, len(records) - 1))
        key, value = records[k]
        how = draw(st.sampled_from(["bytes", "field", "drop", "tombstone", "generation", "extra"]))
        untouched = False
        if how == "bytes":
            records[k] = (key, draw(any_bytes))
        elif how == "field" and key.endswith(b"manifest") and value is not None:
            try:
                m = orjson.loads(value)
            except orjson.JSONDecodeError:
                continue
            if isinstance(m, dict):
                name = draw(st.sampled_from(["generation", "chunks", "offsets", "written_at"]))
                if draw(st.booleans()):
                    m.pop(name, None)
                else:
                    m[name] = draw(
                        st.one_of(
                            any_json,
                            st.sampled_from(
                                [-1, 0, 10**12, 2**63, {"x": 1}, {STATE_IN: -5}, {STATE_IN: "7"}]
                            ),
                        )
                    )
                records[k] = (key, json.dumps(m).encode())
        elif how == "drop":
            del records[k]
            if not records:
                return [], False
        elif how == "tombstone":
            records[k] = (key, None)
        elif how == "generation" and value is not None:
            records[k] = (key, b"0123456789abcdef:" + value.partition(b":")[2])
        elif how == "extra":  # a chunk past the manifest's count, of any generation
            records.append(
                (f"{STATE_OF}/0/chunk-{draw(st.integers(0, 99999)):05d}".encode(), draw(any_bytes))
            )
    return records, untouched


@settings(max_examples=300, deadline=None)
@given(hostile_state())
def test_any_record_on_the_state_topic_restores_or_is_reported_and_nothing_escapes(
    case: tuple[list[tuple[bytes, bytes | None]], bool],
) -> None:
    """Whatever the state topic holds for a partition, reading it gives a whole snapshot (its
    offsets int64s of the stage's inputs) or none, with the reason reported; it never raises."""
    from fleetwatch.bus.memory import MemoryBus
    from fleetwatch.pipeline.state_store import LOST_REASONS, read_snapshots

    records, untouched = case
    bus = MemoryBus(partitions=1)
    for key, value in records:
        bus.append(topics.STATE, key, value, partition=0)
    lost: list[str] = []
    got = read_snapshots(bus, [(STATE_OF, 0)], on_lost=lambda _k, why: lost.append(why))
    snap = got[(STATE_OF, 0)]
    assert set(lost) <= set(LOST_REASONS) and len(lost) <= 1
    if snap is None:
        assert lost or not any(k.endswith(b"manifest") and v is not None for k, v in records)
    else:
        assert not lost and isinstance(snap.state, bytes) and isinstance(snap.written_at, float)
        assert isinstance(snap.offsets, dict)
        assert all(type(t) is str and type(o) is int and 0 <= o < 2**63 for t, o in snap.offsets.items())
    if untouched:
        assert snap is not None


@settings(max_examples=60, deadline=None)
@given(hostile_state())
def test_a_worker_takes_any_state_record_and_goes_on(
    case: tuple[list[tuple[bytes, bytes | None]], bool],
) -> None:
    """The same records under a real detect stage's state name: the worker's assignment restores
    the partition or starts it cold, and its telemetry is processed either way."""
    from fleetwatch.bus import TopicPart
    from fleetwatch.bus.memory import MemoryBus
    from fleetwatch.pipeline.detect import stages
    from fleetwatch.pipeline.worker import Worker

    records, _untouched = case
    bus = MemoryBus(partitions=1)
    for key, value in records:
        bus.append(topics.STATE, key.replace(STATE_OF.encode(), b"hp/detect-node", 1), value, partition=0)
    for node in NODES:
        bus.append(topics.TELEMETRY, node.encode(), orjson.dumps(telemetry(node=node, ts=NOW)))
    node_stage = [s for s in stages(JobTable(), clock=None) if s.name == "detect-node"]
    worker = Worker(bus, "hp", node_stage, snapshot_every_s=3600)
    while worker.step(timeout_ms=0):
        pass
    assert worker.consumer.assignment() == {TopicPart(topics.TELEMETRY, 0)}
    assert set(worker.tasks) == {("detect-node", 0)}
    assert bus.committed("hp")[TopicPart(topics.TELEMETRY, 0)] == len(NODES)
    worker.close()


def test_a_counter_width_off_the_state_topic_is_refused_before_it_is_computed() -> None:
    """A snapshot's counter limits are bits of an NVML type: 2**(2**40) would take the worker's
    memory while the snapshot is loaded (issue 23, item 4). Refused: the stage cannot load it, and
    the worker starts that partition cold."""
    import pytest

    from fleetwatch.detectors.counters import CounterTracker

    state = CounterTracker(("a", "b"), {"a": (32, "wrap"), "b": (64, "saturate")}).to_state()
    assert CounterTracker.from_state(state).limits == {"a": (32, "wrap"), "b": (64, "saturate")}
    for bits, mode in ((2**40, "wrap"), (0, "wrap"), (-3, "saturate"), (32, "explode")):
        with pytest.raises(ValueError, match="counter limits"):
            CounterTracker.from_state({**state, "limits": {"a": [bits, mode]}})


def test_sizes_off_the_state_topic_are_refused_before_anything_is_allocated() -> None:
    """Entity counts and rows in a node-stage snapshot size the detectors' arrays: numbers past
    what the snapshot itself holds (2**40 GPUs, a port of node 2**34) would take the worker's
    memory on its first batch. Refused when loaded: the worker starts that partition cold."""
    import pytest

    task = NodeTask(JobTable())
    task.process(topics.TELEMETRY, TelemetryBatch.from_messages([telemetry(node=n, ts=NOW) for n in NODES]))
    good = orjson.loads(task.to_bytes())
    task.close()
    assert good["hardware"]["ib_rows"], "the snapshot holds IB ports"
    hostile = []
    for edit in ("n_gpu", "ib_node", "ib_entity", "run_k"):
        d = copy.deepcopy(good)
        hw = d["hardware"]
        if edit == "n_gpu":
            hw["n_gpu"] = 2**40
        elif edit == "ib_node":
            hw["ib_rows"][0][0] = 2**34
        elif edit == "ib_entity":
            hw["ib_rows"][0][2] = 2**34
        else:
            hw["gpu_runs"]["k"] = 2**34
        hostile.append(orjson.dumps(d))
    NodeTask.from_bytes(orjson.dumps(good), JobTable()).close()
    for raw in hostile:
        with pytest.raises(ValueError):
            NodeTask.from_bytes(raw, JobTable())
