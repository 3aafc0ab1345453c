"""Hostile telemetry through the real broker into a real detect worker (issue 15, B and C).

Each input below once killed a worker on every restart, blinded a node or fooled a detector. Now
each is dead-lettered with a reason, or processed as what it is, and the worker goes on: the good
samples produced after them are all found. The job table follower applies exactly what the
worker's job stage accepts. Nodes are named per run, so the shared topics carry nothing else that
matches.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from prometheus_client import REGISTRY

from fleetwatch import census, schemas, topics
from tests.helpers.messages import gpu, sample
from tests.integration.services import TopicTail, send
from tests.integration.workers import Detect


def test_hostile_samples_are_dead_lettered_or_handled_and_the_worker_goes_on(
    kafka_bootstrap: str, detect: tuple[Detect, str]
) -> None:
    d, p = detect
    n = [f"{p}{i}" for i in range(6)]
    now = time.time()
    good = sample(n[0], now, 1)
    hostile = {  # name -> (key, value, the reason it must be dead-lettered with)
        "nested": (n[0], good[:-1] + b',"x":' + b"[" * 1000 + b"]" * 1000 + b"}", "out_of_range"),
        "seq 2**63": (n[0], sample(n[0], now, 2**63), "out_of_range"),
        "xid 2**63": (n[0], sample(n[0], now, 3, [gpu(0, xids=[2**63])]), "out_of_range"),
        "counter 2**64": (
            n[0],
            good[:-1] + b',"host":{"procs_d_state":18446744073709551616}}',
            "out_of_range",
        ),
        "400 KB port": (
            n[0],
            sample(n[0], now, 4, net={"ib": [{"device": "mlx5_0", "port": "p" * 400_000}]}),
            "out_of_range",
        ),
        "duplicate node": (n[0], good[:-1] + f',"node":"{p}ghost"}}'.encode(), "duplicate_key"),
        "key is not the node": (n[0], sample(f"{p}ghost", now, 5), "key_mismatch"),
        "newline in name": (f"{n[0]}\n", sample(f"{n[0]}\n", now, 6), "out_of_range"),
        "bad UTF-8, unread field": (n[0], good[:-1] + b',"x":"\xff\xfe"}', "not_utf8"),
        "120 s in the future": (n[1], sample(n[1], now + 121, 2, [gpu(0, xids=[79])]), "clock_skew"),
        "300 s in the future": (n[2], sample(n[2], now + 300, 2), "clock_skew"),
    }
    # every node known first (node 4 with 3 uncorrectable errors in its GPU's lifetime)
    records = [
        (n[i], sample(n[i], now - 5, 1, [gpu(0, ecc_dbe_aggregate=3 if i == 4 else 0)])) for i in range(6)
    ]
    records += [(k, v) for k, v, _r in hostile.values()]
    records += [
        (n[1], sample(n[1], now + 1, 3, [gpu(0, xids=[79])])),  # after the one from the future: found
        # one sample, 256 IB ports down plus XID 79: a bounded number of findings, each small
        (
            n[3],
            sample(
                n[3],
                now,
                2,
                [gpu(0, xids=[79])],
                net={"ib": [{"device": "mlx5_0", "port": i, "state": "DOWN"} for i in range(256)]},
            ),
        ),
        # an uncorrectable-ECC count that steps back: a counter reset, reported as info only
        (n[4], sample(n[4], now - 3, 2, [gpu(0, ecc_dbe_aggregate=2)])),
        (n[4], sample(n[4], now - 2, 3, [gpu(0, ecc_dbe_aggregate=2**64 - 1)])),  # NVML's "not available"
        (n[4], sample(n[4], now - 1, 4, [gpu(0, ecc_dbe_aggregate=2)])),
        (n[5], sample(n[5], now, 2, [gpu(0, xids=[48])])),  # the last one: the worker is still there
    ]
    findings, dlq, nodes = (
        TopicTail(kafka_bootstrap, t) for t in (topics.FINDINGS, topics.DEADLETTER, topics.NODES)
    )
    send(
        kafka_bootstrap,
        topics.TELEMETRY,
        [(key.encode(), value) for key, value in records],
        max_message_bytes=2 << 20,
    )

    def mine(recs: list[Any]) -> list[dict[str, Any]]:
        return [schemas.decode(r.value) for r in recs if r.key and r.key.startswith(p.encode())]

    got = mine(
        findings.collect(
            lambda rs: (
                {(f["node"], f["kind"]) for f in mine(rs)}
                >= {(n[1], "xid"), (n[5], "xid"), (n[3], "ib_link"), (n[4], "ecc")}
            ),
            60,
        )
    )
    letters = dlq.collect(
        lambda rs: len([r for r in rs if p.encode() in r.value[:200000]]) >= len(hostile), 30
    )
    assert d.thread.is_alive(), "the worker died"

    reasons = sorted(dict(r.headers)["reason"].decode() for r in letters if p.encode() in r.value[:200000])
    assert reasons == sorted(r for _k, _v, r in hostile.values())
    by_node: dict[str, list[dict[str, Any]]] = {}
    for f in got:
        by_node.setdefault(f["node"], []).append(f)
    # the sample from the future neither opened anything nor blinded the node: its next one counts
    assert [(f["kind"], f["evidence"]["worst_xid"]) for f in by_node[n[1]]] == [("xid", 79)]
    # 257 problems in one sample: one finding per node and rule, small, the ports counted
    assert len(by_node[n[3]]) <= 3 and all(len(orjson.dumps(f)) < 16_384 for f in by_node[n[3]])
    ib = next(f for f in by_node[n[3]] if f["kind"] == "ib_link")
    assert ib["evidence"]["ports_total"] == 256 and len(ib["evidence"]["ports"]) <= 16
    # a counter that steps back is a reset: info, never critical, and "not available" is absent
    assert [(f["kind"], f["severity"], f["evidence"]["rule"]) for f in by_node[n[4]]] == [
        ("ecc", "info", "counter_reset")
    ]
    assert not any(f["node"].endswith("ghost") for f in got)
    # per-node clock skew, refused samples included; the census names the reporting nodes only
    skew = REGISTRY.get_sample_value("fleetwatch_node_clock_skew_seconds", {"node": n[2]})
    assert skew is not None and 299 < skew < 302
    listed = {
        r.key.decode()
        for r in nodes.collect(lambda rs: len([r for r in rs if r.key.startswith(p.encode())]) >= 6, 30)
        if r.key.startswith(p.encode())
    }
    assert listed == set(n)
    assert all(census.node_message(k, 0, 1) for k in listed)
    for t in (findings, dlq, nodes):
        t.close()


def test_the_job_table_applies_only_what_the_job_stage_accepts(
    kafka_bootstrap: str, detect: tuple[Detect, str]
) -> None:
    d, p = detect
    now = time.time()
    jobs = {
        f"{p}job-ok": (f"{p}job-ok", now, True),
        f"{p}job-future": (f"{p}job-future", now + 7200, False),  # its clock is two hours ahead
        f"{p}job-rekeyed": (f"{p}job-other", now, False),  # keyed as another job
    }
    dlq = TopicTail(kafka_bootstrap, topics.DEADLETTER)
    records: list[tuple[bytes | None, bytes | None]] = []
    for job, (key, ts, _ok) in jobs.items():
        msg = {"schema": "job/1", "job": job, "nodes": [f"{p}n1", f"{p}n2"], "state": "running", "ts": ts}
        records.append((key.encode(), orjson.dumps(msg)))
    send(kafka_bootstrap, topics.JOBS, records)
    letters = dlq.collect(lambda rs: len([r for r in rs if p.encode() in r.value]) >= 2, 30)
    assert sorted(dict(r.headers)["reason"] for r in letters if p.encode() in r.value) == [
        b"clock_skew",
        b"key_mismatch",
    ]
    deadline = time.monotonic() + 30
    while not d.jobs.nodes_of(f"{p}job-ok") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert d.jobs.nodes_of(f"{p}job-ok") == (f"{p}n1", f"{p}n2")
    assert d.jobs.nodes_of(f"{p}job-future") == () and d.jobs.nodes_of(f"{p}job-rekeyed") == ()
    dlq.close()


def test_a_counter_beyond_its_nvml_type_is_dead_lettered_not_a_finding(
    kafka_bootstrap: str, detect: tuple[Detect, str]
) -> None:
    """retired_pages is an unsigned int in NVML: a value near 2**64 (left by the scanner to the
    decoders) or just past 2**32 (read by the scanner) is no reading of it, and neither is a PCIe
    replay count past 2**32. Each is dead-lettered as out_of_range and raises no finding; the
    field's own "not available", 2**32 - 1, is absent; the worker goes on (a later XID is found)."""
    d, p = detect
    n = [f"{p}{i}" for i in range(3)]
    now = time.time()
    hostile = [
        (n[0], sample(n[0], now - 3, 2, [gpu(0, retired_pages=2**64 - 2)])),
        (n[0], sample(n[0], now - 2, 3, [gpu(0, retired_pages=2**32)])),
        (n[1], sample(n[1], now - 2, 2, [gpu(0, pcie_replay=2**32 + 5)])),
    ]
    records = [(k, sample(k, now - 5, 1, [gpu(0, retired_pages=0, pcie_replay=0)])) for k in n]
    records += hostile
    records.append((n[2], sample(n[2], now - 2, 2, [gpu(0, retired_pages=2**32 - 1)])))  # not available
    records += [(k, sample(k, now, 9, [gpu(0, xids=[48])])) for k in n]  # the last ones: still there
    findings, dlq = (TopicTail(kafka_bootstrap, t) for t in (topics.FINDINGS, topics.DEADLETTER))
    send(kafka_bootstrap, topics.TELEMETRY, [(key.encode(), value) for key, value in records])

    def mine(recs: list[Any]) -> list[dict[str, Any]]:
        return [schemas.decode(r.value) for r in recs if r.key and r.key.startswith(p.encode())]

    got = mine(findings.collect(lambda rs: {f["node"] for f in mine(rs) if f["kind"] == "xid"} >= set(n), 60))
    letters = dlq.collect(lambda rs: len([r for r in rs if p.encode() in r.value]) >= len(hostile), 30)
    more = findings.collect(lambda rs: False, 2)  # anything the refused values might still raise
    assert d.thread.is_alive(), "the worker died"
    mine_letters = [r for r in letters if p.encode() in r.value]
    assert sorted(r.value for r in mine_letters) == sorted(v for _k, v in hostile)
    assert {dict(r.headers)["reason"].decode() for r in mine_letters} == {"out_of_range"}
    assert [(f["node"], f["kind"]) for f in got + mine(more) if f["kind"] != "xid"] == []
    for t in (findings, dlq):
        t.close()
