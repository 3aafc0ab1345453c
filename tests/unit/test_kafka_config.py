"""Kafka security settings come from the environment (kafka_io.client_config). That they reach
every client, and work against real SASL and mutual-TLS listeners: tests/integration/test_kafka_config.py."""

from __future__ import annotations

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
