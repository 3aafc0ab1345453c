"""Kafka client construction shared by every command: one place for bootstrap, security and topics.

Security settings (DESIGN.md issue 6) come from the environment so that no secret sits on a
command line: FLEETWATCH_KAFKA_SECURITY_PROTOCOL (PLAINTEXT|SSL|SASL_PLAINTEXT|SASL_SSL),
FLEETWATCH_KAFKA_SASL_MECHANISM, FLEETWATCH_KAFKA_SASL_USERNAME, FLEETWATCH_KAFKA_SASL_PASSWORD,
FLEETWATCH_KAFKA_SSL_CAFILE, FLEETWATCH_KAFKA_SSL_CERTFILE, FLEETWATCH_KAFKA_SSL_KEYFILE.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic
from kafka.errors import KafkaError, KafkaTimeoutError, TopicAlreadyExistsError

from fleetwatch import topics

log = logging.getLogger(__name__)

# FLEETWATCH_KAFKA_* -> (kafka-python's setting, librdkafka's: fleetwatch/bus/kafka.py)
SECURITY_SETTINGS = {
    "FLEETWATCH_KAFKA_SECURITY_PROTOCOL": ("security_protocol", "security.protocol"),
    "FLEETWATCH_KAFKA_SASL_MECHANISM": ("sasl_mechanism", "sasl.mechanism"),
    "FLEETWATCH_KAFKA_SASL_USERNAME": ("sasl_plain_username", "sasl.username"),
    "FLEETWATCH_KAFKA_SASL_PASSWORD": ("sasl_plain_password", "sasl.password"),
    "FLEETWATCH_KAFKA_SSL_CAFILE": ("ssl_cafile", "ssl.ca.location"),
    "FLEETWATCH_KAFKA_SSL_CERTFILE": ("ssl_certfile", "ssl.certificate.location"),
    "FLEETWATCH_KAFKA_SSL_KEYFILE": ("ssl_keyfile", "ssl.key.location"),
}


COMPRESSION = "zstd"  # every fleetwatch producer's codec (fleetwatch/bus/kafka.py uses it too)


class BrokerUnavailable(RuntimeError):
    """The bootstrap servers did not answer; the message is one line for the user."""


def client_config(bootstrap: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    env = os.environ if env is None else env
    # kafka-python 3.0 raises KafkaTimeoutError from a constructor that cannot bootstrap in time.
    cfg: dict[str, Any] = {"bootstrap_servers": bootstrap.split(","), "bootstrap_timeout_ms": 10000}
    for var, (key, _rdkafka) in SECURITY_SETTINGS.items():
        if env.get(var):
            cfg[key] = env[var]
    return cfg


def unavailable(bootstrap: str, protocol: str = "PLAINTEXT") -> str:
    """The one-line reason for a bootstrap that failed. Both clients report a refused SASL login
    or TLS handshake as the same timeout as a broker that is down, so where security is configured
    (`protocol`) the message says which settings to check (never their values)."""
    msg = f"no Kafka broker answered at {bootstrap}"
    if protocol == "PLAINTEXT":
        return msg
    what = {
        "SSL": "the CA, certificate and key (FLEETWATCH_KAFKA_SSL_*)",
        "SASL_PLAINTEXT": "the SASL mechanism, user and password (FLEETWATCH_KAFKA_SASL_*)",
    }.get(protocol, "the SASL credentials and TLS files (FLEETWATCH_KAFKA_SASL_*, FLEETWATCH_KAFKA_SSL_*)")
    return f"{msg} over {protocol}: it may be down, or it refused the connection; check {what}"


def make_producer(bootstrap: str, **overrides: Any) -> KafkaProducer:
    cfg = client_config(bootstrap)
    # acks=all + idempotence: a sample acknowledged by the broker is on every in-sync replica once.
    # zstd: ~1/10 of the bytes on the broker for telemetry (benchmarks/README.md, "Kafka clients").
    cfg.update(acks="all", enable_idempotence=True, linger_ms=5, compression_type=COMPRESSION)
    cfg.update(overrides)
    try:
        return KafkaProducer(**cfg)
    except KafkaTimeoutError as e:
        raise BrokerUnavailable(unavailable(bootstrap, cfg.get("security_protocol", "PLAINTEXT"))) from e


def make_consumer(bootstrap: str, *subscribe: str, **overrides: Any) -> KafkaConsumer:
    cfg = client_config(bootstrap)
    cfg.update(enable_auto_commit=False, auto_offset_reset="earliest")
    cfg.update(overrides)
    try:
        consumer = KafkaConsumer(**cfg)
    except KafkaTimeoutError as e:
        raise BrokerUnavailable(unavailable(bootstrap, cfg.get("security_protocol", "PLAINTEXT"))) from e
    if subscribe:
        subscribe_with_metadata(consumer, list(subscribe))
    return consumer


def subscribe_with_metadata(consumer: KafkaConsumer, topic_names: list[str], listener: Any = None) -> None:
    """Subscribe `consumer` to `topic_names` and load their metadata before it joins the group.

    kafka-python 3 tracks the subscribed topics' partitions from metadata responses that arrive
    after subscribe(). A join before the first one gets an empty assignment (or one the leader
    thinks stale) and rejoins at once when the response lands; that quick second join sometimes
    never completed (4 of 16 fresh groups started as the demo starts them had no partitions after
    10 s; one watched for 80 s never recovered, its poll() blocked in send_fetches with the IO
    thread idle; 0 of 20 stalled with this). The join starts at the first poll(), so one blocking
    metadata fetch here, after subscribe(), gives it the partitions. A member stuck like that
    shows 0 in fleetwatch_worker_partitions (rule FleetwatchGroupOwnsNoPartitions)."""
    consumer.subscribe(topic_names, listener=listener)
    consumer.topics()  # always a metadata round trip (partitions_for_topic would use the cache)


def make_admin(bootstrap: str, timeout_ms: int = 10000) -> KafkaAdminClient:
    cfg = client_config(bootstrap)
    cfg["bootstrap_timeout_ms"] = min(timeout_ms, cfg["bootstrap_timeout_ms"])
    try:
        return KafkaAdminClient(**cfg, request_timeout_ms=10000)
    except KafkaTimeoutError as e:
        raise BrokerUnavailable(unavailable(bootstrap, cfg.get("security_protocol", "PLAINTEXT"))) from e


def connect_timeout_s(default: float = 30.0) -> float:
    """How long commands wait for the broker at start: FLEETWATCH_CONNECT_TIMEOUT_S, else `default`."""
    return float(os.environ.get("FLEETWATCH_CONNECT_TIMEOUT_S", default))


def wait_for_broker(bootstrap: str, timeout_s: float | None = None) -> None:
    """Block until an admin client can talk to the broker, or raise BrokerUnavailable.

    timeout_s defaults to connect_timeout_s()."""
    timeout_s = connect_timeout_s() if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            admin = make_admin(bootstrap, timeout_ms=int(max(0.5, deadline - time.monotonic()) * 1000))
            admin.list_topics()
            admin.close()
            return
        except (BrokerUnavailable, KafkaError, OSError) as e:
            last = e
            time.sleep(0.5)
    raise BrokerUnavailable(f"no Kafka broker answered at {bootstrap} within {timeout_s:.0f} s ({last})")


LOG_APPEND_TIME = 1  # ConsumerRecord.timestamp_type of a record the broker timestamped


def topic_configs(name: str) -> dict[str, str]:
    """The configuration fleetwatch creates a topic with."""
    cfg: dict[str, str] = {}
    if name in topics.COMPACTED:
        cfg["cleanup.policy"] = "compact"
    if name in topics.BROKER_TIMED:
        cfg["message.timestamp.type"] = "LogAppendTime"
    return cfg


def kept_configs(name: str) -> dict[str, str]:
    """The part of topic_configs() that ensure_topics also puts on a topic that already exists:
    what readers depend on. LogAppendTime on BROKER_TIMED topics (the clock checks); compaction of
    the jobs topic, which every worker reads whole at start (a topic made before it was compacted,
    or by someone else, would grow with every job ever run; `compact,delete` would also drop the
    start of a job running longer than the retention)."""
    cfg = {k: v for k, v in topic_configs(name).items() if k == "message.timestamp.type"}
    if name == topics.JOBS:
        cfg["cleanup.policy"] = "compact"
    return cfg


def reference_time(record: Any, now: float) -> float:
    """A consumed record's reference time for clock checks (seconds): when the broker appended it,
    or `now` where its topic keeps the producer's time (see topics.BROKER_TIMED)."""
    if record.timestamp_type == LOG_APPEND_TIME:
        return float(record.timestamp) / 1000.0
    return now


def ensure_topics(
    bootstrap: str, names: Iterable[str] = topics.ALL, partitions: int = 4, replication: int | None = None
) -> None:
    """Create the topics that are missing, with topic_configs(); and put kept_configs() on the
    existing ones (LogAppendTime on BROKER_TIMED topics, compaction of the jobs topic: topics made
    before these were set, or by someone else).

    Replication defaults to FLEETWATCH_KAFKA_REPLICATION, else 1 (the local single-node broker).
    """
    names = list(names)
    replication = replication or int(os.environ.get("FLEETWATCH_KAFKA_REPLICATION", "1"))
    admin = make_admin(bootstrap)
    try:
        existing = set(admin.list_topics())
        new = [
            NewTopic(
                name,
                num_partitions=partitions,
                replication_factor=replication,
                topic_configs=topic_configs(name),
            )
            for name in names
            if name not in existing
        ]
        if new:
            with contextlib.suppress(TopicAlreadyExistsError):  # another process created them meanwhile
                admin.create_topics(new)
            log.info("created topics %s", [t.name for t in new])
        kept = {n: kept_configs(n) for n in names if n in existing}
        kept = {n: cfg for n, cfg in kept.items() if cfg}
        if kept:
            _keep_configs(admin, kept)
    finally:
        admin.close()


def _keep_configs(admin: KafkaAdminClient, kept: dict[str, dict[str, str]]) -> None:
    # An incremental SET (kafka-python uses IncrementalAlterConfigs where the broker has it, which
    # every 2.3+ broker does): the topic's other settings stay as they are. Idempotent.
    resources = [ConfigResource(ConfigResourceType.TOPIC, n, configs=dict(cfg)) for n, cfg in kept.items()]
    try:
        admin.alter_configs(resources)
    except (KafkaError, ValueError) as e:
        log.warning(
            "could not set %s (%s): without LogAppendTime clock checks of their records use the "
            "reader's clock instead of the broker's; without compaction the jobs topic keeps every "
            "job ever run, and workers start slower as it grows",
            kept,
            e,
        )
