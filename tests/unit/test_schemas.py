"""Message validation: every kind of bad message gets its own clear reason."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwatch import fast_schema, schemas
from fleetwatch.detectors.batch import GPU_COL, TelemetryBatch
from fleetwatch.schemas import MessageError
from tests.helpers.batches import assert_same_batch
from tests.helpers.messages import (
    CHECKS,
    GOOD,
    NODE_CHECK_COUNTS,
    mutated_telemetry,
    python_accepts,
    telemetry,
)
from tests.helpers.paths import REPO


@pytest.mark.parametrize("schema", sorted(GOOD))
def test_good_messages_round_trip(schema: str) -> None:
    raw = schemas.encode(GOOD[schema])
    assert schemas.decode(raw, schema) == GOOD[schema]


# Run in a fresh interpreter: imports fleetwatch.schemas and nothing else of fleetwatch's, decodes
# each message it is given (key and clock checked too), and says which fleetwatch modules loaded.
_CORE_ONLY = """
import json, sys
from fleetwatch import schemas
decoded = {}
for name, m in json.load(sys.stdin).items():
    raw = schemas.encode(m)
    key = m[schemas.KEY_FIELD[name]].encode()
    ts = m[schemas.TS_FIELD[name]]
    decoded[name] = schemas.decode(raw, name, key=key, ref_ts=ts, clock=schemas.DEFAULT_CLOCK) == m
print(json.dumps({"known": sorted(schemas.VALIDATORS), "decoded": decoded, "loaded": sorted(sys.modules)}))
"""


def test_the_core_alone_decodes_every_schema() -> None:
    """Every schema is named in the core's table (issue 24, item 7): none is learnt from importing
    its writer for a side effect, so a reader that imports only fleetwatch.schemas decodes them all."""
    r = subprocess.run(
        [sys.executable, "-c", _CORE_ONLY],
        input=json.dumps(GOOD),
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    out = json.loads(r.stdout)
    assert out["known"] == sorted(GOOD)  # GOOD holds one message of every schema
    assert out["decoded"] == {name: True for name in GOOD}
    writers = {"census", "detectors", "alerts", "pipeline", "collectors"}  # where the schemas are written
    assert {m.split(".")[1] for m in out["loaded"] if m.startswith("fleetwatch.")} & writers == set()


def test_missing_optional_fields_are_fine() -> None:
    m = telemetry(gpus=[{"index": 0}], host={})
    del m["net"]
    assert schemas.validate(m) is m


def _mutate(path: list[Any], value: Any) -> dict[str, Any]:
    return _at(copy.deepcopy(telemetry()), path, value)


@pytest.mark.parametrize(
    ("path", "value", "reason", "words"),
    [
        (["node"], KeyError, "missing_field", "telemetry.node is required"),
        (["gpus", 0, "index"], KeyError, "missing_field", "telemetry.gpus[0].index is required"),
        (["ts"], "yesterday", "wrong_type", "telemetry.ts must be a number"),
        (["seq"], 1.5, "wrong_type", "telemetry.seq must be an integer"),
        (["seq"], True, "wrong_type", "telemetry.seq must be an integer"),
        (["gpus"], {"0": {}}, "wrong_type", "telemetry.gpus must be an array"),
        (["gpus", 2, "util"], 140.0, "out_of_range", "telemetry.gpus[2].util must be <= 100"),
        (
            ["gpus", 2, "ecc_sbe_volatile"],
            -1,
            "out_of_range",
            "telemetry.gpus[2].ecc_sbe_volatile must be >= 0",
        ),
        (["gpus", 1, "power_w"], float("nan"), "out_of_range", "must be finite"),
        (["gpus", 1, "temp_c"], float("inf"), "out_of_range", "must be finite"),
        (["gpus", 3, "xids"], [79, "x"], "wrong_type", "telemetry.gpus[3].xids[1] must be an integer"),
        (["gpus", 1, "index"], 0, "out_of_range", "appears twice"),
        (["node"], "node; rm -rf /", "out_of_range", "is not a valid name"),
        (["host", "mem_used_frac"], 1.5, "out_of_range", "telemetry.host.mem_used_frac must be <= 1"),
        (["net", "ib", 0, "link_downed"], -3, "out_of_range", "telemetry.net.ib[0].link_downed must be >= 0"),
        (["net", "eth"], "eth0", "wrong_type", "telemetry.net.eth must be an array"),
        (["schema"], "telemetry/2", "unknown_schema", "unknown schema 'telemetry/2'"),
        (["gpus", 0, "index"], 64, "out_of_range", "telemetry.gpus[0].index must be <= 63"),
        (["gpus", 0, "xids"], [79] * 1025, "out_of_range", "has 1025 entries, more than 1024"),
        (["gpus"], [{"index": i % 8} for i in range(65)], "out_of_range", "has 65 entries, more than 64"),
        (["schema"], KeyError, "missing_field", "schema is required"),
    ],
)
def test_bad_telemetry_has_clear_reason(path: list[Any], value: Any, reason: str, words: str) -> None:
    with pytest.raises(MessageError) as e:
        schemas.validate(_mutate(path, value))
    assert e.value.reason == reason
    assert words in str(e.value)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"\xff\xfe{}", "not_utf8"),
        (b'{"schema": "telemetry/1", "node": "n"', "not_json"),  # truncated
        (b"[1, 2, 3]", "not_object"),
        (b'{"schema": "telemetry/1", "ts": NaN}', "not_json"),
        (b"x" * (schemas.MAX_MESSAGE_BYTES + 1), "oversized"),
    ],
)
def test_bad_bytes(raw: bytes, reason: str) -> None:
    with pytest.raises(MessageError) as e:
        schemas.decode(raw)
    assert e.value.reason == reason


def test_schema_on_wrong_topic() -> None:
    with pytest.raises(MessageError, match="does not belong on this topic"):
        schemas.decode(schemas.encode(GOOD["job/1"]), schemas.TELEMETRY)


@pytest.mark.parametrize(
    ("ref_ts", "accepted"),
    [
        (1000.0, True),
        (940.0, True),  # 60 s ahead of its arrival: the limit
        (939.0, False),  # 61 s ahead: a clock in the future
        (1600.0, True),  # 600 s late (spooled through an outage): the limit
        (1601.0, False),
    ],
)
def test_clock_skew_is_judged_against_the_messages_arrival(ref_ts: float, accepted: bool) -> None:
    raw = schemas.encode(telemetry(ts=1000.0))
    clock = schemas.ClockLimits(ahead_s=60, behind_s=600)
    if accepted:
        assert schemas.decode(raw, ref_ts=ref_ts, clock=clock)["ts"] == 1000.0
        return
    with pytest.raises(MessageError) as e:
        schemas.decode(raw, ref_ts=ref_ts, clock=clock)
    assert e.value.reason == "clock_skew"
    assert e.value.skew_s == 1000.0 - ref_ts


@pytest.mark.parametrize(
    ("schema", "field", "value", "reason"),
    [
        ("job/1", "state", "exploded", "out_of_range"),
        ("job/1", "nodes", "gpu-node-0001", "wrong_type"),
        ("step/1", "step_time_s", -0.1, "out_of_range"),
        ("step/1", "rank", KeyError, "missing_field"),
        ("truth/1", "end_ts", 1.0, "out_of_range"),  # ends before its onset
        ("truth/1", "fault", 79, "wrong_type"),
        ("finding/1", "kind", "Meteor strike", "out_of_range"),
        ("finding/1", "ts", 1.0, "out_of_range"),  # before its first_seen
        ("node/1", "last_seen", 1.0, "out_of_range"),
        ("drain/1", "reason", "two\nlines", "out_of_range"),
        ("drain/1", "findings", ["x"] * 257, "out_of_range"),
        ("drain_result/1", "request_signature", "ab", "out_of_range"),
        ("drain_result/1", "outcome", "shrugged", "out_of_range"),
        # a list or an object where a name from a fixed set belongs: a clear error, not TypeError
        ("finding/1", "kind", ["xid"], "wrong_type"),
        ("finding/1", "severity", {}, "wrong_type"),
        ("drain/1", "action", ["drain"], "wrong_type"),
        ("drain/1", "severity", [], "wrong_type"),
        ("drain_result/1", "outcome", {"a": 1}, "wrong_type"),
    ],
)
def test_bad_other_schemas(schema: str, field: str, value: Any, reason: str) -> None:
    m = copy.deepcopy(GOOD[schema])
    if value is KeyError:
        del m[field]
    else:
        m[field] = value
    with pytest.raises(MessageError) as e:
        schemas.validate(m)
    assert e.value.reason == reason


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode()))
def test_decoder_never_fails_other_than_message_error(raw: bytes) -> None:
    try:
        schemas.decode(raw)
    except MessageError as e:
        assert e.reason in schemas.REASONS


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(GOOD)), st.data())
def test_mutated_good_messages_fail_cleanly(schema: str, data: st.DataObject) -> None:
    m = copy.deepcopy(GOOD[schema])
    key = data.draw(st.sampled_from(sorted(m)))
    m[key] = data.draw(json_values)
    try:
        schemas.validate(m)
    except MessageError as e:
        assert e.reason in schemas.REASONS


field_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 300),
    st.floats(-100, 400, allow_nan=False),
    st.text(max_size=6),
    st.lists(st.integers(-2, 100), max_size=3),
    st.just(1e308),
    st.just(-0.0),
    # the edges of the declared ranges: NVML's u32 / u64 "not available", int64, beyond
    st.sampled_from([2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1]),
    st.text(alphabet="ab", min_size=schemas.MAX_ID_LEN, max_size=schemas.MAX_ID_LEN + 1),
)


def _beyond_int64(v: Any) -> bool:
    """msgspec's integer bounds stop at int64: a counter above it is left to the Python validator."""
    if isinstance(v, dict):
        return any(_beyond_int64(x) for x in v.values())
    if isinstance(v, list):
        return any(_beyond_int64(x) for x in v)
    return isinstance(v, int) and not isinstance(v, bool) and v > schemas.I64_MAX


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_fast_validator_agrees_with_the_python_one(data: st.DataObject) -> None:
    """fleetwatch/fast_schema.py (the hot path) must accept exactly what schemas.validate accepts."""
    m = mutated_telemetry(data, field_values)
    raw = json.dumps(m).encode()
    accepted = python_accepts(json.loads(raw))
    fast = fast_schema.telemetry_ok(raw)
    if fast != accepted:  # the one difference: msgspec's int64 bounds; decode() takes it as a dict
        assert accepted and _beyond_int64(m), raw[:300]
        assert type(schemas.decode(raw, schemas.TELEMETRY, struct=True)) is dict
        return
    if accepted:  # and the struct the worker's node stage reads holds what the dict holds
        struct = schemas.decode(raw, schemas.TELEMETRY, struct=True)
        assert type(struct) is not dict
        assert_same_batch(
            TelemetryBatch.from_messages([json.loads(raw)]), TelemetryBatch.from_structs([struct])
        )


CLOCK = schemas.ClockLimits(ahead_s=3600, behind_s=3600)


def _outcome(raw: Any, struct: bool) -> tuple[str, Any]:
    try:
        m = schemas.decode(raw, schemas.TELEMETRY, ref_ts=1_764_000_000.0, clock=CLOCK, struct=struct)
    except MessageError as e:
        return "error", (e.reason, e.detail)
    return "ok", m


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                schemas.encode(telemetry()),
                schemas.encode(telemetry(ts=1.0)),  # clock skew
                schemas.encode(telemetry(node="", seq=-1)),
                schemas.encode(GOOD["job/1"]),  # wrong topic
                b"\xff\xfe{}",
                b'{"schema": "telemetry/1"',
                b"x" * (schemas.MAX_MESSAGE_BYTES + 1),
                None,
            ]
        )
        | st.binary(max_size=60),
        max_size=12,
    ),
    st.booleans(),
)
def test_decode_batch_equals_decode_one_by_one(raws: list[Any], struct: bool) -> None:
    """The worker decodes a polled batch at once: same messages, same errors, same order."""
    ok, bad = schemas.decode_batch(
        raws, schemas.TELEMETRY, ref_ts=1_764_000_000.0, clock=CLOCK, struct=struct
    )
    want = [_outcome(r, struct) for r in raws]
    assert [(i, (e.reason, e.detail)) for i, e in bad] == [
        (i, v) for i, (k, v) in enumerate(want) if k == "error"
    ]
    wanted_ok = [v for k, v in want if k == "ok"]
    assert len(ok) == len(wanted_ok)
    for got, exp in zip(ok, wanted_ok, strict=True):
        assert type(got) is type(exp)
        assert (got if type(got) is dict else msgspec.to_builtins(got)) == (
            exp if type(exp) is dict else msgspec.to_builtins(exp)
        )


# Each GPU counter's NVML field width (nvml.h): unsigned int or unsigned long long.
_NVML_U32 = {
    "retired_pages",  # nvmlDeviceGetRetiredPages: unsigned int *pageCount
    "remapped_rows_correctable",  # nvmlDeviceGetRemappedRows: unsigned int *corrRows, *uncRows,
    "remapped_rows_uncorrectable",  # *isPending, *failureOccurred
    "remapped_rows_pending",
    "remapped_rows_failure",
    "pcie_replay",  # nvmlDeviceGetPcieReplayCounter: unsigned int *value
    "nvlink_links_active",  # a count of links, numbered by an unsigned int
}
_NVML_U64 = {
    "throttle_reasons",  # nvmlDeviceGetCurrentClocksEventReasons: unsigned long long *
    "ecc_sbe_volatile",  # nvmlDeviceGetTotalEccErrors: unsigned long long *eccCounts
    "ecc_dbe_volatile",
    "ecc_sbe_aggregate",
    "ecc_dbe_aggregate",
    "nvlink_crc_errors",  # nvmlDeviceGetNvLinkErrorCounter: unsigned long long *counterValue
    "nvlink_replay_errors",
}


def test_gpu_counter_ranges_follow_their_nvml_types_in_every_decoder() -> None:
    """A value its NVML field cannot hold (retired_pages near 2**64: 32-bit) is out of range for
    the Python validator, the compiled decoder and the worker's scanner alike; the field's own
    "not available" (-1 in its C type) is valid and absent."""
    from fleetwatch import telemetry_scan

    integer_fields = {
        k for k, c in schemas.GPU_FIELDS.items() if c in schemas._RANGES and schemas._RANGES[c][2]
    }
    # every integer GPU field has its NVML width here, or a narrower range of its own (below)
    assert integer_fields == _NVML_U32 | _NVML_U64 | _LINK_FIELDS["gpus"].keys()
    for field in sorted(_NVML_U32 | _NVML_U64):
        hi = schemas.U32_MAX if field in _NVML_U32 else schemas.U64_MAX
        assert schemas.NVML_NOT_AVAILABLE.get(field, hi) == hi, field
        for value, valid in (
            (0, True),
            (hi, True),
            (hi + 1, False),
            (2**32, hi > 2**32),
            (2**64 - 2, hi > 2**32),
        ):
            raw = json.dumps(telemetry(gpus=[{"index": 0, field: value}])).encode()
            assert python_accepts(json.loads(raw)) == valid, (field, value)
            if value <= schemas.I64_MAX:  # msgspec's integer bounds stop at int64 (see above)
                assert fast_schema.telemetry_ok(raw) == valid, (field, value)
            if not valid:
                assert telemetry_scan.scan([raw]).taken.tolist() == [], (field, value)
                with pytest.raises(MessageError) as e:
                    schemas.decode(raw, schemas.TELEMETRY)
                assert e.value.reason == "out_of_range" and field in e.value.detail
            elif value < 10**18:  # the scanner reads up to 18 digits and leaves longer ones
                assert telemetry_scan.scan([raw]).taken.tolist() == [0], (field, value)
    # the 32-bit sentinel is absent in the columns the detectors read, not a count of 2**32 - 1
    batch = TelemetryBatch.from_messages([telemetry(gpus=[{"index": 0, "retired_pages": schemas.U32_MAX}])])
    assert np.isnan(batch.gpu[..., GPU_COL["retired_pages"]]).all()


# Fields of the PCIe link, the recovery action and the link counters (collectors/nvml.py,
# collectors/net.py), by where they are, with their range: generation 1..15 (the Link
# Capabilities speed field is 4 bits), width 0..32 lanes, recovery action 0..255 (an enum), the
# counters u64.
_LINK = {
    "pcie_link_gen": (1, schemas.MAX_PCIE_GEN),
    "pcie_link_gen_max": (1, schemas.MAX_PCIE_GEN),
    "pcie_link_width": (0, schemas.MAX_PCIE_WIDTH),
    "pcie_link_width_max": (0, schemas.MAX_PCIE_WIDTH),
}
_IB_COUNTERS = (
    "link_error_recovery",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "rcv_remote_physical_errors",
    "xmit_wait",
)
_LINK_FIELDS: dict[str, dict[str, tuple[int, int]]] = {
    "gpus": {**_LINK, "recovery_action": (0, 255)},
    "ib": {**_LINK, **dict.fromkeys(_IB_COUNTERS, (0, schemas.U64_MAX))},
    "eth": dict.fromkeys(("carrier_changes", "carrier_up_count", "carrier_down_count"), (0, schemas.U64_MAX)),
}


def _with(where: str, field: str, value: Any) -> dict[str, Any]:
    m = telemetry()
    target = m["gpus"][0] if where == "gpus" else m["net"][where][0]
    target[field] = value
    return m


@pytest.mark.parametrize(("where", "field"), [(w, f) for w, fields in _LINK_FIELDS.items() for f in fields])
def test_link_fields_have_their_ranges_in_every_decoder(where: str, field: str) -> None:
    """Each decoder (the Python validator, the compiled one, the worker's scanner) takes the field's
    range and refuses what is past it or not an integer, naming the field."""
    from fleetwatch import telemetry_scan

    assert field in {"gpus": schemas.GPU_FIELDS, "ib": schemas.IB_FIELDS, "eth": schemas.ETH_FIELDS}[where]
    lo, hi = _LINK_FIELDS[where][field]
    for value, reason in (
        (lo, None),
        (hi, None),
        (lo - 1, "out_of_range"),
        (hi + 1, "out_of_range"),
        (float(lo) + 1, "wrong_type"),  # an integer field: 5.0 is not 5
        (True, "wrong_type"),
        ("5", "wrong_type"),
    ):
        raw = json.dumps(_with(where, field, value)).encode()
        assert python_accepts(json.loads(raw)) == (reason is None), (field, value)
        if isinstance(value, bool) or not isinstance(value, int) or value <= schemas.I64_MAX:
            assert fast_schema.telemetry_ok(raw) == (reason is None), (field, value)
        big = isinstance(value, int) and value >= 10**18  # the scanner reads up to 18 digits, leaves more
        want = [0] if reason is None and not big else []
        assert telemetry_scan.scan([raw]).taken.tolist() == want, (field, value)
        if reason is not None:
            with pytest.raises(MessageError) as e:
                schemas.decode(raw, schemas.TELEMETRY)
            assert e.value.reason == reason and field in e.value.detail, (field, value, e.value)


def test_link_fields_reach_the_detectors_columns_and_are_no_gpu_counters() -> None:
    """A message with every new field is read into the same columns from dicts, structs and the
    scanner; the link state and the recovery action say what holds now, so no detector takes
    them for cumulative counters (GPU_COUNTERS)."""
    from fleetwatch import telemetry_scan
    from fleetwatch.detectors.batch import IB_COL

    assert not set(_LINK_FIELDS["gpus"]) & set(schemas.GPU_COUNTERS)
    m = telemetry()
    values = {
        where: {f: hi if hi <= 255 else 12345 for f, (_lo, hi) in fields.items()}
        for where, fields in _LINK_FIELDS.items()
    }
    for g in m["gpus"]:
        g.update(values["gpus"], pcie_link_gen=4, pcie_link_width=8)  # an A100 that trained Gen4 x8
    m["net"]["ib"][0].update(values["ib"])
    m["net"]["eth"][0].update(values["eth"])
    raw = schemas.encode(m)
    assert schemas.decode(raw, schemas.TELEMETRY) == m
    from_dicts = TelemetryBatch.from_messages([m])
    from_structs = TelemetryBatch.from_messages([schemas.decode(raw, schemas.TELEMETRY, struct=True)])
    assert_same_batch(from_dicts, from_structs)
    gpu = from_dicts.gpu[0, 0]
    assert (gpu[GPU_COL["pcie_link_gen"]], gpu[GPU_COL["pcie_link_gen_max"]]) == (4, schemas.MAX_PCIE_GEN)
    assert (gpu[GPU_COL["pcie_link_width"]], gpu[GPU_COL["recovery_action"]]) == (8, 255)
    assert from_dicts.ib[0, IB_COL["xmit_wait"]] == 12345
    scanned = telemetry_scan.scan([raw])
    assert scanned.taken.tolist() == [0]  # the common message stays on the worker's fast path
    cols = telemetry_scan.GPU_COLUMNS
    assert scanned.entries[0, cols.index("recovery_action")] == 255
    assert scanned.ib[0, telemetry_scan.IB_COLUMNS.index("pcie_link_width_max")] == schemas.MAX_PCIE_WIDTH


def test_ethernet_fields_reach_the_same_columns_from_every_decoder() -> None:
    """The Ethernet interfaces the detectors now judge (errors, carrier changes, operstate) are
    read into the same columns from dicts, structs and the scanner, the largest counter the
    scanner reads (18 digits; longer ones it leaves to the decoders) included."""
    from fleetwatch import telemetry_scan
    from fleetwatch.detectors.batch import ETH_COL, ETH_NUMERIC

    m = telemetry()
    m["net"]["eth"] = [
        {"iface": "eno1", "state": "up", **dict.fromkeys(ETH_NUMERIC, 12345)},
        {"iface": "eno2", "state": "lowerlayerdown", "rx_errors": 10**18 - 1, "carrier_changes": 0},
    ]
    raw = schemas.encode(m)
    from_dicts = TelemetryBatch.from_messages([m])
    from_structs = TelemetryBatch.from_messages([schemas.decode(raw, schemas.TELEMETRY, struct=True)])
    sc = telemetry_scan.scan([raw])
    assert sc.taken.tolist() == [0]
    from_scan = TelemetryBatch.from_scan(sc)
    for b in (from_structs, from_scan):
        assert_same_batch(from_dicts, b, skip=("received",))
    assert from_dicts.eth_iface == ["eno1", "eno2"] and from_dicts.eth_up.tolist() == [1.0, 0.0]
    assert from_dicts.eth[1, ETH_COL["rx_errors"]] == float(10**18 - 1)
    assert (from_dicts.eth[0] == 12345).all()


# ---------------------------------------------------------------- node checks (issue 25, item 3)


def checked() -> dict[str, Any]:
    """A sample of a node whose configured mounts and block devices fail, as the host source sends it."""
    m = telemetry()
    m["host"].update(NODE_CHECK_COUNTS)
    m["checks"] = copy.deepcopy(CHECKS)
    return m


def test_node_checks_are_read_alike_by_every_decoder() -> None:
    m = checked()
    raw = schemas.encode(m)
    assert schemas.decode(raw, schemas.TELEMETRY) == m
    struct = fast_schema.decode_telemetry(raw)
    assert struct is not None
    hung = struct.checks.mounts[0]
    assert (hung.path, hung.problem, hung.fstype, hung.took_s) == ("/lustre", "hung", "lustre", 31.5)
    assert struct.checks.mounts[2].path == "/data sets/ü"
    assert [d.name for d in struct.checks.blockdevs] == ["nvme1n1", "sda"]
    assert_same_batch(TelemetryBatch.from_messages([m]), TelemetryBatch.from_structs([struct]))
    # one list alone, or none: both optional
    for only in ({"mounts": CHECKS["mounts"]}, {"blockdevs": CHECKS["blockdevs"]}, {}):
        assert fast_schema.telemetry_ok(schemas.encode({**m, "checks": only}))
        schemas.validate({**m, "checks": only})


def _at(m: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    """`m` with the value at `path` set (or deleted, for KeyError)."""
    target = m
    for p in path[:-1]:
        target = target[p]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return m


@pytest.mark.parametrize(
    ("path", "value", "reason", "words"),
    [
        (["checks"], [], "wrong_type", "telemetry.checks must be an object"),
        (["checks", "mounts"], {"path": "/x"}, "wrong_type", "telemetry.checks.mounts must be an array"),
        (["checks", "mounts", 1], "/home", "wrong_type", "telemetry.checks.mounts[1] must be an object"),
        (
            ["checks", "mounts", 0, "path"],
            KeyError,
            "missing_field",
            "telemetry.checks.mounts[0].path is required",
        ),
        (["checks", "mounts", 0, "problem"], KeyError, "missing_field", "mounts[0].problem is required"),
        (
            ["checks", "mounts", 0, "path"],
            7,
            "wrong_type",
            "telemetry.checks.mounts[0].path must be a string",
        ),
        (["checks", "mounts", 0, "path"], "lustre", "out_of_range", "is not an absolute path"),
        (["checks", "mounts", 0, "path"], "/a\nb", "out_of_range", "is not an absolute path"),
        (["checks", "mounts", 0, "path"], "/\x1b[31mred", "out_of_range", "is not an absolute path"),
        (["checks", "mounts", 0, "path"], "/x\x85", "out_of_range", "is not an absolute path"),
        (["checks", "mounts", 0, "path"], "/x\u2028y", "out_of_range", "is not an absolute path"),
        # a path that is not UTF-8 (a lone surrogate): msgspec refuses the JSON itself (as
        # strict_json does in decode()), anywhere in a message, so it stays out of the fuzz below
        (["checks", "mounts", 0, "path"], "/x\udc80", "out_of_range", "is not an absolute path"),
        (
            ["checks", "mounts", 0, "path"],
            "/" + "a" * 256,
            "out_of_range",
            "has 257 characters, more than 256",
        ),
        (["checks", "mounts", 0, "problem"], None, "wrong_type", "mounts[0].problem must be a string"),
        (["checks", "mounts", 0, "problem"], "x" * 129, "out_of_range", "more than 128"),
        (["checks", "mounts", 0, "fstype"], ["nfs4"], "wrong_type", "mounts[0].fstype must be a string"),
        (["checks", "mounts", 0, "error"], "E" * 129, "out_of_range", "more than 128"),
        (["checks", "mounts", 0, "took_s"], -1.0, "out_of_range", "mounts[0].took_s must be >= 0"),
        (["checks", "mounts", 0, "took_s"], "slow", "wrong_type", "mounts[0].took_s must be a number"),
        (["checks", "mounts", 0, "took_s"], float("inf"), "out_of_range", "must be finite"),
        (
            ["checks", "mounts"],
            [{"path": "/x", "problem": "missing"}] * 65,
            "out_of_range",
            "telemetry.checks.mounts has 65 entries, more than 64",
        ),
        (["checks", "blockdevs", 0, "name"], 0, "wrong_type", "blockdevs[0].name must be a string"),
        (["checks", "blockdevs", 0, "name"], KeyError, "missing_field", "blockdevs[0].name is required"),
        (["checks", "blockdevs", 0], "nvme0n1", "wrong_type", "blockdevs[0] must be an object"),
        (
            ["checks", "blockdevs"],
            [{"name": "sda", "problem": "missing"}] * 65,
            "out_of_range",
            "telemetry.checks.blockdevs has 65 entries, more than 64",
        ),
        (["host", "mounts_hung"], -1, "out_of_range", "telemetry.host.mounts_hung must be >= 0"),
        (["host", "mounts_missing"], 1.5, "wrong_type", "telemetry.host.mounts_missing must be an integer"),
        (["host", "blockdevs_readonly"], True, "wrong_type", "blockdevs_readonly must be an integer"),
        (["host", "blockdevs_missing"], "1", "wrong_type", "blockdevs_missing must be an integer"),
        (["host", "inodes_used_frac"], 1.5, "out_of_range", "telemetry.host.inodes_used_frac must be <= 1"),
        (["host", "mounts_slowest_s"], -0.5, "out_of_range", "mounts_slowest_s must be >= 0"),
    ],
)
def test_hostile_node_checks_are_refused_by_every_decoder(
    path: list[Any], value: Any, reason: str, words: str
) -> None:
    m = _at(checked(), path, value)
    with pytest.raises(MessageError) as e:
        schemas.validate(m)
    assert e.value.reason == reason
    assert words in str(e.value)
    assert not fast_schema.telemetry_ok(json.dumps(m).encode())


check_values = field_values | st.sampled_from(
    [
        "/",
        "/scratch",
        "/a b/ü",
        "/\U0001f600",
        "/x\xa0",
        "relative",
        "/a\nb",
        "/x\x7f",
        "/x\x9f",
        "/x\u2029",
        "/" + "a" * 255,
        "/" + "a" * 256,
        "",
        [],
        [{"path": "/a", "problem": "missing"}],
        [{"name": "sda", "problem": "readonly"}],
        [{"path": "b", "problem": "missing"}],
        {"mounts": []},
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_fast_validator_agrees_on_node_checks(data: st.DataObject) -> None:
    """fast_schema's `checks` and node-check host fields accept exactly what schemas.validate does."""
    m = checked()
    containers = [m, m["checks"], m["host"], *m["checks"]["mounts"], *m["checks"]["blockdevs"]]
    for _ in range(data.draw(st.integers(1, 3))):
        target = data.draw(st.sampled_from(containers))
        key = data.draw(st.sampled_from([*sorted(target if target is not m else ["checks"]), "extra_field"]))
        if data.draw(st.booleans()):
            target.pop(key, None)
        else:
            target[key] = data.draw(check_values)
    raw = json.dumps(m).encode()
    accepted = python_accepts(json.loads(raw))
    if fast_schema.telemetry_ok(raw) != accepted:
        assert accepted and _beyond_int64(m), raw[:300]
