"""The compiled telemetry scanner (fleetwatch/telemetry_scan.py) against the compiled decoder it
stands in for (fleetwatch/fast_schema.py): whatever it takes, that decoder accepts, with the
same columns; what it leaves, the worker hands to the decoders (pipeline/telemetry_decode.py)."""

from __future__ import annotations

import contextlib
import itertools
import json
import random
import re
import textwrap
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwatch import fast_schema, schemas, telemetry_scan
from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.pipeline import telemetry_decode
from fleetwatch.pipeline.job_table import JobTable
from fleetwatch.pipeline.node_stage import NodeTask
from fleetwatch.pipeline.telemetry_decode import decode_telemetry
from fleetwatch.record_block import RecordBlock
from tests.helpers.batches import assert_same_batch
from tests.helpers.bounds_checked import run_bounds_checked
from tests.helpers.messages import mutated_telemetry, python_accepts, telemetry

NOW = 1_764_000_000.0
CLOCK = schemas.ClockLimits(ahead_s=3600, behind_s=3600)


def assert_same_columns(a: TelemetryBatch, b: TelemetryBatch) -> None:
    """Every column equal (NaN equal to NaN); IB port and state names compared port by port (a
    port given as 1 and as "1" is one name to the scanner, two codes with one name to msgspec),
    and so are Ethernet interface and state names (an absent iface is "" to both, but one code
    of its own to msgspec)."""
    names = ("ib_key_names", "ib_key_idx", "ib_state_names", "ib_state_idx")
    names += ("eth_iface_names", "eth_iface_idx", "eth_state_names", "eth_state_idx")
    assert_same_batch(a, b, skip=(*names, "received"))
    assert a.ib_key == b.ib_key
    assert a.ib_state == b.ib_state
    assert a.eth_iface == b.eth_iface
    assert a.eth_state == b.eth_state


def scanned(raws: list[bytes]) -> tuple[telemetry_scan.Scan, TelemetryBatch | None]:
    sc = telemetry_scan.scan(raws)
    return sc, (TelemetryBatch.from_scan(sc) if len(sc.taken) else None)


def simulated(nodes: int = 16, seconds: int = 240) -> list[dict[str, Any]]:
    from fleetwatch import topics
    from fleetwatch.collectors.sim import Simulation, load_scenario, packaged_path

    scenario = load_scenario(str(packaged_path("default.yaml")), {"nodes": nodes, "duration_s": seconds})
    sim = Simulation(scenario)
    return [m for ms in sim.ticks() for t, _k, m in ms if t == topics.TELEMETRY]


def test_simulated_telemetry_is_all_taken_with_the_same_columns() -> None:
    """A faulty simulated cluster: XIDs, lost GPUs, IB ports down, missing fields. The samples
    that carry a kernel-log section (every XID is logged there too) are left to the decoders, as
    designed: without it, the scanner takes each one."""
    msgs = simulated()
    logged = [i for i, m in enumerate(msgs) if "kernel" in m or "checks" in m]
    assert logged and len(logged) < len(msgs) // 20  # a quiet tick sends no kernel section
    left = scanned([schemas.encode(msgs[i]) for i in logged])[0]
    assert len(left.taken) == 0
    raws = [schemas.encode({k: v for k, v in m.items() if k not in ("kernel", "checks")}) for m in msgs]
    for i in range(0, len(raws), 500):
        sc, batch = scanned(raws[i : i + 500])
        assert sc.taken.tolist() == list(range(len(raws[i : i + 500])))
        assert batch is not None
        structs = [fast_schema.decode_telemetry(r) for r in raws[i : i + 500]]
        assert_same_columns(batch, TelemetryBatch.from_structs(structs))
    whole = TelemetryBatch.from_scan(telemetry_scan.scan(raws))
    assert len(whole.xid_code) and whole.lost.any() and (whole.ib_active == 0).any()


def test_full_output_arrays_are_retried_with_more_room() -> None:
    """64 GPUs, 300 ports and 1,000 XIDs in one message overflow the first guesses (8 GPU entries
    and ports a message, one XID): the scan is retried with more room, same columns."""
    m = telemetry()
    m["gpus"] = [{"index": i, "util": 1.0 * i, "xids": []} for i in range(64)]
    m["gpus"][3]["xids"] = list(range(1000))
    m["net"]["ib"] = [dict(m["net"]["ib"][0], port=p) for p in range(256)]
    raws = [schemas.encode(m), schemas.encode(telemetry(node="n2"))]
    sc, batch = scanned(raws)
    assert sc.taken.tolist() == [0, 1] and batch is not None
    assert len(batch.xid_code) == 1000 and batch.gpu.shape[1] == 64 and len(batch.ib) == 257
    assert_same_columns(batch, TelemetryBatch.from_structs([fast_schema.decode_telemetry(r) for r in raws]))


def test_ethernet_ports_are_kept_with_the_same_columns() -> None:
    """Ethernet interfaces are rows like IB ports (until issue 25 they were checked and dropped):
    names and operstates interned, an absent iface "" and an absent state None, as the decoders
    have them; 256 interfaces in a message and 20 in each of many overflow the first guess of room
    (4 a message), and the scan is retried with more."""
    m = telemetry()
    m["net"]["eth"] = [
        {"iface": "eno1", "state": "up", "rx_errors": 12, "tx_errors": 0, "carrier_changes": 7},
        {"iface": "docker0", "state": "down", "carrier_up_count": 0, "carrier_down_count": 0},
        {"rx_bytes": 5},
        {"iface": "tun0", "state": "unknown"},
    ]
    many = telemetry(node="n2")
    many["net"]["eth"] = [
        {"iface": f"veth{i}", "state": "up", "rx_bytes": i} for i in range(schemas.MAX_PORTS)
    ]
    some = [telemetry(node=f"n{k}", seq=k) for k in range(3, 40)]
    for s in some:
        s["net"]["eth"] = [{"iface": f"eth{i}", "state": "up", "rx_errors": i} for i in range(20)]
    raws = [schemas.encode(x) for x in (m, many, *some)]
    sc, batch = scanned(raws)
    assert sc.taken.tolist() == list(range(len(raws))) and batch is not None
    assert len(batch.eth) == 4 + schemas.MAX_PORTS + 20 * len(some)
    assert batch.eth_iface[:4] == ["eno1", "docker0", "", "tun0"]
    assert batch.eth_state[:4] == ["up", "down", None, "unknown"]
    assert batch.eth[0, telemetry_scan.ETH_COLUMNS.index("carrier_changes")] == 7
    assert_same_columns(batch, TelemetryBatch.from_structs([fast_schema.decode_telemetry(r) for r in raws]))


def test_what_is_left_and_why() -> None:
    good = schemas.encode(telemetry())
    left = [
        b"",
        good[:-1],  # truncated
        good + b"x",  # trailing garbage
        good.replace(b'"node":"gpu-node-0001"', b'"node":"gpu-node-0001","node":"x"'),  # duplicate key
        good.replace(b'"GPU-0"', b'"GPU-\\u00e9"'),  # an escape: fast_schema decides
        good.replace(b'"GPU-0"', '"GPU-é"'.encode()),  # non-ASCII
        good.replace(b'"seq":7', b'"seq":12345678901234567890'),  # beyond 18 digits
        good.replace(b'"seq":7', b'"seq":7.0'),  # a fraction in an integer field
        good.replace(b'"util":97.0', b'"util":101'),  # out of range
        good.replace(b'"util":97.0', b'"util":null'),
        good.replace(b'"util":97.0', b'"util":NaN'),
        good.replace(b'"util":97.0', b'"util":1e999'),  # infinite
        good.replace(b'"index":1,', b'"index":0,'),  # a GPU index twice
        good.replace(b"telemetry/1", b"telemetry/2"),
        good.replace(b'"node":"gpu-node-0001"', b'"node":"-bad"'),
        good.replace(b'"port":1', b'"port":-0'),
        good.replace(b'"port":1', b'"port":true'),
        good.replace(b'"ts":1764000000.5', b'"ts":01'),
        b'{"schema":"telemetry/1","node":"n","ts":1,"seq":1}',  # no gpus
        b"[" * 70 + b"]" * 70,
    ]
    sc = telemetry_scan.scan([good, *left, good])
    assert sc.taken.tolist() == [0, len(left) + 1]


def test_numbers_are_read_as_python_reads_them() -> None:
    texts = ["0", "-0.0", "238.5", "0.30000000000000004", "1e-7", "2.5E+3", "12345678901234567e-3", "1e308"]
    texts += ["9007199254740993", "123456789012345678", "0.1234567890123456789"]
    for text in texts:
        raw = schemas.encode(telemetry()).replace(b'"load1":12.5', f'"load1":{text}'.encode())
        _sc, batch = scanned([raw])
        assert batch is not None, text
        got = batch.host[0, list(telemetry_scan.HOST_COLUMNS).index("load1")]
        assert got == float(text) and np.signbit(got) == np.signbit(float(text)), text


def test_lost_values_are_read_like_msgspec_reads_them() -> None:
    m = telemetry()
    m["gpus"][0]["lost"] = False
    m["gpus"][1]["lost"] = True
    m["gpus"][2]["lost"] = None  # only `true` says lost
    m["agent"] = {"version": "0.1", "source_errors": {}, "instance": "c0ffee"}
    for raw in (orjson.dumps(m), json.dumps(m, indent=2).encode()):
        _sc, batch = scanned([raw])
        assert batch is not None
        assert batch.lost[0].tolist()[:4] == [False, True, False, False]
        assert_same_columns(batch, TelemetryBatch.from_structs([fast_schema.decode_telemetry(raw)]))


@pytest.mark.parametrize(
    "extend",
    [
        lambda m: m.update(extension={"a": [1, 2.5, {"b": None, "c": [True, False, "x"]}], "d": []}),
        lambda m: m["gpus"][0].update(lost={"why": ["fell", "off"]}),
        lambda m: m["gpus"][2].update(lost=1),
        lambda m: m["gpus"][3].update(vendor_extra=[[[]]]),
        lambda m: m["host"].update(extra="x"),
        lambda m: m["net"]["ib"][0].update(extra={}),
        lambda m: m["net"]["eth"][0].update(extra=-1),
        lambda m: m["net"].update(other=[1]),
        lambda m: m.update(agent={"source_errors": {"nvml": "NVML_ERROR_UNKNOWN"}}),
        lambda m: m["gpus"][0].update(uuid="G" * (schemas.MAX_ID_LEN + 1)),
    ],
)
def test_fields_the_scanner_does_not_read_go_to_the_decoders(extend: Any) -> None:
    """A field the contract does not name there (its value could hide a duplicate key: only a
    decoder that compares keys finds it), a source error (free-form keys) or a string past the
    longest the contract allows: left to the decoders, which take valid ones with the same columns."""
    m = telemetry()
    extend(m)
    raw = orjson.dumps(m)
    sc, _batch = scanned([raw])
    assert sc.taken.tolist() == []
    batch, bad = decode_telemetry([raw], now=NOW, clock=None)
    if python_accepts(json.loads(raw)):
        assert bad == [] and isinstance(batch, TelemetryBatch)
        assert_same_columns(batch, TelemetryBatch.from_messages([schemas.validate(json.loads(raw))]))
    else:
        assert [e.reason for _i, e in bad] == ["out_of_range"]


# ---------------------------------------------------------------- generated and mutated messages

field_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 300),
    st.integers(-(2**70), 2**70),
    st.floats(-100, 400, allow_nan=False),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
    st.text(alphabet='ab/: "\\\t', max_size=4),
    st.lists(st.integers(-2, 100), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers() | st.none(), max_size=2),
    st.just(1e308),
    st.just(-0.0),
)


def _encode(m: dict[str, Any], how: int) -> bytes:
    if how == 0:
        try:
            return orjson.dumps(m)
        except TypeError:  # orjson refuses integers outside 64 bits; json writes them
            return json.dumps(m, separators=(",", ":"), ensure_ascii=False).encode()
    if how == 1:
        return json.dumps(m).encode()  # spaces after separators, non-ASCII escaped
    return json.dumps(m, indent=1, ensure_ascii=False).encode()


def _mutate_bytes(raw: bytes, data: st.DataObject) -> bytes:
    kind = data.draw(st.sampled_from(["none", "none", "cut", "flip", "insert", "delete"]))
    if kind == "none" or not raw:
        return raw
    at = data.draw(st.integers(0, len(raw) - 1))
    byte = bytes([data.draw(st.sampled_from(b'{}[]:,"\\-+.eE0123456789 \x00\xff'))])
    if kind == "cut":
        return raw[:at]
    if kind == "flip":
        return raw[:at] + byte + raw[at + 1 :]
    if kind == "insert":
        return raw[:at] + byte + raw[at:]
    return raw[:at] + raw[at + 1 :]


def _only_what_the_scanner_reads(m: dict[str, Any]) -> bool:
    """Only fields the contract names where they are, `lost` a literal, no source error, and no
    string longer than the contract allows."""
    top = {"schema", "node", "ts", "seq", "gpus", "host", "net", "agent"}
    gpu_keys = {"index", "lost", *schemas.GPU_FIELDS}
    gpus_ok = all(
        g.keys() <= gpu_keys and (g.get("lost") is None or type(g["lost"]) is bool) for g in m["gpus"]
    )
    net = m.get("net", {})
    ports_ok = all(p.keys() <= schemas.IB_FIELDS.keys() for p in net.get("ib", [])) and all(
        p.keys() <= schemas.ETH_FIELDS.keys() for p in net.get("eth", [])
    )
    agent = m.get("agent", {})
    strings = re.findall(r'"((?:[^"\\]|\\.)*)"', json.dumps(m))
    return (
        m.keys() <= top
        and gpus_ok
        and m.get("host", {}).keys() <= schemas.HOST_FIELDS.keys()
        and net.keys() <= {"ib", "eth"}
        and ports_ok
        and agent.keys() <= {"version", "source_errors", "instance"}
        and not agent.get("source_errors")
        and all(len(t) <= schemas.MAX_ID_LEN for t in strings)
    )


def _must_take(raw: bytes) -> bool:
    """A message the scanner has no reason to leave: valid, plain ASCII, no escape, no integer
    of more than 18 digits, nothing it does not read."""
    try:
        text = raw.decode("ascii")
        m = json.loads(raw)
    except ValueError:
        return False
    printable = all(32 <= ord(c) < 127 for c in text.replace("\n", "").replace(" ", ""))
    return (
        printable
        and "\\" not in text
        and not re.search(r"\d{19,}", text)
        and python_accepts(m)
        and fast_schema.decode_telemetry(raw) is not None
        and _only_what_the_scanner_reads(m)
    )


@settings(max_examples=500, deadline=None)
@given(st.data())
def test_what_the_scanner_takes_fast_schema_takes_with_the_same_columns(data: st.DataObject) -> None:
    m = mutated_telemetry(data, field_values, changes=(0, 3), extra_keys=("extra_field", "lost"))
    clean = _encode(m, data.draw(st.integers(0, 2)))
    raw = _mutate_bytes(clean, data)
    sc, batch = scanned([raw])
    struct = fast_schema.decode_telemetry(raw)
    if len(sc.taken):
        assert struct is not None, raw[:300]
        assert batch is not None
        assert_same_columns(batch, TelemetryBatch.from_structs([struct]))
    elif raw == clean and _must_take(raw):
        raise AssertionError(f"a plain valid message was left: {raw[:300]!r}")


_good = schemas.encode(telemetry(ts=NOW))
_SAMPLES = [
    _good,
    schemas.encode(telemetry(ts=NOW + 1, node="gpu-node-0002")),
    _good.replace(b'"GPU-0"', b'"GPU-\\u00e9"'),  # valid, left by the scanner
    schemas.encode(telemetry(ts=1.0)),  # clock skew
    schemas.encode(telemetry(ts=NOW, node="", seq=-1)),
    b"\xff\xfe{}",
    b'{"schema": "telemetry/1"',
    b"x" * (schemas.MAX_MESSAGE_BYTES + 1),
    None,
]


_KEYS = [b"gpu-node-0001", b"gpu-node-0002", b"ghost", None]


@contextlib.contextmanager
def scanner_loading(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The decoders only, as while load_scanner(background=True) is compiling; and a scanner that
    must not be called."""

    def not_ready(*_args: Any) -> Any:
        raise AssertionError("the scanner was called before it was ready")

    with monkeypatch.context() as patched, telemetry_decode.message_decoders_only():
        patched.setattr(telemetry_scan, "scan_spans", not_ready)
        yield


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(_SAMPLES) | st.binary(max_size=40),
            st.sampled_from(_KEYS),
            st.sampled_from([-1, int(NOW * 1000), int((NOW - 7200) * 1000)]),  # CreateTime, or appended
        ),
        max_size=12,
    ),
    st.booleans(),
)
def test_the_workers_decode_equals_the_decoders(records: list[tuple[Any, Any, int]], loading: bool) -> None:
    """pipeline/telemetry_decode.py over records from Kafka: the same messages, in the same order,
    and the same errors (index, reason, detail) as schemas.decode_batch with the same keys and
    reference times (the broker's append time where the record has one, else now). The same
    while the scanner is still being compiled in the background (loading: a fresh install's
    first minutes), when the scanner is not used at all."""
    raws = [r for r, _k, _t in records]
    block = RecordBlock.from_values(
        raws, keys=[k for _r, k, _t in records], append_ms=[t for *_, t in records]
    )
    refs = block.reference_times(NOW)
    want_ok, want_bad = schemas.decode_batch(
        raws, schemas.TELEMETRY, keys=block.keys(), ref_ts=refs, clock=CLOCK, struct=True
    )
    with pytest.MonkeyPatch.context() as mp, scanner_loading(mp) if loading else contextlib.nullcontext():
        got, bad = decode_telemetry(block, now=NOW, clock=CLOCK)
    assert [(i, e.reason, e.detail) for i, e in bad] == [(i, e.reason, e.detail) for i, e in want_bad]
    assert isinstance(got, TelemetryBatch)  # also with no valid record: the task's one form
    if not want_ok:
        assert len(got) == 0
        return
    assert_same_columns(got, TelemetryBatch.from_messages(want_ok))
    accepted = [i for i in range(len(raws)) if i not in {i for i, _e in want_bad}]
    assert got.received.tolist() == refs[accepted].tolist()


def test_the_node_stage_gives_the_same_outputs_from_columns_as_from_structs() -> None:
    """The detect stage on the worker's decoding (the scanner's columns, and the decoders' structs
    for the samples it leaves: those with a kernel-log section), with duplicates and out-of-order
    samples, which it drops, emits exactly what it emits from decoded structs alone."""
    msgs = simulated(nodes=12, seconds=180)
    raws = [schemas.encode(m) for m in msgs]
    assert any(b'"kernel"' in r for r in raws)
    rng = random.Random(3)
    raws += rng.sample(raws, 200)  # redelivered: stale on arrival
    by_structs, by_columns = NodeTask(JobTable()), NodeTask(JobTable())
    out_s: list[Any] = []
    out_c: list[Any] = []
    for i in range(0, len(raws), 300):
        chunk = raws[i : i + 300]
        out_s += by_structs.process(
            "t", TelemetryBatch.from_structs([fast_schema.decode_telemetry(r) for r in chunk])
        )
        batch, bad = decode_telemetry(chunk, now=2e9, clock=None)
        assert bad == [] and len(batch) == len(chunk)
        batch.received = np.full(len(batch), np.nan)  # no broker here: as from_structs has it
        out_c += by_columns.process("t", batch)
    assert out_c == out_s
    assert any(t == "fleet.findings.v1" for t, _k, _m in out_s)
    assert by_columns.to_bytes() == by_structs.to_bytes()


def test_select_keeps_the_chosen_messages() -> None:
    msgs = simulated(nodes=8, seconds=60)
    raws = [schemas.encode({k: v for k, v in m.items() if k not in ("kernel", "checks")}) for m in msgs]
    keep = np.array([i % 3 != 1 for i in range(len(raws))])
    got = TelemetryBatch.from_scan(telemetry_scan.scan(raws)).select(keep)
    kept = [r for r, k in zip(raws, keep, strict=True) if k]
    want = TelemetryBatch.from_structs([fast_schema.decode_telemetry(r) for r in kept])
    assert_same_columns(got, want)


_BOUNDS_CHECKED = textwrap.dedent(
    """
    import random, sys
    from fleetwatch import fast_schema, schemas, telemetry_scan
    from tests.helpers.messages import telemetry
    rng = random.Random(7)
    good = schemas.encode(telemetry())
    alphabet = b'{}[]:,"\\\\-+.eE0123456789 tfnul'
    raws = []
    for _ in range(20000):
        r = bytearray(good)
        for _ in range(rng.randint(1, 3)):
            if not r:
                break
            at = rng.randrange(len(r))
            op = rng.randrange(3)
            if op == 0:
                r[at] = rng.choice(alphabet)
            elif op == 1:
                del r[at:]
            else:
                r.insert(at, rng.choice(alphabet))
        raws.append(bytes(r))
    taken = 0
    for i in range(0, len(raws), 1000):
        sc = telemetry_scan.scan(raws[i : i + 1000])
        for k in sc.taken.tolist():
            assert fast_schema.decode_telemetry(raws[i + k]) is not None, raws[i + k]
        taken += len(sc.taken)
    print("taken", taken, "of", len(raws))
    # 24 IB ports fill the first guess of room for one message exactly; an Ethernet port after them
    # must not be written past it
    m = telemetry()
    m["net"]["ib"] = [dict(m["net"]["ib"][0], port=p) for p in range(24)]
    full = schemas.encode(m)
    assert telemetry_scan.scan([full]).taken.tolist() == [0]
    assert fast_schema.decode_telemetry(full) is not None
    # 20 Ethernet ports fill their first guess of room (4 a message + 16) exactly, 21 overflow it
    for count in (20, 21):
        m = telemetry()
        m["net"]["eth"] = [{"iface": f"eth{i}", "state": "up", "rx_errors": i} for i in range(count)]
        full = schemas.encode(m)
        assert telemetry_scan.scan([full]).eth_iface_names[-1] == f"eth{count - 1}"
    """
)


def test_mutated_messages_never_read_out_of_bounds() -> None:
    """Every read is meant to be checked against the message's end; numba's own bounds checking
    (its own cache: the checks are compiled in) must find no index out of range on 20,000
    mutated messages, truncations included, nor on output arrays filled exactly."""
    done = run_bounds_checked(_BOUNDS_CHECKED, timeout_s=280)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"taken \d+ of 20000", done.stdout)


def _count_decodes(monkeypatch: pytest.MonkeyPatch) -> list[bytes | None]:
    """Every value the message decoders are asked to decode from now on (schemas.decode_batch)."""
    seen: list[bytes | None] = []
    decode_batch = schemas.decode_batch

    def counting(values: list[bytes | None], *args: Any, **kw: Any) -> Any:
        seen.extend(values)
        return decode_batch(values, *args, **kw)

    monkeypatch.setattr(schemas, "decode_batch", counting)
    return seen


def test_each_record_is_decoded_once_when_the_decoders_take_one_the_scanner_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch where the scanner leaves a valid message (a string with an escape): the decoders
    see that one only, and its columns join the scanner's in offset order (until issue 24 the
    whole batch was decoded again by the decoders)."""
    plain = [schemas.encode(telemetry(node=f"gpu-node-{i:04d}", ts=NOW, seq=i)) for i in range(6)]
    escaped = schemas.encode(telemetry(node="gpu-node-0099", ts=NOW, seq=99)).replace(
        b'"GPU-0"', b'"GPU-\\u00e9"'
    )
    raws = [*plain[:3], escaped, *plain[3:]]
    seen = _count_decodes(monkeypatch)
    got, bad = decode_telemetry(raws, now=NOW, clock=CLOCK)
    assert seen == [escaped] and bad == []
    assert isinstance(got, TelemetryBatch)
    assert got.nodes() == [json.loads(r)["node"] for r in raws]
    want, _bad = schemas.decode_batch(raws, schemas.TELEMETRY, ref_ts=NOW, clock=CLOCK, struct=True)
    assert_same_columns(got, TelemetryBatch.from_messages(want))


def test_records_the_scanner_takes_but_their_key_or_clock_refuses_are_named_without_a_second_decode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A record whose message the scanner reads but whose Kafka key names another node, or whose
    time is outside the clock limits, gets the decoders' own error from the scanner's values: the
    decoders never see it (each record decoded once), and the errors are decode_batch's."""
    msgs = [telemetry(node=f"gpu-node-{i:04d}", ts=NOW, seq=i) for i in range(5)]
    msgs[1]["ts"] = NOW + 7200  # beyond the limit ahead of the time the broker took it
    raws = [schemas.encode(m) for m in msgs]
    keys = [m["node"].encode() for m in msgs]
    keys[3] = b"gpu-node-9999"  # the key names another node
    block = RecordBlock.from_values(raws, keys=keys, append_ms=[int(NOW * 1000)] * len(raws))
    seen = _count_decodes(monkeypatch)
    got, bad = decode_telemetry(block, now=NOW, clock=CLOCK)
    assert seen == []
    assert got.nodes() == [msgs[i]["node"] for i in (0, 2, 4)]
    _ok, want = schemas.decode_batch(
        raws, schemas.TELEMETRY, keys=keys, ref_ts=np.full(5, NOW), clock=CLOCK, struct=True
    )
    assert [(i, e.reason, str(e)) for i, e in bad] == [(i, e.reason, str(e)) for i, e in want]
    assert [e.reason for _i, e in bad] == ["clock_skew", "key_mismatch"]


def test_node_check_counts_are_host_columns_and_a_checks_section_is_left_to_the_decoders() -> None:
    """The node checks' counts (host fields, sent by every node that configures checks) are read
    like any host field; the `checks` section that names failing mounts and devices, sent only
    when one fails, is left to the decoders as the `kernel` section is, with the same columns."""
    m = telemetry()
    m["host"].update(mounts_missing=1, mounts_hung=2, mounts_slowest_s=0.25, blockdevs_readonly=0)
    m["host"].update(inodes_used_frac=0.5)
    healthy = schemas.encode(m)
    sc, batch = scanned([healthy])
    assert sc.taken.tolist() == [0] and batch is not None
    assert_same_columns(batch, TelemetryBatch.from_structs([fast_schema.decode_telemetry(healthy)]))
    host = dict(zip(telemetry_scan.HOST_COLUMNS, sc.host[0], strict=True))
    assert (host["mounts_hung"], host["mounts_slowest_s"], host["inodes_used_frac"]) == (2, 0.25, 0.5)
    assert np.isnan(host["mounts_failed"])  # absent
    m["checks"] = {
        "mounts": [{"path": "/lustre", "problem": "hung", "fstype": "lustre", "took_s": 31.5}],
        "blockdevs": [{"name": "nvme1n1", "problem": "missing"}],
    }
    failing = schemas.encode(m)
    sc, _batch = scanned([healthy, failing])
    assert sc.taken.tolist() == [0]
    decoded, bad = decode_telemetry([failing], now=NOW, clock=None)
    assert bad == [] and isinstance(decoded, TelemetryBatch)
    assert_same_columns(decoded, TelemetryBatch.from_messages([json.loads(failing)]))


# ---------------------------------------------------------------- interning crafted names


def _name_spans(names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The names one after another in a buffer, and _intern's spans of them (second part empty)."""
    lens = np.array([len(n) for n in names], dtype=np.int64)
    ends = np.cumsum(lens)
    zeros = np.zeros_like(ends)
    buf = np.frombuffer("".join(names).encode(), dtype=np.uint8)
    return buf, np.stack([ends - lens, ends, zeros, zeros], axis=1)


def test_names_crafted_to_collide_under_a_known_multiplier_spread_under_the_process_key() -> None:
    """Every mix of 12 "Aa"/"BB" pairs (4,096 valid interface, device and node names) has one hash
    under a multiplier of 31, as the scanner's first hash had: each name interned then probed all
    those before it (65,536 of them in one 3.8 MB batch took 9.7 s). Under the base drawn for this
    process they spread; and the codes are the same whatever the base."""
    names = ["".join(p) for p in itertools.product(("Aa", "BB"), repeat=12)]
    buf, spans = _name_spans(names)
    hashes = {base: {telemetry_scan._span_hash(buf, spans, k, base) for k in range(len(names))}
              for base in (31, telemetry_scan.HASH_BASE)}  # fmt: skip
    assert len(hashes[31]) == 1  # the attack, as it worked
    assert len(hashes[telemetry_scan.HASH_BASE]) >= len(names) - 4
    rng = random.Random(5)
    repeated = [rng.choice([*names[:50], "a", "b", "a.b", "ab"]) for _ in range(2000)]
    buf, spans = _name_spans(repeated)
    spans[::7, 0] = -1  # some absent
    known, drawn = (
        telemetry_scan._intern(buf, spans, 31),
        telemetry_scan._intern(buf, spans, telemetry_scan.HASH_BASE),
    )
    assert np.array_equal(known[0], drawn[0]) and np.array_equal(known[1], drawn[1])
    first: dict[str | None, int] = {}
    for k, n in enumerate(repeated):
        first.setdefault(None if k % 7 == 0 else n, len(first))
    assert known[0].tolist() == [first[None if k % 7 == 0 else n] for k, n in enumerate(repeated)]
