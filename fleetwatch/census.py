"""The census of reporting nodes: `node/1` on the compacted topic fleet.nodes.v1 (key = node).

The detect workers publish `{"schema": "node/1", "node": NAME, "first_seen": unix_s,
"last_seen": unix_s}` (event time) for every node that sends telemetry, again at least every 10
minutes, and a tombstone (null value) when they forget a node. The census is the fleet: `act`
sizes the drain budget on it and never drains a node it does not list, so a `job/1` naming
thousands of ghost nodes, or findings about nodes that never reported, change nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from fleetwatch import schemas

log = logging.getLogger(__name__)

NODE = "node/1"


def validate_node(m: Mapping[str, Any]) -> None:
    schemas._required(m, "node", ("node", "first_seen", "last_seen"))
    schemas._name("node.node", m["node"])
    schemas._ts("node.first_seen", m["first_seen"])
    schemas._ts("node.last_seen", m["last_seen"])
    if m["last_seen"] < m["first_seen"]:
        raise schemas.MessageError("out_of_range", "node.last_seen is before node.first_seen")


schemas.register(NODE, validate_node, "last_seen", key_field="node")


def node_message(node: str, first_seen: float, last_seen: float) -> dict[str, Any]:
    """A valid node/1 message (what the detect workers publish; tests use it too)."""
    m = {"schema": NODE, "node": node, "first_seen": float(first_seen), "last_seen": float(last_seen)}
    validate_node(m)
    return m


class Census:
    """Node -> last_seen, kept current by a TopicFollower (fleetwatch/follow.py) on fleet.nodes.v1."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_seen: dict[str, float] = {}

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        """One record of the topic: a node/1 adds or refreshes its node, a tombstone removes it."""
        if key is None:
            return
        node = key.decode("utf-8", "replace")
        if value is None:
            with self._lock:
                self._last_seen.pop(node, None)
            return
        try:
            # the key must be the node: compaction keeps by key, so a mismatch would never be forgotten
            m = schemas.decode(value, NODE, key=key)
        except schemas.MessageError as e:
            log.debug("ignoring bad census record for %r: %s", node, e)
            return
        with self._lock:
            self._last_seen[node] = max(m["last_seen"], self._last_seen.get(node, 0.0))

    def __contains__(self, node: object) -> bool:
        return node in self._last_seen

    def __len__(self) -> int:
        return len(self._last_seen)

    def __iter__(self) -> Iterator[str]:
        return iter(self.nodes())

    def nodes(self) -> set[str]:
        with self._lock:
            return set(self._last_seen)
