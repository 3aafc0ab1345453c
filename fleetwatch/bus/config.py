"""Where every fleetwatch Kafka client connects and how: bootstrap, security, codec, and the one-line
error for a broker that does not answer. No client here (fleetwatch/bus/kafka.py and admin.py build
them from rdkafka_config).

Security settings come from the environment so that no secret sits on a command line:
FLEETWATCH_KAFKA_SECURITY_PROTOCOL (PLAINTEXT|SSL|SASL_PLAINTEXT|SASL_SSL),
FLEETWATCH_KAFKA_SASL_MECHANISM, FLEETWATCH_KAFKA_SASL_USERNAME, FLEETWATCH_KAFKA_SASL_PASSWORD,
FLEETWATCH_KAFKA_SSL_CAFILE, FLEETWATCH_KAFKA_SSL_CERTFILE, FLEETWATCH_KAFKA_SSL_KEYFILE.
FLEETWATCH_KAFKA_DEBUG sets librdkafka's debug contexts, for diagnosing a client.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

# FLEETWATCH_KAFKA_* -> librdkafka's setting
SECURITY_SETTINGS = {
    "FLEETWATCH_KAFKA_SECURITY_PROTOCOL": "security.protocol",
    "FLEETWATCH_KAFKA_SASL_MECHANISM": "sasl.mechanism",
    "FLEETWATCH_KAFKA_SASL_USERNAME": "sasl.username",
    "FLEETWATCH_KAFKA_SASL_PASSWORD": "sasl.password",
    "FLEETWATCH_KAFKA_SSL_CAFILE": "ssl.ca.location",
    "FLEETWATCH_KAFKA_SSL_CERTFILE": "ssl.certificate.location",
    "FLEETWATCH_KAFKA_SSL_KEYFILE": "ssl.key.location",
}

# every fleetwatch producer's codec: ~1/10 of the bytes on the broker for telemetry
# (benchmarks/README.md, "Kafka clients")
COMPRESSION = "zstd"


class BrokerUnavailable(RuntimeError):
    """The bootstrap servers did not answer; the message is one line for the user."""


class TopicsRefused(RuntimeError):
    """Topics a service uses are missing to it and it may not create them: the broker's ACLs do not
    let this principal see (Describe) or create them. The message is one line for the user."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        super().__init__(
            f"topic(s) {', '.join(names)}: missing, or not visible to this principal, and it may not "
            "create them; the Kafka admin creates the topics and grants each service Describe on the "
            "topics it uses (docs/security.md, docs/deploy.md 1.4)"
        )


class ConfigError(ValueError):
    """The client refused its settings (an unknown or invalid librdkafka setting)."""


def rdkafka_config(bootstrap: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """librdkafka's settings for `bootstrap` with the FLEETWATCH_KAFKA_* security settings."""
    env = os.environ if env is None else env
    # librdkafka's own log lines (connection failures, retries) go to Python logging, not stderr
    cfg: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "logger": logging.getLogger("fleetwatch.bus.rdkafka"),
    }
    for var, key in SECURITY_SETTINGS.items():
        if env.get(var):
            cfg[key] = env[var]
    if env.get("FLEETWATCH_KAFKA_DEBUG"):  # librdkafka's debug contexts, e.g. "cgrp" (loud)
        cfg["debug"] = env["FLEETWATCH_KAFKA_DEBUG"]
        # its lines come at DEBUG, under the INFO the commands log at
        logging.getLogger("fleetwatch.bus.rdkafka").setLevel(logging.DEBUG)
    return cfg


def protocol(cfg: Mapping[str, Any]) -> str:
    return str(cfg.get("security.protocol", "PLAINTEXT")).upper()


def unavailable(bootstrap: str, protocol: str = "PLAINTEXT") -> str:
    """The one-line reason for a bootstrap that failed. librdkafka reports a refused SASL login or
    TLS handshake as the same timeout as a broker that is down, so where security is configured
    (`protocol`) the message says which settings to check (never their values)."""
    msg = f"no Kafka broker answered at {bootstrap}"
    if protocol == "PLAINTEXT":
        return msg
    what = {
        "SSL": "the CA, certificate and key (FLEETWATCH_KAFKA_SSL_*)",
        "SASL_PLAINTEXT": "the SASL mechanism, user and password (FLEETWATCH_KAFKA_SASL_*)",
    }.get(protocol, "the SASL credentials and TLS files (FLEETWATCH_KAFKA_SASL_*, FLEETWATCH_KAFKA_SSL_*)")
    return f"{msg} over {protocol}: it may be down, or it refused the connection; check {what}"


def connect_timeout_s(default: float = 30.0) -> float:
    """How long commands wait for the broker at start: FLEETWATCH_CONNECT_TIMEOUT_S, else `default`."""
    return float(os.environ.get("FLEETWATCH_CONNECT_TIMEOUT_S", default))
