"""drain/1 (alerts/drain_request.py): deterministic ids, HMAC signatures, validation, key loading."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from fleetwatch import schemas
from fleetwatch.alerts import drain_request as dr
from fleetwatch.alerts import drain_result
from tests.helpers.paths import REPO

KEY = b"k" * 32


def request(**kw: object) -> dict[str, object]:
    args: dict[str, object] = dict(
        node="gpu-node-01",
        action="drain",
        reason="fleetwatch: XID 79",
        severity="critical",
        findings=["b" * 32, "a" * 32],
        issued_at=1_800_000_000.25,
        key=KEY,
    )
    args.update(kw)
    return dr.make_request(**args)  # type: ignore[arg-type]


def test_request_id_is_deterministic_in_node_action_and_findings_only() -> None:
    a, b = request(), request(issued_at=1_900_000_000.0, reason="other words", findings=["a" * 32, "b" * 32])
    assert a["request_id"] == b["request_id"]  # same node, action, findings (order-free)
    assert a["signature"] != b["signature"]  # but a different message, signed as such
    assert request(action="resume")["request_id"] != a["request_id"]
    assert request(node="gpu-node-02")["request_id"] != a["request_id"]
    assert request(findings=["c" * 32])["request_id"] != a["request_id"]


def test_signature_verifies_after_the_wire_and_the_decoder() -> None:
    msg = request()
    back = schemas.decode(schemas.encode(msg), dr.DRAIN)  # bytes on Kafka and back
    assert dr.verify(back, KEY)
    assert back["findings"] == sorted(back["findings"])


def test_forged_signature_wrong_key_and_tampering_are_refused() -> None:
    msg = request()
    assert not dr.verify(msg, b"x" * 32)  # signed with another key
    forged = {**msg, "signature": "0" * 64}
    assert not dr.verify(forged, KEY)
    for field, value in (
        ("node", "gpu-node-02"),
        ("action", "resume"),
        ("reason", "fleetwatch: nothing"),
        ("findings", ["a" * 32]),
        ("issued_at", 1.0),
    ):
        tampered = {**msg, field: value}
        dr.validate_drain(tampered)  # still well-formed ...
        assert not dr.verify(tampered, KEY), field  # ... but no longer what was signed
    unsigned = {k: v for k, v in msg.items() if k != "signature"}
    with pytest.raises(schemas.MessageError) as e:
        dr.validate_drain(unsigned)
    assert e.value.reason == "missing_field"
    assert not dr.verify(unsigned, KEY)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"action": "reboot"}, "out_of_range"),
        ({"node": "gpu-node-01; rm -rf /"}, "out_of_range"),
        ({"node": "-n"}, "out_of_range"),  # would read as an option if it ever reached argv
        ({"reason": "two\nlines"}, "out_of_range"),
        ({"reason": ""}, "out_of_range"),
        ({"severity": "fatal"}, "out_of_range"),
        ({"findings": "abc"}, "wrong_type"),
        ({"request_id": "xyz"}, "out_of_range"),
        ({"signature": "ABC"}, "out_of_range"),
        ({"issued_at": -1}, "out_of_range"),
        ({"extra": 1}, "out_of_range"),
    ],
)
def test_malformed_requests_are_rejected_with_a_reason(change: dict[str, object], reason: str) -> None:
    with pytest.raises(schemas.MessageError) as e:
        schemas.decode(orjson.dumps({**request(), **change}), dr.DRAIN)
    assert e.value.reason == reason


def test_key_from_env_or_file_and_never_in_the_error(tmp_path: Path) -> None:
    assert dr.load_key(env={dr.KEY_ENV: "s3cret-s3cret-s3cret"}) == b"s3cret-s3cret-s3cret"
    f = tmp_path / "key"
    f.write_text("file-key-file-key-file-key\n")
    assert dr.load_key(str(f), env={}) == b"file-key-file-key-file-key"
    with pytest.raises(dr.DrainKeyError) as e:
        dr.load_key(env={dr.KEY_ENV: "short-secret"})
    assert "short-secret" not in str(e.value)
    with pytest.raises(dr.DrainKeyError):
        dr.load_key(str(tmp_path / "missing"), env={})


# ---------------------------------------------------------------- issue 15: bounded requests, results


def test_a_node_with_more_findings_than_the_limit_gets_a_request_every_adapter_accepts() -> None:
    # One sample with 256 IB ports down plus an XID 79 opens 257 findings on one node.
    ids = [f"{i:032x}" for i in range(dr.MAX_FINDINGS + 1)]
    msg = request(findings=ids, reason="fleetwatch: IB link down, XID 79")
    assert msg["findings"] == sorted(ids)[: dr.MAX_FINDINGS]
    assert msg["reason"] == f"fleetwatch: IB link down, XID 79 ({dr.MAX_FINDINGS} of 257 findings listed)"
    assert msg["request_id"] == dr.request_id("gpu-node-01", "drain", ids)  # the id covers all of them
    # No new field: an adapter of the previous release (which refuses unknown fields) takes it too.
    assert set(msg) == {*schemas.DRAIN_FIELDS, "signature"}
    back = schemas.decode(schemas.encode(msg), dr.DRAIN)
    assert dr.verify(back, KEY)
    long_reason = request(findings=ids, reason="x" * 1000)["reason"]
    assert len(long_reason) == dr.MAX_REASON and long_reason.endswith("of 257 findings listed)")


def test_a_reason_built_from_odd_evidence_is_made_one_line_instead_of_failing() -> None:
    msg = request(reason="fleetwatch: XID 79\r\nrm -rf /\0")
    assert msg["reason"] == "fleetwatch: XID 79 rm -rf /"
    assert request(reason="\n")["reason"] == "fleetwatch"


def test_drain_results_are_signed_and_validated() -> None:
    r = drain_result.make_result(
        request_id="a" * 32,
        node="gpu-node-01",
        action="drain",
        outcome="rejected_stale",
        detail="issued 2592000 s ago\n(limit 600 s)",
        ts=1_800_000_000.0,
        request_signature="c" * 64,
        key=KEY,
    )
    back = schemas.decode(schemas.encode(r), drain_result.DRAIN_RESULT)
    assert dr.verify(back, KEY) and back["detail"] == "issued 2592000 s ago (limit 600 s)"
    assert not dr.verify({**back, "outcome": "executed"}, KEY)  # a rewritten outcome is not ours
    assert not dr.verify(back, b"x" * 32)
    assert back["request_signature"] == "c" * 64
    assert not dr.verify({**back, "request_signature": "d" * 64}, KEY)  # bound to its request
    unbound = {k: v for k, v in back.items() if k not in ("request_signature", "signature")}
    drain_result.validate_result({**unbound, "signature": "e" * 64})  # an earlier release's: valid
    changes = ({"outcome": "maybe"}, {"request_id": "xyz"}, {"node": "a b"}, {"extra": 1})
    for change in (*changes, {"request_signature": "XYZ"}, {"request_signature": 7}):
        with pytest.raises(schemas.MessageError):
            drain_result.validate_result({**back, **change})


@pytest.mark.parametrize("kind", ["fifo", "endless", "directory", "huge"])
def test_a_key_file_that_is_no_small_regular_file_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    """A FIFO blocked the reader forever and /dev/zero never ended: every key loader (the drain
    key, detect's) refuses what is not a regular file of at most 4 KiB, and says so in one line
    through the real command."""
    path = tmp_path / "key"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "endless":
        path = Path("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_bytes(b"k" * 5000)
    with pytest.raises(dr.DrainKeyError):
        dr.load_key(str(path), env={})
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleetwatch.cli",
            "detect",
            "--bootstrap",
            "127.0.0.1:1",
            "--census-key-file",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert str(path) in r.stderr
