"""What `act` already asked for: the latest signed drain/1 request per node on scheduler.drain.v1.

A restarted act restores its snapshot and replays the findings since; the drains it decides in
the replay can differ from those it made before the crash (partitions can be replayed in another
order than they were first processed, and the budget depends on that order). The requests it
already produced are facts, though: reading them back and adopting them before the first decision
(alerts/actor.py) makes the replay start from what was really requested, so the budget holds and
no second node is drained in place of the first. The topic is keyed by node, so its order per node
is the order of the requests; it is small (one message per drain or resume).

What became of each request is on the adapter's results topic (scheduler.drain.results.v1,
drain_result/1): `ResultBook` holds the signed results by (request id, request signature and the
node each names), fed
from the whole topic by a follower thread (fleetwatch/follow.py) that act starts before its first
decision, so a restarted act knows which drains were confirmed and which were refused (stale,
unknown node, ...). A result is looked up only for a request act issued, by that request's id AND
signature (alerts/actor.py): request ids are predictable from finding ids, so an id alone would let
an answer written before (or for another copy of) the request pre-empt it; the signature, an HMAC
over the whole request, cannot be predicted, and the adapter puts it into a result only after it
verified it. Results without it (an adapter of an earlier release, which also signed answers to
forged requests) are never applied. An answer bound to a request that names another node (a
defective adapter) is kept apart from the answer naming the request's own node: it is counted, never
filed, and cannot stand in the way of the genuine answer behind it.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from fleetwatch import schemas
from fleetwatch.alerts import drain_request, drain_result
from fleetwatch.alerts.act_metrics import ActMetrics
from fleetwatch.bus import Bus, TopicPart
from fleetwatch.refusal_log import RefusalLog

log = logging.getLogger(__name__)


def latest_requests(
    bus: Bus, topic: str, key: bytes, timeout_s: float = 30.0, dry_run: bool = False
) -> dict[str, dict[str, Any]]:
    """node -> its latest request that carries a valid signature (anything else is ignored), of
    this act's mode: a live act never adopts a would-be request of `act --dry-run`, nor the other
    way round."""
    reader = bus.reader()
    latest: dict[str, dict[str, Any]] = {}
    try:
        tps = [TopicPart(topic, p) for p in reader.partitions(topic)]
        if not tps:
            return latest
        reader.assign(tps, "beginning")
        end = reader.end_offsets(tps)
        deadline = time.monotonic() + timeout_s
        while any(reader.position(tp) < end[tp] for tp in tps):
            if time.monotonic() > deadline:
                log.warning("timed out reading %s; adopting what was read", topic)
                break
            for r in reader.poll(0.2):
                if r.value is None:
                    continue
                try:
                    msg = schemas.decode(r.value, drain_request.DRAIN)
                except schemas.MessageError:
                    continue
                if bool(msg.get(schemas.DRY_RUN)) != dry_run:
                    continue
                if drain_request.verify(msg, key):
                    latest[msg["node"]] = msg
    finally:
        reader.close()
    return latest


@dataclass(frozen=True)
class Result:
    request_id: str
    node: str
    action: str
    outcome: str
    detail: str
    request_signature: str  # the signature of the request this answers
    ts: float = 0.0  # the adapter's clock when it answered
    # when the broker took the answer (scheduler.drain.results.v1 is LogAppendTime); None: not known
    # (a topic that keeps the producer's time)
    seen: float | None = None


# answers a duplicate is never resolved to (a deferral is handled afresh when asked again)
NOT_FIRST = frozenset({drain_result.DUPLICATE, drain_result.DEFERRED})
MAX_ANSWERS = 8  # copies of a request (its id, another signature) whose answers are kept
MAX_NODES_NAMED = 4  # answers kept per copy: the one naming the request's node, a few naming others
# request ids kept, the first answered leaving first: a node's state keeps what its answer decided
# (confirmed, refused), and only its latest request is looked up, so an old id is not needed again;
# years of drains of a large fleet, with a bound on a long-running act's memory
MAX_REQUESTS = 100_000


class ResultBook:
    """(request_id, request signature) -> the adapter's answers, one per node named, from
    scheduler.drain.results.v1 (thread-safe: a follower thread applies, act's worker thread reads)."""

    def __init__(self, key: bytes, metrics: ActMetrics | None = None) -> None:
        self._key = key
        # what it ignores is counted in fleetwatch_act_drain_results_ignored_total (act's registry)
        self._ignored = (metrics or ActMetrics()).results_ignored
        self._lock = threading.Lock()
        self._refusals = RefusalLog(log)  # a flood of them must not flood the log
        # request id -> request signature (a copy of the request) -> node named -> the answer
        self._by_id: dict[str, dict[str, dict[str, Result]]] = {}

    def apply(
        self, _key: bytes | None, value: bytes | None, now: float | None = None, broker: bool = False
    ) -> None:
        """One record of the results topic; unsigned, forged, unbound or malformed ones are ignored.
        `now`, where `broker` says it is when the broker took the record (act's follower,
        follow.BrokerTimedFollower, on a LogAppendTime topic), is kept with it; a reading time is not:
        it orders nothing across a restart."""
        seen = now if broker else None
        if value is None:
            return
        try:
            m = schemas.decode(value, drain_result.DRAIN_RESULT)
        except schemas.MessageError as e:
            self._ignored.labels("malformed").inc()
            log.debug("ignoring a bad drain result: %s", e)
            return
        if not drain_request.verify(m, self._key):
            self._ignored.labels("bad_signature").inc()
            self._refusals("bad_signature", f"ignoring a drain result for {m['node']} with a bad signature")
            return
        sig = m.get(drain_result.BINDING)
        if sig is None:
            self._ignored.labels("unbound").inc()
            self._refusals(
                "unbound",
                f"ignoring a drain result for {m['node']} (request {m['request_id']}) that names no "
                "request signature (an adapter of an earlier release?)",
            )
            return
        r = Result(
            m["request_id"], m["node"], m["action"], m["outcome"], m["detail"], sig, float(m["ts"]), seen
        )
        with self._lock:
            copies = self._by_id.get(r.request_id, {})
            named = copies.get(sig, {})
            if r.outcome == drain_result.DUPLICATE:
                # "handled before": the answer to this copy is the first answer to the request id
                # about the same node, which the adapter gave to a request that verified too (same
                # node, action and findings: the id hashes them), e.g. one act issued before a restart.
                # Not a deferral: the adapter handles a deferred id afresh, so a duplicate is of an
                # answer given after it.
                first = next(
                    (
                        a
                        for answers in copies.values()
                        for a in answers.values()
                        if a.node == r.node and a.outcome not in NOT_FIRST
                    ),
                    None,
                )
                if first is None or r.node in named:
                    return
                r = replace(first, request_signature=sig)  # the same request id: answers are by id
            old = named.get(r.node)
            if old is None and len(named) >= MAX_NODES_NAMED:
                # a copy of a request answered for this many nodes already: the answers stored
                # first stay (the genuine one among them), more wrong ones are not kept
                return
            if old is not None and old.outcome == drain_result.EXECUTED:  # done is done
                return
            named[r.node] = r
            copies[sig] = named
            while len(copies) > MAX_ANSWERS:  # the oldest copy's answers leave
                del copies[next(iter(copies))]
            self._by_id[r.request_id] = copies
            while len(self._by_id) > MAX_REQUESTS:
                del self._by_id[next(iter(self._by_id))]

    def __len__(self) -> int:
        """The request ids with an answer held."""
        with self._lock:
            return len(self._by_id)

    def answers(self, request_id: str, request_signature: str) -> tuple[Result, ...]:
        """The answers to exactly this request (id and signature), one per node named: none until
        the adapter answers, and more than one only where an answer names another node than the
        request (the caller, who knows the request's node, files the right one)."""
        with self._lock:
            return tuple(self._by_id.get(request_id, {}).get(request_signature, {}).values())
