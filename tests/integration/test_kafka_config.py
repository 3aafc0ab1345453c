"""Kafka security settings come from the environment and reach every client, against the real
broker and a private one with SASL and mutual-TLS listeners."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fleetwatch import schemas, topics
from fleetwatch.bus import TopicPart
from fleetwatch.bus.admin import Admin, ensure_topics
from fleetwatch.bus.config import BrokerUnavailable
from fleetwatch.bus.kafka import KafkaBus
from tests.integration.services import send


def test_every_client_is_built_with_them(kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Producer, group consumer, reader and admin all take rdkafka_config(): the local broker speaks
    PLAINTEXT, so each of them reaches it as configured and fails once SSL is asked for (nothing
    falls back)."""

    def makers(wait_s: float) -> tuple[Callable[[], Any], ...]:
        return (
            lambda: Admin(kafka_bootstrap, timeout_s=wait_s),
            lambda: KafkaBus(kafka_bootstrap, connect_timeout_s=wait_s).group_consumer(
                "cfg", client_id="cfg"
            ),
            lambda: KafkaBus(kafka_bootstrap, connect_timeout_s=wait_s).producer(),
            lambda: KafkaBus(kafka_bootstrap, connect_timeout_s=wait_s).reader(),
        )

    for make in makers(10.0):  # connects at once; the wait only bounds a slow machine
        make().close()
    monkeypatch.setenv("FLEETWATCH_KAFKA_SECURITY_PROTOCOL", "SSL")
    for make in makers(1.0):  # never connects: the wait is all it costs
        with pytest.raises(BrokerUnavailable):
            make()


def _set_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> dict[str, str]:
    for k in [k for k in os.environ if k.startswith("FLEETWATCH_KAFKA_")]:
        monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


def _sasl_env(monkeypatch: pytest.MonkeyPatch, password: str) -> dict[str, str]:
    return _set_env(
        monkeypatch,
        {
            "FLEETWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "FLEETWATCH_KAFKA_SASL_MECHANISM": "PLAIN",
            "FLEETWATCH_KAFKA_SASL_USERNAME": "fleetwatch",
            "FLEETWATCH_KAFKA_SASL_PASSWORD": password,
        },
    )


def _tls_env(
    monkeypatch: pytest.MonkeyPatch, cafile: Path, cert: Path | None, key: Path | None
) -> dict[str, str]:
    env = {"FLEETWATCH_KAFKA_SECURITY_PROTOCOL": "SSL", "FLEETWATCH_KAFKA_SSL_CAFILE": str(cafile)}
    if cert and key:
        env |= {"FLEETWATCH_KAFKA_SSL_CERTFILE": str(cert), "FLEETWATCH_KAFKA_SSL_KEYFILE": str(key)}
    return _set_env(monkeypatch, env)


def _round_trip(bootstrap: str, env: dict[str, str], tmp_path: Path, secret: str) -> None:
    """With the security settings in the environment (and only there), the admin, producer, group
    consumer and reader, and the `fleetwatch replay` CLI as a process, all work through `bootstrap`;
    `secret` appears in none of the CLI's output."""
    topic = f"secure.check.{uuid.uuid4().hex[:8]}"
    ensure_topics(bootstrap, [topic, topics.TELEMETRY])
    send(bootstrap, topic, [(b"k", str(i).encode()) for i in range(5)])

    node = f"secure-node-{uuid.uuid4().hex[:6]}"
    sample = {"schema": schemas.TELEMETRY, "node": node, "ts": time.time(), "seq": 0, "gpus": []}
    recording = tmp_path / "rec.jsonl"
    recording.write_text(json.dumps(sample) + "\n")
    r = subprocess.run(
        [sys.executable, "-m", "fleetwatch.cli", "replay", str(recording), "--bootstrap", bootstrap],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert secret not in r.stderr + r.stdout

    bus = KafkaBus(bootstrap)
    member = bus.group_consumer(f"sec-{uuid.uuid4().hex}", client_id="sec")
    member.subscribe(
        [topic, topics.TELEMETRY], lambda parts: member.group_offsets(parts), lambda _parts: None
    )
    got: list[bytes | None] = []
    replayed = False
    deadline = time.monotonic() + 60
    while (len(got) < 5 or not replayed) and time.monotonic() < deadline:
        for tp, block in member.poll(500, 0.5).items():
            for value in block.values():
                if tp.topic == topic:
                    got.append(value)
                elif value is not None and node.encode() in value:
                    replayed = True
    member.close()
    assert sorted(v for v in got if v is not None) == [str(i).encode() for i in range(5)] and len(got) == 5
    assert replayed, f"the replayed sample did not arrive through {bootstrap}"

    # The reader (followers, snapshots) takes the same settings from the same variables.
    reader = bus.reader()
    parts = [TopicPart(topic, p) for p in reader.partitions(topic, wait_s=10)]
    reader.assign(parts, "beginning")
    ends = reader.end_offsets(parts)
    values: list[bytes | None] = []
    deadline = time.monotonic() + 60
    while any(reader.position(tp) < ends[tp] for tp in parts) and time.monotonic() < deadline:
        values += [r.value for r in reader.poll(0.5)]
    reader.close()
    assert sorted(v for v in values if v is not None) == [str(i).encode() for i in range(5)]


def _refused(bootstrap: str, secret: str | None = None) -> None:
    """No client connects, and the one-line error says where to look without showing `secret`.
    (A short wait: nothing can make a refused client connect later, and 4 clients x 3 s each, in
    three such checks, cost half a minute of the suite.)"""
    bus = KafkaBus(bootstrap, connect_timeout_s=1)
    for make in (
        lambda: Admin(bootstrap, timeout_s=1),
        lambda: bus.group_consumer("refused", client_id="refused"),
        bus.producer,
        bus.reader,
    ):
        with pytest.raises(BrokerUnavailable) as err:
            make().close()
        assert "FLEETWATCH_KAFKA_" in str(err.value), str(err.value)
        if secret:
            assert secret not in str(err.value)


def test_clients_authenticate_to_a_real_sasl_listener(
    private_broker: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The private broker also listens with SASL_PLAINTEXT (PLAIN): every client works through it
    with the right password; with a wrong one nothing connects, and no password is ever shown."""
    env = _sasl_env(monkeypatch, private_broker.SASL_PASSWORD)
    _round_trip(private_broker.sasl_bootstrap, env, tmp_path, private_broker.SASL_PASSWORD)
    _sasl_env(monkeypatch, "wrong-password")
    _refused(private_broker.sasl_bootstrap, "wrong-password")


def test_clients_connect_through_a_real_mutual_tls_listener(
    private_broker: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The private broker also listens with SSL and requires a client certificate. With the CA,
    certificate and key in the environment every client works through it; without a client
    certificate, or trusting a certificate that did not sign the broker's, nothing connects."""
    tls = private_broker.tls_dir
    env = _tls_env(monkeypatch, tls / "ca.pem", tls / "client.pem", tls / "client.key")
    _round_trip(private_broker.ssl_bootstrap, env, tmp_path, "PRIVATE KEY")
    _tls_env(monkeypatch, tls / "ca.pem", None, None)
    _refused(private_broker.ssl_bootstrap)
    _tls_env(monkeypatch, tls / "client.pem", tls / "client.pem", tls / "client.key")
    _refused(private_broker.ssl_bootstrap)


def test_a_reader_given_an_offset_retention_removed_reads_from_the_oldest_record_kept(
    kafka_bootstrap: str,
) -> None:
    """The accounting stage starts each partition at offset 0, or at the offset its store kept: where
    retention has moved the log's start past it, librdkafka's default jumped to the end, and every
    record the topic still held was skipped (a review's find)."""
    topic = f"test.reader.reset.{uuid.uuid4().hex[:8]}"
    ensure_topics(kafka_bootstrap, [topic], partitions=1)
    send(kafka_bootstrap, topic, [(b"k", f"record {i}".encode()) for i in range(10)])
    with Admin(kafka_bootstrap) as admin:  # retention's doing, at once: the log now starts at offset 6
        admin.delete_records(TopicPart(topic, 0), 6)
    reader = KafkaBus(kafka_bootstrap).reader()
    try:
        reader.assign([TopicPart(topic, 0)], {TopicPart(topic, 0): 0})
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < 4 and time.monotonic() < deadline:
            got += [r.value for r in reader.poll(0.5) if r.value is not None]
        assert got == [f"record {i}".encode() for i in range(6, 10)]
    finally:
        reader.close()


def test_librdkafkas_group_protocol_lines_are_logged_when_asked_for(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """FLEETWATCH_KAFKA_DEBUG=cgrp (the runbook's way to see a stalled rebalance): the real client
    takes the setting, and its account of joining the group reaches the log."""
    import logging

    monkeypatch.setenv("FLEETWATCH_KAFKA_DEBUG", "cgrp")
    rdkafka_log = logging.getLogger("fleetwatch.bus.rdkafka")
    monkeypatch.setattr(rdkafka_log, "level", logging.NOTSET)  # restored after the test
    caplog.set_level(logging.DEBUG, logger="fleetwatch.bus.rdkafka")
    topic, group = f"cfg.debug.{uuid.uuid4().hex[:8]}", f"debug-{uuid.uuid4().hex[:8]}"
    ensure_topics(kafka_bootstrap, [topic], partitions=1)
    consumer = KafkaBus(kafka_bootstrap).group_consumer(group, client_id="debugged")
    try:
        consumer.subscribe([topic], lambda parts: dict.fromkeys(parts, 0), lambda _p: None)
        deadline = time.monotonic() + 60
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(10, 0.2)
        assert consumer.assignment() == {TopicPart(topic, 0)}
    finally:
        consumer.close()
    said = [r.getMessage() for r in caplog.records if r.name == "fleetwatch.bus.rdkafka"]
    assert any("CGRPJOINSTATE" in m and f'"{group}"' in m and "-> steady" in m for m in said), said[-20:]
