"""Kafka security settings come from the environment (fleetwatch.bus.config.rdkafka_config), in
librdkafka's names, for every client of the bus. That they reach every client, and work against
real SASL and mutual-TLS listeners: tests/integration/test_kafka_config.py."""

from __future__ import annotations

import logging

import pytest

from fleetwatch.bus.config import rdkafka_config, unavailable


def test_security_settings_from_the_environment() -> None:
    env = {
        "FLEETWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "FLEETWATCH_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "FLEETWATCH_KAFKA_SASL_USERNAME": "fleetwatch",
        "FLEETWATCH_KAFKA_SASL_PASSWORD": "s3cret",
        "FLEETWATCH_KAFKA_SSL_CAFILE": "/etc/ca.pem",
        "FLEETWATCH_KAFKA_SSL_CERTFILE": "/etc/cert.pem",
        "FLEETWATCH_KAFKA_SSL_KEYFILE": "/etc/key.pem",
    }
    cfg = rdkafka_config("b1:9093,b2:9093", env)
    assert cfg["bootstrap.servers"] == "b1:9093,b2:9093"
    assert cfg["security.protocol"] == "SASL_SSL"
    assert cfg["sasl.mechanism"] == "SCRAM-SHA-512"
    assert (cfg["sasl.username"], cfg["sasl.password"]) == ("fleetwatch", "s3cret")
    assert (cfg["ssl.ca.location"], cfg["ssl.certificate.location"], cfg["ssl.key.location"]) == (
        "/etc/ca.pem",
        "/etc/cert.pem",
        "/etc/key.pem",
    )


def test_plaintext_by_default() -> None:
    cfg = rdkafka_config("127.0.0.1:19092", {})
    assert "security.protocol" not in cfg and "sasl.mechanism" not in cfg
    assert not any(k.startswith(("ssl.", "sasl.")) for k in cfg)


def test_librdkafkas_debug_contexts_from_the_environment_and_its_lines_logged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """FLEETWATCH_KAFKA_DEBUG, for diagnosing a client (a stalled rebalance: `cgrp`): librdkafka
    takes the contexts (on the real broker: tests/integration/test_kafka_config.py), and its lines
    (level 7, DEBUG) pass the INFO the commands log at."""
    rdkafka_log = logging.getLogger("fleetwatch.bus.rdkafka")
    monkeypatch.setattr(rdkafka_log, "level", logging.NOTSET)  # restored after the test
    assert "debug" not in rdkafka_config("127.0.0.1:1", {})
    cfg = rdkafka_config("127.0.0.1:1", {"FLEETWATCH_KAFKA_DEBUG": "cgrp,fetch"})
    assert cfg["debug"] == "cgrp,fetch" and rdkafka_log.level == logging.DEBUG


def test_the_unavailable_line_names_the_settings_to_check_never_their_values() -> None:
    assert unavailable("b:9092") == "no Kafka broker answered at b:9092"
    line = unavailable("b:9093", "SASL_SSL")
    assert "\n" not in line and "FLEETWATCH_KAFKA_SASL_*" in line and "FLEETWATCH_KAFKA_SSL_*" in line
    assert "FLEETWATCH_KAFKA_SSL_*" in unavailable("b:9093", "SSL")
