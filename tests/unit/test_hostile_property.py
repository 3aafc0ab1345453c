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

import fleetwatch.detectors.findings  # noqa: F401  (registers finding/1)
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
from tests.helpers.messages import telemetry

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
