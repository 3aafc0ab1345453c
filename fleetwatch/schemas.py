"""Message schemas of DESIGN.md ("Messages") and their validation.

Messages travel as JSON objects and are handled as plain dicts (cheap to build and to
serialise). `decode()` turns raw Kafka bytes into a validated dict or raises
`MessageError`, whose `reason` is one of `REASONS`: a short, fixed label that the
dead-letter topic and the rejected-message counters use, so the label set stays bounded.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

TELEMETRY = "telemetry/1"
JOB = "job/1"
STEP = "step/1"
TRUTH = "truth/1"
NODE_FEATURES = "nodefeatures/1"  # internal: per-node signals re-keyed by job for peer comparison

MAX_MESSAGE_BYTES = 1 << 20  # a telemetry/1 message of 8 GPUs is ~3 KiB; 1 MiB is a generous cap
# Bounds on list sizes and GPU indices: detectors size arrays by them, so one message claiming GPU
# index 10^9 must be rejected, not allocated. Real nodes have 4-16 GPUs and a few NICs.
MAX_GPU_INDEX = 63
MAX_GPUS = 64
MAX_PORTS = 256
MAX_XIDS = 1024  # XID events of one GPU in one sample (the NVML collector drains at most 1024)

REASONS = (
    "oversized",
    "not_utf8",
    "not_json",
    "not_object",
    "unknown_schema",
    "missing_field",
    "wrong_type",
    "out_of_range",
    "clock_skew",
)

# Node and job names end up in Kafka keys, Prometheus labels and scontrol argv: keep them plain.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,252}$")


class MessageError(ValueError):
    """A message that cannot be accepted; `reason` is one of REASONS."""

    def __init__(self, reason: str, detail: str) -> None:
        assert reason in REASONS, reason
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


# ---------------------------------------------------------------- field checks


def _number(where: str, value: Any, lo: float | None = None, hi: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MessageError("wrong_type", f"{where} must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise MessageError("out_of_range", f"{where} must be finite, got {value}")
    if lo is not None and value < lo:
        raise MessageError("out_of_range", f"{where} must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise MessageError("out_of_range", f"{where} must be <= {hi}, got {value}")


def _integer(where: str, value: Any, lo: int | None = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise MessageError("wrong_type", f"{where} must be an integer, got {type(value).__name__}")
    if lo is not None and value < lo:
        raise MessageError("out_of_range", f"{where} must be >= {lo}, got {value}")


def _string(where: str, value: Any) -> None:
    if not isinstance(value, str):
        raise MessageError("wrong_type", f"{where} must be a string, got {type(value).__name__}")


def _name(where: str, value: Any) -> None:
    _string(where, value)
    if not NAME_RE.match(value):
        raise MessageError("out_of_range", f"{where} {value!r} is not a valid name ({NAME_RE.pattern})")


def _object(where: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise MessageError("wrong_type", f"{where} must be an object, got {type(value).__name__}")
    return value


def _list(where: str, value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise MessageError("wrong_type", f"{where} must be an array, got {type(value).__name__}")
    return value


def _required(obj: Mapping[str, Any], where: str, fields: tuple[str, ...]) -> None:
    for f in fields:
        if f not in obj:
            raise MessageError("missing_field", f"{where}.{f} is required")


Check = Callable[[str, Any], None]


def _pct(where: str, v: Any) -> None:
    _number(where, v, 0, 100)


def _frac(where: str, v: Any) -> None:
    _number(where, v, 0, 1)


def _nonneg(where: str, v: Any) -> None:
    _number(where, v, 0)


def _counter(where: str, v: Any) -> None:
    _integer(where, v, 0)


def _temp(where: str, v: Any) -> None:
    _number(where, v, -60, 250)


def _any_name(where: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, str | int):
        raise MessageError("wrong_type", f"{where} must be a string or integer")


def _bounded_list(where: str, v: Any, max_len: int) -> list[Any]:
    items = _list(where, v)
    if len(items) > max_len:
        raise MessageError("out_of_range", f"{where} has {len(items)} entries, more than {max_len}")
    return items


def _xids(where: str, v: Any) -> None:
    for i, x in enumerate(_bounded_list(where, v, MAX_XIDS)):
        _integer(f"{where}[{i}]", x, 0)


# Optional fields: absent is fine ("missing fields are absent, never invented"); present must be valid.
GPU_FIELDS: dict[str, Check] = {
    "uuid": _string,
    "util": _pct,
    "mem_util": _pct,
    "mem_used_mib": _nonneg,
    "temp_c": _temp,
    "power_w": _nonneg,
    "sm_clock_mhz": _nonneg,
    "throttle_reasons": _counter,
    "ecc_sbe_volatile": _counter,
    "ecc_dbe_volatile": _counter,
    "ecc_sbe_aggregate": _counter,
    "ecc_dbe_aggregate": _counter,
    "retired_pages": _counter,
    "remapped_rows_pending": _counter,
    "remapped_rows_failure": _counter,
    "nvlink_crc_errors": _counter,
    "nvlink_replay_errors": _counter,
    "pcie_replay": _counter,
    "xids": _xids,
}
GPU_COUNTERS = tuple(k for k, c in GPU_FIELDS.items() if c is _counter and k != "throttle_reasons")

HOST_FIELDS: dict[str, Check] = {
    "cpu_util": _pct,
    "mem_used_frac": _frac,
    "load1": _nonneg,
    "disk_used_frac": _frac,
    "procs_d_state": _counter,
}

IB_FIELDS: dict[str, Check] = {
    "device": _string,
    "port": _any_name,
    "state": _string,
    "rate_gbps": _nonneg,
    "symbol_errors": _counter,
    "link_downed": _counter,
    "rcv_errors": _counter,
    "xmit_discards": _counter,
    "tx_bytes": _counter,
    "rx_bytes": _counter,
}

ETH_FIELDS: dict[str, Check] = {
    "iface": _string,
    "state": _string,
    "rx_bytes": _counter,
    "tx_bytes": _counter,
    "rx_errors": _counter,
    "tx_errors": _counter,
    "rx_dropped": _counter,
    "tx_dropped": _counter,
}


_BIG = 1.7976931348623157e308  # the largest float: `inf <= _BIG` is False, and NaN fails every comparison
# Numeric checks as (lo, hi, integers only), for the fast path below.
_RANGES: dict[Check, tuple[float, float, bool]] = {
    _pct: (0, 100, False),
    _frac: (0, 1, False),
    _nonneg: (0, _BIG, False),
    _counter: (0, _BIG, True),
    _temp: (-60, 250, False),
}
_FAST: dict[int, dict[str, tuple[float, float, bool]]] = {}


def _fields(where: str, obj: Mapping[str, Any], spec: Mapping[str, Check]) -> None:
    # Hot path (every GPU of every sample): one type test and one range test per numeric field.
    # Anything that fails it goes through the field's own check, which names the problem.
    fast = _FAST.get(id(spec))
    if fast is None:
        fast = _FAST[id(spec)] = {k: _RANGES[c] for k, c in spec.items() if c in _RANGES}
    for key, value in obj.items():
        rng = fast.get(key)
        if rng is not None:
            t = type(value)
            if (t is int or (t is float and not rng[2])) and rng[0] <= value <= rng[1]:
                continue
        check = spec.get(key)
        if check is not None:
            check(f"{where}.{key}", value)
        # Unknown keys are tolerated: producers may extend messages (DESIGN.md, "extend freely").


def _ts(where: str, v: Any) -> None:
    _number(where, v, 0)


# ---------------------------------------------------------------- per-schema validators


def validate_telemetry(m: Mapping[str, Any]) -> None:
    _required(m, "telemetry", ("node", "ts", "seq", "gpus"))
    _name("telemetry.node", m["node"])
    _ts("telemetry.ts", m["ts"])
    _integer("telemetry.seq", m["seq"], 0)
    seen: set[int] = set()
    for i, g in enumerate(_bounded_list("telemetry.gpus", m["gpus"], MAX_GPUS)):
        where = f"telemetry.gpus[{i}]"
        gpu = _object(where, g)
        _required(gpu, where, ("index",))
        _integer(f"{where}.index", gpu["index"], 0)
        if gpu["index"] > MAX_GPU_INDEX:
            raise MessageError(
                "out_of_range", f"{where}.index must be <= {MAX_GPU_INDEX}, got {gpu['index']}"
            )
        if gpu["index"] in seen:
            raise MessageError("out_of_range", f"{where}.index {gpu['index']} appears twice")
        seen.add(gpu["index"])
        _fields(where, gpu, GPU_FIELDS)
    if "host" in m:
        _fields("telemetry.host", _object("telemetry.host", m["host"]), HOST_FIELDS)
    if "net" in m:
        net = _object("telemetry.net", m["net"])
        for kind, spec in (("ib", IB_FIELDS), ("eth", ETH_FIELDS)):
            if kind in net:
                for i, port in enumerate(_bounded_list(f"telemetry.net.{kind}", net[kind], MAX_PORTS)):
                    where = f"telemetry.net.{kind}[{i}]"
                    _fields(where, _object(where, port), spec)
    if "agent" in m:
        agent = _object("telemetry.agent", m["agent"])
        if "source_errors" in agent:
            for k, v in _object("telemetry.agent.source_errors", agent["source_errors"]).items():
                _string(f"telemetry.agent.source_errors.{k}", v)


JOB_STATES = frozenset({"started", "running", "finished", "failed"})


def validate_job(m: Mapping[str, Any]) -> None:
    _required(m, "job", ("job", "nodes", "state", "ts"))
    _name("job.job", m["job"])
    nodes = _list("job.nodes", m["nodes"])
    for i, n in enumerate(nodes):
        _name(f"job.nodes[{i}]", n)
    _string("job.state", m["state"])
    if m["state"] not in JOB_STATES:
        raise MessageError("out_of_range", f"job.state {m['state']!r} is not one of {sorted(JOB_STATES)}")
    _ts("job.ts", m["ts"])


def validate_step(m: Mapping[str, Any]) -> None:
    _required(m, "step", ("job", "node", "rank", "step", "step_time_s", "ts"))
    _name("step.job", m["job"])
    _name("step.node", m["node"])
    _integer("step.rank", m["rank"], 0)
    _integer("step.step", m["step"], 0)
    _number("step.step_time_s", m["step_time_s"], 0)
    if "wait_time_s" in m:  # optional: time spent waiting for peers (collective wait), see simulator
        _number("step.wait_time_s", m["wait_time_s"], 0)
    _ts("step.ts", m["ts"])


def validate_truth(m: Mapping[str, Any]) -> None:
    _required(m, "truth", ("node", "fault", "onset_ts"))
    _name("truth.node", m["node"])
    if "gpu" in m and m["gpu"] is not None:
        _integer("truth.gpu", m["gpu"], 0)
    _string("truth.fault", m["fault"])
    _ts("truth.onset_ts", m["onset_ts"])
    if m.get("end_ts") is not None:
        _ts("truth.end_ts", m["end_ts"])
        if m["end_ts"] < m["onset_ts"]:
            raise MessageError("out_of_range", "truth.end_ts is before truth.onset_ts")


def validate_node_features(m: Mapping[str, Any]) -> None:
    _required(m, "nodefeatures", ("node", "job", "ts", "seq"))
    _name("nodefeatures.node", m["node"])
    _name("nodefeatures.job", m["job"])
    _ts("nodefeatures.ts", m["ts"])
    _integer("nodefeatures.seq", m["seq"], 0)
    for k, check in (
        ("util", _pct),
        ("sm_clock_mhz", _nonneg),
        ("power_w", _nonneg),
        ("gpus_lost", _counter),
    ):
        if k in m:
            check(f"nodefeatures.{k}", m[k])


VALIDATORS: dict[str, Callable[[Mapping[str, Any]], None]] = {
    TELEMETRY: validate_telemetry,
    JOB: validate_job,
    STEP: validate_step,
    TRUTH: validate_truth,
    NODE_FEATURES: validate_node_features,
}

# The timestamp field each schema is judged by for clock skew.
TS_FIELD = {TELEMETRY: "ts", JOB: "ts", STEP: "ts", TRUTH: "onset_ts", NODE_FEATURES: "ts"}


def register(schema: str, validator: Callable[[Mapping[str, Any]], None], ts_field: str | None) -> None:
    """Let later layers (findings, drains) add their schemas to the one decoder."""
    VALIDATORS[schema] = validator
    if ts_field:
        TS_FIELD[schema] = ts_field


def validate(m: Any, expected: str | frozenset[str] | None = None) -> dict[str, Any]:
    """Check an already parsed message; returns it (typed as a dict) or raises MessageError."""
    if not isinstance(m, dict):
        raise MessageError("not_object", f"message must be a JSON object, got {type(m).__name__}")
    schema = m.get("schema")
    if schema is None:
        raise MessageError("missing_field", "schema is required")
    if not isinstance(schema, str):
        raise MessageError("wrong_type", "schema must be a string")
    validator = VALIDATORS.get(schema)
    if validator is None:
        raise MessageError("unknown_schema", f"unknown schema {schema[:64]!r} (known: {sorted(VALIDATORS)})")
    if expected is not None and schema != expected and (isinstance(expected, str) or schema not in expected):
        raise MessageError("unknown_schema", f"schema {schema!r} does not belong on this topic ({expected})")
    validator(m)
    return m


def check_clock(m: Mapping[str, Any], now: float, max_skew_s: float) -> None:
    """Reject a message whose timestamp lies more than max_skew_s from `now`, either way."""
    ts = m[TS_FIELD[m["schema"]]]
    if abs(ts - now) > max_skew_s:
        raise MessageError(
            "clock_skew", f"timestamp {ts:.3f} is {ts - now:+.0f} s from now (limit {max_skew_s:.0f} s)"
        )


def decode(
    raw: bytes,
    expected: str | frozenset[str] | None = None,
    *,
    now: float | None = None,
    max_skew_s: float | None = None,
    max_bytes: int = MAX_MESSAGE_BYTES,
    struct: bool = False,
) -> Any:
    """Raw Kafka value -> validated message dict, or MessageError naming what is wrong.

    struct=True: a valid telemetry/1 message comes back as fleetwatch.fast_schema's decoded struct
    (attributes, NaN for absent numbers) instead of a dict, parsed once; every other message, and
    one that only the Python validator accepts, still comes back as a dict.
    """
    if raw is None:
        raise MessageError("not_json", "empty message (tombstone)")
    if len(raw) > max_bytes:
        raise MessageError("oversized", f"{len(raw)} bytes exceeds the {max_bytes}-byte limit")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MessageError("not_utf8", f"invalid UTF-8 at byte {e.start}") from None
    wants_telemetry = _wants_telemetry(expected)
    if struct and wants_telemetry:
        t = _fast_schema().decode_telemetry(raw)
        if t is not None:
            if max_skew_s is not None:
                check_clock(
                    {"schema": TELEMETRY, "ts": t.ts}, time.time() if now is None else now, max_skew_s
                )
            return t
    try:
        m = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise MessageError("not_json", str(e)[:200]) from None
    fast = not struct and type(m) is dict and m.get("schema") == TELEMETRY and wants_telemetry
    if not (fast and _fast_schema().telemetry_ok(raw)):
        validate(m, expected)  # the slow path names what is wrong (or accepts what the fast one may not)
    if max_skew_s is not None:
        check_clock(m, time.time() if now is None else now, max_skew_s)
    return m


def decode_batch(
    raws: Sequence[bytes | None],
    expected: str | frozenset[str] | None = None,
    *,
    now: float | None = None,
    max_skew_s: float | None = None,
    max_bytes: int = MAX_MESSAGE_BYTES,
    struct: bool = False,
) -> tuple[list[Any], list[tuple[int, MessageError]]]:
    """decode() over a batch of raw values: (the valid messages in order, [(index, error)] of the
    rest). The same result as calling decode() on each; with struct=True, valid telemetry takes the
    compiled decoder straight away (msgspec rejects invalid UTF-8 itself, so the separate UTF-8
    pass is left to the few messages it refuses, which decode() then names)."""
    if now is None:
        now = time.time()
    fast = _fast_schema().decode_telemetry if struct and _wants_telemetry(expected) else None
    ok: list[Any] = []
    bad: list[tuple[int, MessageError]] = []
    for i, raw in enumerate(raws):
        if fast is not None and raw is not None and len(raw) <= max_bytes:
            t = fast(raw)
            if t is not None and (max_skew_s is None or abs(t.ts - now) <= max_skew_s):
                ok.append(t)
                continue
        try:
            ok.append(
                decode(raw, expected, now=now, max_skew_s=max_skew_s, max_bytes=max_bytes, struct=struct)
            )
        except MessageError as e:
            bad.append((i, e))
    return ok, bad


def _wants_telemetry(expected: str | frozenset[str] | None) -> bool:
    return (
        expected is None or expected == TELEMETRY or (not isinstance(expected, str) and TELEMETRY in expected)
    )


def _fast_schema() -> Any:
    # fast_schema builds its types from this module's tables, so it is imported on first use.
    from fleetwatch import fast_schema

    return fast_schema


def encode(m: Mapping[str, Any]) -> bytes:
    """Message dict -> JSON bytes. orjson writes NaN/Inf as null, so validate() before encoding."""
    try:
        # numpy scalars (a float64 from a detector) are numbers too; serialising them beats a crash
        return orjson.dumps(m, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError as e:
        raise MessageError("wrong_type", f"cannot encode: {e}") from None
