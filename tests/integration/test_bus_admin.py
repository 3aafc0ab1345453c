"""A group's committed offsets as fleetwatch/bus/admin.py reads them on the real broker (scale
tests and benchmarks wait on them): -1 where the group committed nothing, the committed offset
elsewhere, and the asking never joins the group. They are read through a consumer's committed(),
not the admin API that crashes librdkafka on a NOT_COORDINATOR answer (test_one_kafka_client.py)."""

from __future__ import annotations

import uuid

from fleetwatch.bus import TopicPart
from fleetwatch.bus.admin import Admin, ensure_topics
from tests.integration.services import commit_offsets, send


def test_group_offsets_are_the_commits_and_minus_one_where_none(kafka_bootstrap: str) -> None:
    topic = f"admin.offsets.{uuid.uuid4().hex[:8]}"
    ensure_topics(kafka_bootstrap, [topic], partitions=2)
    send(kafka_bootstrap, topic, [(b"k", b"v")] * 3)
    group = f"offsets-{uuid.uuid4().hex}"
    first, second = TopicPart(topic, 0), TopicPart(topic, 1)
    with Admin(kafka_bootstrap) as admin:
        assert admin.group_offsets(group, [first, second]) == {first: -1, second: -1}
        commit_offsets(kafka_bootstrap, group, {first: 2})
        assert admin.group_offsets(group, [first, second]) == {first: 2, second: -1}
        assert admin.group_offsets(group, []) == {}
        assert admin.describe_group(group)[1] == 0  # asking is not a member
