"""What `act` already asked for: the latest signed drain/1 request per node on scheduler.drain.v1.

A restarted act restores its snapshot and replays the findings since; the drains it decides in
the replay can differ from those it made before the crash (partitions can be replayed in another
order than they were first processed, and the budget depends on that order). The requests it
already produced are facts, though: reading them back and adopting them before the first decision
(alerts/actor.py) makes the replay start from what was really requested, so the budget holds and
no second node is drained in place of the first. The topic is keyed by node, so its order per node
is the order of the requests; it is small (one message per drain or resume).

What became of each request is on the adapter's results topic (scheduler.drain.results.v1,
drain_result/1): `ResultBook` holds the latest signed result per request id, fed from the whole
topic by a follower thread (fleetwatch/follow.py) that act starts before its first decision, so a
restarted act knows which drains were confirmed and which were refused (stale, unknown node, ...).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kafka import TopicPartition

from fleetwatch import schemas
from fleetwatch.alerts import drain_request, drain_result

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


@dataclass(frozen=True)
class Result:
    request_id: str
    node: str
    action: str
    outcome: str
    detail: str


class ResultBook:
    """request_id -> the adapter's result for it, from scheduler.drain.results.v1 (thread-safe)."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._lock = threading.Lock()
        self._by_id: dict[str, Result] = {}

    def apply(self, _key: bytes | None, value: bytes | None) -> None:
        """One record of the results topic; unsigned, forged or malformed ones are ignored."""
        if value is None:
            return
        try:
            m = schemas.decode(value, drain_result.DRAIN_RESULT)
        except schemas.MessageError as e:
            log.debug("ignoring a bad drain result: %s", e)
            return
        if not drain_request.verify(m, self._key):
            log.warning("ignoring a drain result for %s with a bad signature", m["node"])
            return
        if m["outcome"] == drain_result.DUPLICATE:
            return  # says only that the request was handled before; its first result is the answer
        r = Result(m["request_id"], m["node"], m["action"], m["outcome"], m["detail"])
        with self._lock:
            old = self._by_id.get(r.request_id)
            if old is None or old.outcome != drain_result.EXECUTED:  # done is done
                self._by_id[r.request_id] = r

    def get(self, request_id: str) -> Result | None:
        return self._by_id.get(request_id)
