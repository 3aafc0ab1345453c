"""What `act` already asked for: the latest signed drain/1 request per node on scheduler.drain.v1.

A restarted act restores its snapshot and replays the findings since; the drains it decides in
the replay can differ from those it made before the crash (partitions can be replayed in another
order than they were first processed, and the budget depends on that order). The requests it
already produced are facts, though: reading them back and adopting them before the first decision
(alerts/actor.py) makes the replay start from what was really requested, so the budget holds and
no second node is drained in place of the first. The topic is keyed by node, so its order per node
is the order of the requests; it is small (one message per drain or resume).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from kafka import TopicPartition

from alerts import drain_request
from fleetwatch import schemas

log = logging.getLogger(__name__)


def latest_requests(
    consumer_factory: Callable[[], Any], topic: str, key: bytes, timeout_s: float = 30.0
) -> dict[str, dict[str, Any]]:
    """node -> its latest request that carries a valid signature (anything else is ignored)."""
    consumer = consumer_factory()
    latest: dict[str, dict[str, Any]] = {}
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        if not tps:
            return latest
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        end = consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < end[tp] for tp in tps):
            if time.monotonic() > deadline:
                log.warning("timed out reading %s; adopting what was read", topic)
                break
            for batch in consumer.poll(timeout_ms=200).values():
                for r in batch:
                    try:
                        msg = schemas.decode(r.value, drain_request.DRAIN)
                    except schemas.MessageError:
                        continue
                    if drain_request.verify(msg, key):
                        latest[msg["node"]] = msg
    finally:
        consumer.close()
    return latest
