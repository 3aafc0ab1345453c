"""Moved: Kafka access is fleetwatch/bus (the one client, confluent-kafka). This module only keeps
the old names of what moved, client-free, for callers not yet switched (see /tmp/fw/bus_api.md's
table): configuration and errors in fleetwatch/bus/config.py, topics in fleetwatch/bus/admin.py.
It goes once nothing imports it."""

from __future__ import annotations

from fleetwatch.bus import reference_time
from fleetwatch.bus.admin import ensure_topics, kept_configs, topic_configs, wait_for_broker
from fleetwatch.bus.config import (
    COMPRESSION,
    SECURITY_SETTINGS,
    BrokerUnavailable,
    connect_timeout_s,
    unavailable,
)

__all__ = [
    "COMPRESSION",
    "SECURITY_SETTINGS",
    "BrokerUnavailable",
    "connect_timeout_s",
    "ensure_topics",
    "kept_configs",
    "reference_time",
    "topic_configs",
    "unavailable",
    "wait_for_broker",
]
