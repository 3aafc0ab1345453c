"""finding/1: construction, validation, registration, stable ids, signatures, and the incident
lifecycle."""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np
import orjson
import pytest

from fleetwatch import schemas, topics
from fleetwatch.detectors.findings import (
    KINDS,
    IncidentBook,
    finding_id,
    make_finding,
    severity_score,
    signature_error,
)
from fleetwatch.pipeline.detect import stages
from fleetwatch.pipeline.job_table import JobTable
from fleetwatch.schemas import MessageError
from fleetwatch.signing import encode_signed


def sample(**over: Any) -> dict[str, Any]:
    kw: dict[str, Any] = dict(
        node="gpu-node-0007",
        gpu=3,
        kind="xid",
        rule="xid_burst",
        severity="critical",
        score=0.9,
        summary="gpu-node-0007 GPU3: XID 79 GPU has fallen off the bus (drain node)",
        evidence={"xids": {"79": 1}},
        first_seen=1000.0,
        ts=1000.0,
    )
    kw.update(over)
    return make_finding(**kw)


def test_make_finding_is_valid_and_decodes_through_the_shared_decoder() -> None:
    f = sample()
    assert f["schema"] == "finding/1" and f["resolved"] is False
    assert f["evidence"]["rule"] == "xid_burst"
    back = schemas.decode(schemas.encode(f), "finding/1")
    assert back == f


def test_a_finding_stays_small_whatever_its_evidence_and_summary() -> None:
    """A detector quoting hostile input (a 400 KB name, thousands of entries) still makes a
    finding far below the broker's limit: the summary is cut, the evidence keeps the entries that
    fit, in order, and counts the ones it left out."""
    from fleetwatch.detectors.findings import MAX_EVIDENCE_BYTES, MAX_SUMMARY

    evidence = {"port": "p" * 400_000, "small": 1, **{f"k{i}": "v" * 100 for i in range(500)}}
    f = sample(summary="s" * 100_000, evidence=evidence)
    assert len(f["summary"]) == MAX_SUMMARY
    assert len(orjson.dumps(f["evidence"])) <= MAX_EVIDENCE_BYTES
    kept = [k for k in f["evidence"] if k not in ("rule", "truncated")]
    assert kept[0] == "small" and "port" not in kept  # in order; what does not fit is left out
    assert f["evidence"]["truncated"] == len(evidence) + 1 - (len(kept) + 1)
    assert len(schemas.encode(f)) < 16_384
    schemas.validate(f)


def test_optional_gpu_and_job() -> None:
    f = sample(gpu=None, job="job-42", kind="straggler")
    assert "gpu" not in f and f["job"] == "job-42"
    schemas.validate(f)


def test_id_is_stable_and_depends_on_every_identity_field() -> None:
    base = ("n1", 0, None, "ecc", "ecc_dbe", 123.25)
    assert finding_id(*base) == finding_id(*base)
    # A timestamp that went through JSON hashes the same.
    assert finding_id(*base[:5], orjson.loads(orjson.dumps(base[5]))) == finding_id(*base)
    variants = [
        ("n2", 0, None, "ecc", "ecc_dbe", 123.25),
        ("n1", 1, None, "ecc", "ecc_dbe", 123.25),
        ("n1", 0, "j", "ecc", "ecc_dbe", 123.25),
        ("n1", 0, None, "xid", "ecc_dbe", 123.25),
        ("n1", 0, None, "ecc", "ecc_sbe_rate", 123.25),
        ("n1", 0, None, "ecc", "ecc_dbe", 124.0),
    ]
    ids = {finding_id(*v) for v in variants} | {finding_id(*base)}
    assert len(ids) == len(variants) + 1
    # Updates of one incident (severity, ts, resolved) keep the id.
    assert sample()["id"] == sample(ts=2000.0, severity="warning", resolved=True)["id"]


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("kind", "GPU fault!", "out_of_range"),  # not a kind name (any kind name is valid: a newer detect)
        ("severity", "fatal", "out_of_range"),
        ("score", 1.5, "out_of_range"),
        ("score", -0.1, "out_of_range"),
        ("resolved", "no", "wrong_type"),
        ("evidence", [], "wrong_type"),
        ("node", "bad node!", "out_of_range"),
        ("gpu", -1, "out_of_range"),
        ("ts", 999.0, "out_of_range"),  # before first_seen
        ("sig", 123, "wrong_type"),
        ("sig", "f" * 129, "out_of_range"),
    ],
)
def test_validation_rejects(field: str, value: Any, reason: str) -> None:
    f = sample()
    f[field] = value
    with pytest.raises(MessageError) as e:
        schemas.validate(f)
    assert e.value.reason == reason


KEY = b"test-detect-key-0123456789abcdef"


def refusal(f: dict[str, Any], key: bytes = KEY) -> str | None:
    """act's reason to refuse `f` (alerts/actor.py), None if it verifies."""
    why = signature_error(f, key)
    return None if why is None else why[0]


def test_a_signed_finding_verifies_as_its_reader_decodes_it_and_nothing_else_does() -> None:
    # numpy scalars in the evidence (a detector's float64) are signed as the numbers they encode to
    f = sample(evidence={"xids": {"79": np.int64(1)}, "temp_c": np.float64(91.25)})
    got = schemas.decode(encode_signed(f, KEY), "finding/1")
    assert refusal(got) is None
    assert refusal(f) == "unsigned"
    assert refusal(got, b"another-key-0123456789abcdef") == "bad_signature"
    for field, value in (("resolved", True), ("severity", "warning"), ("node", "gpu-node-0008"), ("x", 1)):
        assert refusal({**got, field: value}) == "bad_signature"
    assert refusal({**got, "sig": None}) == "bad_signature"
    # a signature with characters compare_digest refuses (it raised TypeError out of act's task)
    for sig in ("é", "\u00e9" * 64, "ａ" * 64):
        assert refusal({**got, "sig": sig}) == "bad_signature"


def test_detect_signs_the_findings_of_both_stages_and_only_in_their_serializers() -> None:
    f = sample()
    for stage in stages(JobTable(), census_key=KEY):
        assert refusal(schemas.decode(stage.serializer(topics.FINDINGS)(f))) is None, stage.name
        assert "sig" not in f  # the task's message stays key-free (snapshots, `fleetwatch eval`)
    for stage in stages(JobTable()):  # no key (in-process tests): unsigned, which act refuses
        assert "sig" not in schemas.decode(stage.serializer(topics.FINDINGS)(f))


def test_validation_requires_fields() -> None:
    for k in [k for k in sample() if k not in ("schema", "gpu")]:
        f = sample()
        del f[k]
        with pytest.raises(MessageError) as e:
            schemas.validate(f)
        assert e.value.reason == "missing_field"


def test_every_kind_is_accepted() -> None:
    for k in KINDS:
        assert sample(kind=k)["kind"] == k


def test_severity_score_bands() -> None:
    assert severity_score("info") < severity_score("warning") < severity_score("critical")
    assert severity_score("warning", 100.0) > severity_score("warning", 2.0) > severity_score("warning")
    assert 0.0 <= severity_score("critical", float("inf")) <= 1.0
    assert severity_score("warning", 1e9) < severity_score("critical")


# ---------------------------------------------------------------- incident lifecycle


class Clock:
    """next_ts over a fixed list of sample times of one node."""

    def __init__(self, times: list[float]) -> None:
        self.times = sorted(times)

    def next_ts(self, node: str, t: float) -> float | None:
        i = bisect.bisect_left(self.times, t)
        return self.times[i] if i < len(self.times) else None

    def latest(self, node: str) -> float | None:
        return self.times[-1] if self.times else None


def observe(book: IncidentBook, clock: Clock, ts: float, severity: str = "warning") -> list[dict[str, Any]]:
    return book.observe(
        node="n1",
        gpu=0,
        kind="thermal",
        rule="thermal_throttle",
        ts=ts,
        severity=severity,
        score=severity_score(severity),
        summary="n1 GPU0: hot",
        evidence={"temp_c": 90},
        clear_after=60.0,
        next_ts=clock.next_ts,
    )


def test_emitted_on_open_escalation_and_resolve_only() -> None:
    clock = Clock([float(t) for t in range(0, 200)])
    book = IncidentBook()
    assert len(observe(book, clock, 10.0)) == 1
    assert observe(book, clock, 11.0) == []  # same severity: silent
    esc = observe(book, clock, 12.0, "critical")
    assert len(esc) == 1 and esc[0]["severity"] == "critical"
    assert observe(book, clock, 13.0, "warning") == []  # severity does not fall inside an incident
    out = book.sweep(clock.next_ts, clock.latest)
    assert len(out) == 1
    r = out[0]
    assert r["resolved"] is True and r["severity"] == "critical" and r["id"] == esc[0]["id"]
    assert r["ts"] == 13.0 + 60.0  # the first sample at or after last bad + clear_after
    assert len(book) == 0


def test_not_resolved_before_a_healthy_sample_is_seen() -> None:
    clock = Clock([10.0, 20.0])
    book = IncidentBook()
    observe(book, clock, 10.0)
    assert book.sweep(clock.next_ts, clock.latest) == []  # no sample 60 s later yet
    clock.times.append(500.0)
    out = book.sweep(clock.next_ts, clock.latest)
    assert [f["ts"] for f in out] == [500.0]


def test_bad_again_after_a_quiet_period_is_a_new_incident() -> None:
    clock = Clock([float(t) for t in range(0, 300, 5)])
    book = IncidentBook()
    first = observe(book, clock, 10.0)
    again = observe(book, clock, 200.0)
    assert [f["resolved"] for f in again] == [True, False]
    assert again[0]["id"] == first[0]["id"] and again[1]["id"] != first[0]["id"]
    assert again[0]["ts"] == 70.0 and again[1]["first_seen"] == 200.0


def test_book_snapshot_round_trip() -> None:
    clock = Clock([float(t) for t in range(0, 200)])
    book = IncidentBook()
    opened = observe(book, clock, 10.0)
    restored = IncidentBook.from_state(orjson.loads(orjson.dumps(book.to_state())), 60.0)
    assert observe(restored, clock, 20.0) == []
    out = restored.sweep(clock.next_ts, clock.latest)
    assert out[0]["id"] == opened[0]["id"] and out[0]["ts"] == 80.0


def test_book_restores_clear_after_from_the_deployment_not_the_snapshot() -> None:
    clock = Clock([float(t) for t in range(0, 400)])
    book = IncidentBook()
    observe(book, clock, 10.0)  # opened with clear_after 60
    state = orjson.loads(orjson.dumps(book.to_state()))
    assert all("clear_after" not in d for d in state)  # configuration stays out of snapshots
    state[0]["clear_after"] = 60.0  # as snapshots written before carried it: ignored
    restored = IncidentBook.from_state(state, lambda kind, rule: 200.0 if kind == "thermal" else 1.0)
    (inc,) = restored.open.values()
    assert inc.clear_after == 200.0
    out = restored.sweep(clock.next_ts, clock.latest)
    assert out[0]["resolved"] and out[0]["ts"] == 210.0  # last bad 10 + the deployment's 200 s
