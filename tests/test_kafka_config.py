"""Kafka security settings come from the environment and reach every client."""

from __future__ import annotations

import pytest

from fleetwatch import kafka_io


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
    cfg = kafka_io.client_config("b1:9093,b2:9093", env)
    assert cfg["bootstrap_servers"] == ["b1:9093", "b2:9093"]
    assert cfg["security_protocol"] == "SASL_SSL"
    assert cfg["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (cfg["sasl_plain_username"], cfg["sasl_plain_password"]) == ("fleetwatch", "s3cret")
    assert (cfg["ssl_cafile"], cfg["ssl_certfile"], cfg["ssl_keyfile"]) == (
        "/etc/ca.pem",
        "/etc/cert.pem",
        "/etc/key.pem",
    )


def test_plaintext_by_default() -> None:
    cfg = kafka_io.client_config("127.0.0.1:19092", {})
    assert "security_protocol" not in cfg and "sasl_mechanism" not in cfg


def test_every_client_is_built_with_them(kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Producer, consumer and admin all take client_config(): the local broker speaks PLAINTEXT, so
    each of them reaches it as configured and fails once SSL is asked for (nothing falls back)."""
    fast = 2000
    makers = (
        lambda: kafka_io.make_producer(kafka_bootstrap, bootstrap_timeout_ms=fast),
        lambda: kafka_io.make_consumer(kafka_bootstrap, bootstrap_timeout_ms=fast),
        lambda: kafka_io.make_admin(kafka_bootstrap, timeout_ms=fast),
    )
    for make in makers:
        make().close()
    monkeypatch.setenv("FLEETWATCH_KAFKA_SECURITY_PROTOCOL", "SSL")
    for make in makers:
        with pytest.raises(kafka_io.BrokerUnavailable):
            make()
