"""The census of reporting nodes: `node/1` on the compacted topic fleet.nodes.v1 (key = node).

The detect workers publish `{"schema": "node/1", "node": NAME, "first_seen": unix_s,
"last_seen": unix_s, "steady_since": unix_s, "seen_at": unix_s, "sig": HEX}` for every node that
sends telemetry, again at least every 10 minutes (event time), and when they forget a node a
signed "gone" record (`"gone": true`) followed by a tombstone (null value) for compaction. The
census is the fleet: `act` sizes the drain budget and the storm guard on its warm nodes and never
drains a node it does not list, so a `job/1` naming thousands of ghost nodes, or findings about
nodes that never reported, change nothing.

Why it is signed, and how (issue 23, item 9). Anyone who can write the topic could otherwise add
2,000 nodes (tripling the budget) or forget a reporting node (its drains refused as
`unknown_node`). So:
- `sig` is HMAC-SHA256 (hex) over the canonical JSON of every other field (keys sorted, as
  alerts/drain_request.py signs drains), with the census key ($FLEETWATCH_CENSUS_KEY or a key
  file). It is its own key, not the drain key: detect must be able to vouch for the census without
  being able to sign a drain request past act's budget and storm guard. The `schema` field is
  signed too, so a census signature can never pass for another message's. It is detect's key:
  detect signs its findings with it as well (fleetwatch/signing.py), and act verifies both.
- A tombstone has no body to sign. Rather than a signature in a Kafka header over the bare key
  (a second scheme, over bytes a compacting broker may drop, with freshness to reinvent), detect
  first writes a signed record with `gone: true`, and act forgets a node only on that; tombstones
  only let the broker compact the key, and act ignores them (one for a node it holds is counted
  as `unsigned_tombstone`). One record kind, one signature scheme, one code path for
  verification, the replay rule below covers gone records too, and a forged tombstone is as
  harmless as any other unsigned record.
- Replays: `seen_at` is the broker's append time of the node's latest telemetry sample (the
  telemetry topic stamps LogAppendTime; a node cannot set it). Per node, act applies a record
  only if its `seen_at` is newer than the last one it applied (a gone record: not older), and a
  node forgotten by a verified gone comes back only with a record seen after it. An old signed
  record replayed is refused as `stale`.
- Warm-up: `steady_since` is the broker time at which the node's current unbroken run of
  telemetry began (a gap longer than the node stage's steady_gap_s, not counting stretches in which
  the whole partition received nothing, starts a new run). A node
  counts toward the budget and the storm threshold only once `seen_at - steady_since` reaches
  act's --census-warm-up; before that it is a known node (drainable, not `unknown_node`) that does
  not enlarge the fleet. Both times are the broker's, not the node's: a sample stamped a day in
  the past cannot make a new name look old.
- A burst of new names (nodes whose run began within --census-burst-window: more than
  --census-burst-fraction of the warm fleet, and at least --census-burst-min) sets
  fleetwatch_act_census_burst, which the FleetwatchCensusNodeBurst rule alerts on. Reading the
  whole topic after act restarts is no burst: those nodes' runs began long before.

What a writer of the topic can still do (docs/security.md: ACLs are what stop it): compaction keeps
only the latest record per key, so a forged record displaces a node's signed one on the broker; a
running act keeps its verified view, but an act that restarts does not see that node until its
next refresh (census_every_s, 10 minutes).
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from fleetwatch import schemas, signing
from fleetwatch.config import knob
from fleetwatch.refusal_log import RefusalLog
from fleetwatch.signing import SigningKeyError

log = logging.getLogger(__name__)

NODE = schemas.NODE  # checked by the core decoder, fleetwatch/schemas.py
validate_node = schemas.validate_node
KEY_ENV = "FLEETWATCH_CENSUS_KEY"
GONE_MEMORY = 100_000  # nodes forgotten by a verified gone, remembered to refuse replays of older records

REFUSE_REASONS = ("unsigned", "bad_signature", "malformed", "stale", "unsigned_tombstone")


class CensusMetrics:
    """act's census metrics, on the registry given (act's: alerts/act_metrics.py); none: counted,
    exported nowhere."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry
        self.refused = Counter(
            "fleetwatch_act_census_refused_total",
            "census records (fleet.nodes.v1) act did not apply, by reason: unsigned, bad_signature, "
            "malformed, stale (not newer than the node's latest verified record: a replay, or detect "
            "replaying its input after a restart), unsigned_tombstone (a tombstone for a node act holds)",
            ["reason"],
            registry=r,
        )
        for reason in REFUSE_REASONS:  # exported at 0, so a dashboard or rule sees each before the first
            self.refused.labels(reason)
        self.new_nodes = Counter(
            "fleetwatch_act_census_new_nodes_total",
            "nodes added to act's census by a verified node/1 record",
            registry=r,
        )
        self.nodes = Gauge(
            "fleetwatch_act_census_nodes",
            "nodes in act's verified census, warm or not yet",
            ["warmth"],
            registry=r,
        )
        self.recent = Gauge(
            "fleetwatch_act_census_recent_nodes",
            "census nodes whose run of steady reporting began within --census-burst-window (new names)",
            registry=r,
        )
        self.burst = Gauge(
            "fleetwatch_act_census_burst",
            "1 while more new node names arrived within --census-burst-window than the burst threshold",
            registry=r,
        )
        self.burst_threshold = Gauge(
            "fleetwatch_act_census_burst_threshold",
            "new names within the window that make a burst: max(--census-burst-min, fraction x warm fleet)",
            registry=r,
        )


class CensusKeyError(SigningKeyError):
    """No usable census key; the message names where it was looked for, never its value."""


def load_key(key_file: str | None = None, env: Mapping[str, str] | None = None) -> bytes:
    """The census HMAC key: the key file if given, else $FLEETWATCH_CENSUS_KEY (>= 16 bytes)."""
    return signing.load_key("census", KEY_ENV, key_file, os.environ if env is None else env, CensusKeyError)


def node_message(
    node: str,
    first_seen: float,
    last_seen: float,
    *,
    steady_since: float | None = None,
    seen_at: float | None = None,
    gone: bool = False,
) -> dict[str, Any]:
    """A valid, unsigned node/1 message (the node stage's output; fleetwatch/signing.py signs it).
    steady_since and seen_at default to last_seen (a node seen once)."""
    seen = float(last_seen if seen_at is None else seen_at)
    m: dict[str, Any] = {
        "schema": NODE,
        "node": node,
        "first_seen": float(first_seen),
        "last_seen": float(last_seen),
        "steady_since": float(seen if steady_since is None else steady_since),
        "seen_at": seen,
    }
    if gone:
        m["gone"] = True
    validate_node(m)
    return m


def is_warm(m: Mapping[str, Any], warm_up_s: float) -> bool:
    """A node that has reported without a break for at least warm_up_s (broker time)."""
    return bool(m["seen_at"] - m["steady_since"] >= warm_up_s)


@dataclass(frozen=True)
class CensusConfig:
    warm_up_s: float = knob(1200.0, "steady reporting (s) before a node enlarges the fleet (20 min)", ge=0)
    burst_fraction: float = knob(
        0.1, "new names within burst_window_s, as a fraction of the warm fleet ...", ge=0
    )
    burst_min: int = knob(10, "... and at least this many, make a burst (fleetwatch_act_census_burst)", ge=1)
    burst_window_s: float = knob(600.0, "census burst window (s)", gt=0)


@dataclass
class _Entry:
    seen_at: float
    warm: bool


class Census:
    """Node -> its latest verified record, kept current by a TopicFollower (fleetwatch/follow.py)
    on fleet.nodes.v1. `in` and nodes(): every known node (drainable); fleet_size(): the warm ones
    (what the budget and the storm guard count)."""

    def __init__(
        self, key: bytes, config: CensusConfig | None = None, metrics: CensusMetrics | None = None
    ) -> None:
        self._key = key
        self.metrics = metrics or CensusMetrics()  # act's: act_metrics.exported().census
        self.config = config or CensusConfig()
        self._lock = threading.Lock()
        self._nodes: dict[str, _Entry] = {}
        self._warm = 0
        # node -> seen_at of the verified gone that forgot it (bounded: oldest dropped first)
        self._gone: OrderedDict[str, float] = OrderedDict()
        # node -> steady_since of each node whose current run of reporting began within the burst
        # window: new names (or nodes back after a break), whatever order act read them in, so
        # that reading the whole topic after a restart is no burst
        self._recent: dict[str, float] = {}
        self._recent_kept = 0  # its size after the last pruning
        self._refusals = RefusalLog(log)  # a flood of them must not flood the log

    # ------------------------------------------------------------ input (the follower's thread)

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        """One record of the topic. Never raises: an exception would stop the follower."""
        if key is None:
            return
        node = key.decode("utf-8", "replace")
        if value is None:
            with self._lock:
                # one for a node act does not hold is compaction's (after a verified gone, or all
                # that is left of one after a restart) and changes nothing: not counted
                if node in self._nodes:
                    self._refuse("unsigned_tombstone", node)
            return
        try:
            # the key must be the node: compaction keeps by key, so a mismatch would never be forgotten
            m = schemas.decode(value, NODE, key=key)
        except schemas.MessageError as e:
            with self._lock:
                self._refuse("malformed", node, str(e))
            return
        with self._lock:
            try:
                if "sig" not in m or "seen_at" not in m or "steady_since" not in m:
                    self._refuse("unsigned", node)
                elif not signing.verify(m, self._key):
                    self._refuse("bad_signature", node)
                elif m.get("gone"):
                    self._apply_gone(node, m["seen_at"])
                else:
                    self._apply_node(node, m)
            except Exception as e:  # input no check foresaw: that record's problem, never the follower's
                self._refuse("malformed", node, f"{type(e).__name__}: {str(e)[:200]}")

    def _apply_node(self, node: str, m: dict[str, Any]) -> None:
        seen_at = float(m["seen_at"])
        old = self._nodes.get(node)
        if (old is not None and seen_at <= old.seen_at) or seen_at <= self._gone.get(node, -math.inf):
            self._refuse("stale", node)
            return
        warm = is_warm(m, self.config.warm_up_s)
        self._gone.pop(node, None)
        if old is None:
            self.metrics.new_nodes.inc()
        else:
            self._warm -= old.warm
        if m["steady_since"] > seen_at - self.config.burst_window_s:
            self._recent[node] = float(m["steady_since"])
            if len(self._recent) > 2 * self._recent_kept + 1024:  # pruned as it grows, not only on a scrape
                self._recent = {
                    n: t for n, t in self._recent.items() if t > seen_at - self.config.burst_window_s
                }
                self._recent_kept = len(self._recent)
        self._nodes[node] = _Entry(seen_at, warm)
        self._warm += warm

    def _apply_gone(self, node: str, seen_at: float) -> None:
        old = self._nodes.get(node)
        if old is not None and seen_at < old.seen_at:
            self._refuse("stale", node)  # the node reported after this gone: a replay
            return
        if old is not None:
            del self._nodes[node]
            self._warm -= old.warm
        self._gone[node] = max(seen_at, self._gone.pop(node, -math.inf))
        while len(self._gone) > GONE_MEMORY:
            self._gone.popitem(last=False)

    def _refuse(self, reason: str, node: str, detail: str = "") -> None:
        self.metrics.refused.labels(reason).inc()
        self._refusals(
            reason, f"census record for {node[:128]!r} not applied" + (f": {detail}" if detail else "")
        )

    # ------------------------------------------------------------ what act reads

    def __contains__(self, node: object) -> bool:
        return node in self._nodes

    def __len__(self) -> int:
        return len(self._nodes)

    def __iter__(self) -> Iterator[str]:
        return iter(self.nodes())

    def nodes(self) -> set[str]:
        with self._lock:
            return set(self._nodes)

    def fleet_size(self) -> int:
        """The warm nodes: those the drain budget and the storm threshold are a fraction of."""
        return self._warm

    def refused(self) -> dict[str, int]:
        """Records not applied so far, by reason."""
        return self._refusals.counts()

    def new_nodes(self, now: float) -> int:
        """Nodes whose current run of reporting began within the burst window before `now`."""
        with self._lock:
            horizon = now - self.config.burst_window_s
            self._recent = {n: t for n, t in self._recent.items() if t > horizon}
            return len(self._recent)

    def burst_threshold(self) -> int:
        c = self.config
        return max(c.burst_min, math.ceil(c.burst_fraction * self._warm))

    def burst(self, now: float) -> bool:
        """More new names within the window than the threshold: a pipeline alert, not a bigger fleet."""
        return self.new_nodes(now) > self.burst_threshold()


def export_metrics(census: Census, clock: Callable[[], float]) -> None:
    """Export `census`'s gauges in its metrics, computed at scrape time (act has one census per
    process)."""
    m = census.metrics
    m.nodes.labels("warm").set_function(census.fleet_size)
    m.nodes.labels("cold").set_function(lambda: len(census) - census.fleet_size())
    m.recent.set_function(lambda: census.new_nodes(clock()))
    m.burst.set_function(lambda: float(census.burst(clock())))
    m.burst_threshold.set_function(census.burst_threshold)
