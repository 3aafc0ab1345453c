"""Topics and groups on the real broker, through confluent-kafka's AdminClient: waiting for the broker,
creating fleetwatch's topics with the settings readers depend on, and what tests and tools inspect
(partition counts, topic configs, a group's offsets and members)."""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from fleetwatch import topics
from fleetwatch.bus import TopicPart
from fleetwatch.bus.config import (
    BrokerUnavailable,
    TopicsRefused,
    connect_timeout_s,
    protocol,
    rdkafka_config,
    unavailable,
)

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 10.0
# What a group's coordinator answers, for the request or a partition, while it is being elected or
# is loading the group's offsets (a fresh broker, a moved coordinator), or while a transaction's
# offsets are not settled: asked again, it answers.
_ASK_AGAIN = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.UNSTABLE_OFFSET_COMMIT,
    }
)
# What the broker answers a principal that its ACLs do not allow (the topic's or the cluster's
# Create; a topic it may not Describe is not listed to it, so it looks missing)
_REFUSED = frozenset({KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED})
# where a setting that nobody changed comes from (kafka-python's "modified" filter leaves these out)
_DEFAULT_SOURCES = {
    ConfigSource.DEFAULT_CONFIG,
    ConfigSource.STATIC_BROKER_CONFIG,
    ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG,
}


class Admin:
    """An admin client of the broker at `bootstrap`; BrokerUnavailable (one line) if it does not
    answer within timeout_s with the configured security settings."""

    def __init__(self, bootstrap: str, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.bootstrap = bootstrap
        self.timeout_s = timeout_s
        cfg = rdkafka_config(bootstrap)
        self._client: AdminClient | None = AdminClient(cfg)
        try:  # librdkafka connects lazily and retries for ever: ask now whether the broker answers
            self._client.list_topics(timeout=timeout_s)
        except KafkaException as e:
            self._client = None  # destroyed now: stops its reconnects
            raise BrokerUnavailable(unavailable(bootstrap, protocol(cfg))) from e

    @property
    def client(self) -> AdminClient:
        if self._client is None:
            raise RuntimeError("the admin client is closed")
        return self._client

    def __enter__(self) -> Admin:
        return self

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._client = None  # AdminClient has no close(): the last reference destroys it

    def list_topics(self) -> set[str]:
        return {t for t in self.client.list_topics(timeout=self.timeout_s).topics if not t.startswith("__")}

    def partition_count(self, topic: str) -> int:
        """The topic's partitions; 0 if it does not exist."""
        meta = self.client.list_topics(topic, timeout=self.timeout_s).topics.get(topic)
        return 0 if meta is None or meta.error is not None else len(meta.partitions)

    def create_topics(
        self,
        names: Iterable[str],
        partitions: int = 4,
        replication: int = 1,
        configs: Mapping[str, Mapping[str, str]] | None = None,
    ) -> list[str]:
        """Create the named topics (configs: per topic); one that exists already is left as it is.
        The names created by this call."""
        configs = configs or {}
        new = [
            NewTopic(
                n, num_partitions=partitions, replication_factor=replication, config=dict(configs.get(n, {}))
            )
            for n in names
        ]
        if not new:
            return []
        created: list[str] = []
        refused: list[str] = []
        for name, fut in self.client.create_topics(new, request_timeout=self.timeout_s).items():
            try:
                fut.result()
                created.append(name)
            except KafkaException as e:
                code = e.args[0].code()
                if code in _REFUSED:
                    refused.append(name)
                elif code != KafkaError.TOPIC_ALREADY_EXISTS:  # made by another process meanwhile
                    raise
        if refused:
            raise TopicsRefused(refused)
        self._await_metadata([t.topic for t in new])
        return created

    def _await_metadata(self, names: Sequence[str]) -> None:
        # A topic the controller just created reaches the brokers' metadata a moment later; readers
        # that list its partitions right after ensure_topics would find none.
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            meta = self.client.list_topics(timeout=self.timeout_s).topics
            if all(n in meta and meta[n].error is None and meta[n].partitions for n in names):
                return
            time.sleep(0.1)

    def delete_topics(self, names: Iterable[str]) -> None:
        names = list(names)
        if not names:
            return
        for fut in self.client.delete_topics(names, request_timeout=self.timeout_s).values():
            try:
                fut.result()
            except KafkaException as e:
                if e.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise

    def describe_configs(self, topic: str) -> dict[str, str]:
        """Every setting of the topic (its own and the broker's defaults), name -> value."""
        res = ConfigResource(ConfigResource.Type.TOPIC, topic)
        entries = self.client.describe_configs([res], request_timeout=self.timeout_s)[res].result()
        return {name: e.value for name, e in entries.items() if e.value is not None}

    def modified_configs(self, topic: str) -> dict[str, tuple[str, str]]:
        """The topic's settings that are not the brokers' defaults: name -> (value, where it is set,
        e.g. "DYNAMIC_TOPIC_CONFIG" for the topic's own)."""
        res = ConfigResource(ConfigResource.Type.TOPIC, topic)
        entries = self.client.describe_configs([res], request_timeout=self.timeout_s)[res].result()
        return {
            name: (e.value, ConfigSource(e.source).name)
            for name, e in entries.items()
            if e.value is not None and ConfigSource(e.source) not in _DEFAULT_SOURCES
        }

    def allow(self, grants: Iterable[tuple[str, str, str, str]]) -> None:
        """Create ALLOW ACLs (idempotent; the broker's admin credentials): each grant (principal
        "User:NAME", operation as kafka-acls.sh spells it ("Read", "IdempotentWrite"), resource
        "topic", "group" or "cluster", its literal name ("kafka-cluster" for the cluster))."""
        kinds = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP, "cluster": ResourceType.BROKER}
        bindings = [
            AclBinding(
                kinds[resource],
                name,
                ResourcePatternType.LITERAL,
                principal,
                "*",
                AclOperation["_".join(re.findall(r"[A-Z][a-z]*", operation)).upper()],
                AclPermissionType.ALLOW,
            )
            for principal, operation, resource, name in grants
        ]
        for fut in self.client.create_acls(bindings, request_timeout=self.timeout_s).values():
            fut.result()

    def delete_records(self, part: TopicPart, before: int) -> None:
        """Delete the partition's records before offset `before`: its log then starts there, as
        retention would have made it (what the tests of readers behind a log's start need)."""
        (fut,) = self.client.delete_records(
            [TopicPartition(part.topic, part.partition, before)], request_timeout=self.timeout_s
        ).values()
        fut.result()

    def alter_configs(self, topic: str, configs: Mapping[str, str | None]) -> None:
        """Set these settings of the topic (None: remove the topic's own, back to the broker's
        default); its others stay as they are (an incremental change)."""
        entries = [
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
            if v is not None
            else ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE)
            for k, v in configs.items()
        ]
        res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=entries)
        for fut in self.client.incremental_alter_configs([res], request_timeout=self.timeout_s).values():
            fut.result()

    def group_offsets(self, group: str, parts: Sequence[TopicPart]) -> dict[TopicPart, int]:
        """The group's committed offsets of `parts` (-1: nothing committed).

        Asked through a consumer of the group's id that never subscribes (so never joins the group
        nor commits), not through AdminClient.list_consumer_group_offsets: librdkafka's admin handle
        has no consumer group, and when the broker answers that offset fetch with NOT_COORDINATOR
        (a fresh broker, a coordinator that moved) it asks that missing group to look the
        coordinator up again, a NULL dereference that kills the process (librdkafka issue 5040, in
        2.16; it crashed benchmarks.rsc1 on a loaded CI machine). A consumer's committed() takes the
        same answer through its own group and asks again."""
        if not parts:
            return {}
        consumer = Consumer(rdkafka_config(self.bootstrap) | {"group.id": group, "enable.auto.commit": False})
        asked = [TopicPartition(t.topic, t.partition) for t in parts]
        deadline = time.monotonic() + self.timeout_s
        try:
            while True:
                try:
                    got = consumer.committed(asked, timeout=max(0.1, deadline - time.monotonic()))
                    failed = next((tp.error for tp in got if tp.error is not None), None)
                    if failed is None:
                        break
                    raise KafkaException(failed)
                except KafkaException as e:
                    # librdkafka does not ask again by itself after these; its group has looked the
                    # coordinator up anew by the next try
                    if e.args[0].code() not in _ASK_AGAIN or time.monotonic() >= deadline:
                        raise
                    time.sleep(0.2)
        finally:
            consumer.close()
        return {TopicPart(tp.topic, tp.partition): max(-1, int(tp.offset)) for tp in got}

    def group_members(self, group: str) -> int:
        """How many members the group has now."""
        return self.describe_group(group)[1]

    def describe_group(self, group: str) -> tuple[str, int, int]:
        """The group's state (confluent-kafka's ConsumerGroupState name: "STABLE", "EMPTY", ...), its
        members, and the partitions assigned to them in all."""
        d = self.client.describe_consumer_groups([group], request_timeout=self.timeout_s)[group].result()
        assigned = sum(len(m.assignment.topic_partitions) for m in d.members if m.assignment is not None)
        return d.state.name, len(d.members), assigned


def wait_for_broker(bootstrap: str, timeout_s: float | None = None) -> None:
    """Block until an admin client can talk to the broker, or raise BrokerUnavailable.

    timeout_s defaults to connect_timeout_s()."""
    timeout_s = connect_timeout_s() if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while True:
        try:
            with Admin(bootstrap, timeout_s=max(0.5, deadline - time.monotonic())) as admin:
                admin.list_topics()
            return
        except (BrokerUnavailable, KafkaException, OSError) as e:
            last = e
        if time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    raise BrokerUnavailable(f"no Kafka broker answered at {bootstrap} within {timeout_s:.0f} s ({last})")


def topic_configs(name: str) -> dict[str, str]:
    """The configuration fleetwatch creates a topic with."""
    cfg: dict[str, str] = {}
    if name in topics.COMPACTED:
        cfg["cleanup.policy"] = "compact"
    if name in topics.BROKER_TIMED:
        cfg["message.timestamp.type"] = "LogAppendTime"
    if name == topics.CONTROL:  # every record of a pause's life, for as long as a pause can last
        cfg["cleanup.policy"] = "delete"
        cfg["retention.ms"] = str(int(topics.CONTROL_RETENTION_S * 1000))
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
    if name == topics.CONTROL:  # a shorter retention would forget a pause still in force
        cfg.update(topic_configs(name))
    return cfg


def ensure_topics(
    bootstrap: str, names: Iterable[str] = topics.ALL, partitions: int = 4, replication: int | None = None
) -> None:
    """Create the topics that are missing, with topic_configs(); and put kept_configs() on the
    existing ones where they do not hold (LogAppendTime on BROKER_TIMED topics, compaction of the
    jobs topic: topics made before these were set, or by someone else).

    A service passes the topics it uses: with the ACLs docs/security.md recommends it may see only
    those, and any other would look missing to it and be refused when created. TopicsRefused (one
    line for the user) where a topic it needs is missing to it and it may not create it. A principal
    that may not read or change the settings (no DescribeConfigs / AlterConfigs: the admin made the
    topics) leaves them to the admin, saying so once at info level.

    Replication defaults to FLEETWATCH_KAFKA_REPLICATION, else 1 (the local single-node broker).
    """
    names = list(names)
    replication = replication or int(os.environ.get("FLEETWATCH_KAFKA_REPLICATION", "1"))
    with Admin(bootstrap) as admin:
        existing = admin.list_topics()
        missing = [n for n in names if n not in existing]
        created = admin.create_topics(
            missing, partitions, replication, {n: topic_configs(n) for n in missing}
        )
        if created:
            log.info("created topics %s", created)
        kept = {n: kept_configs(n) for n in names if n in existing}
        _keep_configs(admin, {n: cfg for n, cfg in kept.items() if cfg})


def _keep_configs(admin: Admin, kept: dict[str, dict[str, str]]) -> None:
    # Only the settings that do not hold are set (an incremental SET: the topic's others stay), so
    # a service without AlterConfigs on topics the admin made right is not refused at each start.
    unchecked: list[str] = []
    for name, cfg in kept.items():
        try:
            current = admin.describe_configs(name)
        except KafkaException as e:
            if e.args[0].code() not in _REFUSED:
                raise
            unchecked.append(name)
            continue
        cfg = {k: v for k, v in cfg.items() if current.get(k) != v}
        if not cfg:
            continue
        try:
            admin.alter_configs(name, cfg)
        except (KafkaException, ValueError) as e:
            log.warning(
                "could not set %s on %s (%s): without LogAppendTime clock checks of their records "
                "use the reader's clock instead of the broker's; without compaction the jobs topic "
                "keeps every job ever run, and workers start slower as it grows",
                cfg,
                name,
                e,
            )
    if unchecked:
        log.info(
            "the settings of %s are not checked: this principal may not read them (the Kafka admin "
            "makes the topics with them, docs/deploy.md 1.4)",
            ", ".join(unchecked),
        )
