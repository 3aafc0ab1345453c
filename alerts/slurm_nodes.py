"""Nodes as Slurm shows them, for act: `slurm_node/1` on scheduler.nodes.v1 (docs/contract.md).

act must not act on nodes that people hold: a node Slurm shows DOWN, drained by someone else, or in
an active MAINT reservation, and a node opted out (by name in [act.policy] opt_out, or by the Slurm
feature [act.policy] opt_out_feature). Such a node is not drained again, not paged for silence
(its finding alerts carry the label `node_state` instead, which the shipped Alertmanager routes
keep off the pager), and counted neither in the fleet the budget is a fraction of nor in the storm
guard's. act does not run sinfo itself (it need not live on a Slurm host); the Slurm adapter does,
and publishes what it sees:

    {"schema": "slurm_node/1", "node": NAME, "state": sinfo %T, "reason": sinfo %E ("" for none),
     "features": [sinfo %f ...], "maintenance": in an ACTIVE MAINT reservation, "ours": the reason
     is fleetwatch's, "ts": the adapter's clock, "signature": HMAC-SHA256 (drain key)}

The publisher (in `slurm-drainer`) sends a node's record when it changes and every node's every
`refresh_s`; act's book ignores a record older than `max_age_s` (a dead adapter's last word does
not hold nodes out forever: act then acts as if it had no word from Slurm, which is what it had
before this existed), and refuses one dated more than MAX_AHEAD_S ahead of the time the broker
took it.
Records are signed with the drain key: whoever could write the topic could otherwise shield a
broken node from every drain by calling it "in maintenance".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import hostlist

from fleetwatch import schemas, signing
from fleetwatch.alerts.slurm import (
    TAG,
    NodeInfo,
    ReservationsNotUnderstood,
    SlurmClient,
    SlurmError,
    ours,
)
from fleetwatch.alerts.validation import RESERVATION_PREFIX
from fleetwatch.refusal_log import RefusalLog
from fleetwatch.slurm_state import DOWN_STATES, DRAINED_STATES, state_is

log = logging.getLogger(__name__)

SLURM_NODE = schemas.SLURM_NODE
DEFAULT_REFRESH_S = 300.0
DEFAULT_MAX_AGE_S = 900.0
# how far ahead of the broker's time (act's clock where the topic keeps the producer's) a view's ts
# may be: as control/1's records, a minute of clock drift, not a clock that jumped
MAX_AHEAD_S = 60.0

# Why a node is not fleetwatch's to act on, as act reports it (label node_state, refusal reasons)
MAINTENANCE = "maintenance"
DOWN = "down"
DRAINED_BY_OTHER = "drained_by_other"
OPTED_OUT = "opted_out"
HELD_REASONS = frozenset({MAINTENANCE, DOWN, DRAINED_BY_OTHER, OPTED_OUT})


def make_record(
    info: NodeInfo, features: Iterable[str], maintenance: bool, ts: float, key: bytes
) -> dict[str, Any]:
    from fleetwatch.alerts.drain_request import one_line

    state = info.state.lower()
    msg: dict[str, Any] = {
        "schema": SLURM_NODE,
        "node": info.name,
        "state": state if schemas.SLURM_STATE_TEXT_RE.match(state) else "unknown",
        "reason": one_line(info.reason, schemas.MAX_REASON, blank=""),  # spaces: no Reason, not ours
        "features": [f[: schemas.MAX_ID_LEN] for f in kept_features(features)],
        "maintenance": bool(maintenance),
        "ours": info.drained and ours(info.reason),
        "ts": float(ts),
    }
    msg["signature"] = signing.mac(msg, key, "signature")
    schemas.validate_slurm_node(msg)
    return msg


def kept_features(features: Iterable[str]) -> list[str]:
    """The features a record keeps (at most MAX_FEATURES): fleetwatch's own first (the opt-out
    feature act reads, `fleetwatch_opt_out` by default), then the others in Slurm's order. Cut in
    Slurm's order, a node with many features lost an opt-out listed last."""
    feats = list(features)
    if len(feats) <= schemas.MAX_FEATURES:
        return feats
    return sorted(feats, key=lambda f: not f.startswith(TAG))[: schemas.MAX_FEATURES]


def held_by(rec: dict[str, Any], opt_out_feature: str = "") -> str | None:
    """Why people hold this node (a reason above), or None when it is fleetwatch's to act on."""
    if rec["maintenance"]:
        return MAINTENANCE
    if opt_out_feature and opt_out_feature in rec["features"]:
        return OPTED_OUT
    # (sinfo's `maint` state is not used: the adapter's own validation reservations set it too;
    # `maintenance` is computed from the reservations, without those)
    # each part of a compound state counts: `idle+drain` is drained, `mixed+down` down
    if state_is(rec["state"], *DOWN_STATES):
        return DOWN
    if state_is(rec["state"], *DRAINED_STATES) and not rec["ours"]:
        return DRAINED_BY_OTHER
    return None


class OptOut:
    """[act.policy] opt_out: node names or Slurm host-list expressions (gpu-node-[01-04,07])."""

    def __init__(self, patterns: Iterable[str]) -> None:
        self.nodes: frozenset[str] = frozenset(n for p in patterns for n in hostlist.expand_hostlist(p))

    def __contains__(self, node: object) -> bool:
        return node in self.nodes


class SlurmNodeBook:
    """The latest verified record of each node (a TopicFollower's callback; `held` asked by act)."""

    def __init__(
        self,
        key: bytes,
        *,
        opt_out: Iterable[str] = (),
        opt_out_feature: str = "",
        max_age_s: float = DEFAULT_MAX_AGE_S,
        on_refused: Callable[[str], None] = lambda _why: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._key = key
        self._clock = clock
        self._refusals = RefusalLog(log)  # a flood of them must not flood the log
        self.opt_out = OptOut(opt_out)
        self.opt_out_feature = opt_out_feature
        if opt_out_feature and not opt_out_feature.startswith(TAG):
            # the adapter keeps fleetwatch's own features first when a node has more than a record
            # holds (kept_features); it does not know this name
            log.warning(
                "[act.policy] opt_out_feature %r does not start with %r: on a node with more than %d "
                "Slurm features the adapter's view may leave it out, and the node is not held",
                opt_out_feature, TAG, schemas.MAX_FEATURES,
            )  # fmt: skip
        self.max_age_s = max_age_s
        self._on_refused = on_refused
        self._lock = threading.Lock()
        self._latest: dict[str, dict[str, Any]] = {}
        self._seen: dict[str, float] = {}  # when the broker took each node's latest record

    def apply(
        self, key: bytes | None, value: bytes | None, now: float | None = None, broker: bool = False
    ) -> None:
        """One record of the topic; `now`: the time its `ts` is checked against (act's follower,
        follow.BrokerTimedFollower, gives the time the broker took it: scheduler.nodes.v1 is a
        LogAppendTime topic, `broker` True; the book's clock where none is given). The broker's time
        is kept with the record (view()); a reading time is not: it orders nothing across a restart."""
        if value is None:
            return  # unsigned: a tombstone cannot end a hold (records age out instead)
        msg, why, detail = signing.decode_verified(value, SLURM_NODE, key, self._key)
        if msg is None:
            self._refuse(why, detail)
            return
        now = self._clock() if now is None else now
        if msg["ts"] > now + MAX_AHEAD_S:
            # An adapter whose clock jumped ahead: its record would outrank every later one (the
            # latest ts wins) and stay young past max_age_s, pinning the node held, or in service
            # where it is not (a view newer than our drain, in service: a resume by hand that frees
            # a budget slot of a node still drained). As control/1's records are refused.
            self._refuse("clock_skew", f"{msg['node']}: ts {msg['ts'] - now:.0f} s ahead of the broker")
            return
        with self._lock:
            old = self._latest.get(msg["node"])
            if old is None or msg["ts"] > old["ts"]:
                self._latest[msg["node"]] = msg
                if broker:
                    self._seen[msg["node"]] = now
                else:
                    self._seen.pop(msg["node"], None)

    def _refuse(self, why: str, detail: str) -> None:
        self._refusals(why, f"slurm_node record refused: {detail[:200]}")
        self._on_refused(why)

    def latest(self, node: str) -> dict[str, Any] | None:
        """The node's latest verified record (its age is the caller's to judge)."""
        with self._lock:
            return self._latest.get(node)

    def view(self, node: str) -> tuple[dict[str, Any] | None, float | None]:
        """The node's latest verified record and when the broker took it (None: not known), read
        together: a newer record landing between two reads must not pair one's state with the
        other's time."""
        with self._lock:
            return self._latest.get(node), self._seen.get(node)

    def _why(self, node: str, rec: dict[str, Any] | None, now: float) -> str | None:
        """Why `node` (whose latest record is `rec`) is held at `now`: the opt-out list first, then
        a record young enough to trust; None when it is fleetwatch's to act on."""
        if node in self.opt_out:
            return OPTED_OUT
        if rec is None or now - rec["ts"] > self.max_age_s:
            return None
        return held_by(rec, self.opt_out_feature)

    def held(self, node: str, now: float) -> str | None:
        """Why `node` is not fleetwatch's to act on at wall time `now`, or None."""
        return self._why(node, self.latest(node), now)

    def held_nodes(self, now: float) -> dict[str, str]:
        """Every node held now, with why (opted-out names included)."""
        with self._lock:
            recs = dict(self._latest)
        held = ((n, self._why(n, recs.get(n), now)) for n in recs.keys() | self.opt_out.nodes)
        return {n: why for n, why in held if why is not None}


@dataclass
class NodeStatePublisher:
    """In slurm-drainer: every `every_s`, sinfo and the MAINT reservations; a node's record is sent
    when what act reads of it changed, and every node's each `refresh_s` (so records stay fresh)."""

    slurm: SlurmClient
    producer: Any
    key: bytes
    topic: str
    every_s: float = 30.0
    refresh_s: float = DEFAULT_REFRESH_S
    clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        self._sent: dict[str, tuple[Any, ...]] = {}
        self._next = 0.0
        self._refresh_at = 0.0

    def due(self) -> bool:
        return time.monotonic() >= self._next

    def publish(self) -> int:
        """Send what changed (everything at a refresh); the number of records sent. Slurm not
        answering is logged and tried again at the next period."""
        self._next = time.monotonic() + self.every_s
        # the view's time is taken before Slurm is read: where a validation ends (draining its node
        # again, and answering with that time) while sinfo runs, the view that still shows the
        # node in service must be dated before the answer, or act takes it for a resume by hand
        now = self.clock()
        try:
            states = self.slurm.node_states()
            maint = self._maintenance()
        except SlurmError as e:
            log.warning("node states not published: %s", e)
            return 0
        refresh = time.monotonic() >= self._refresh_at
        if refresh:
            self._refresh_at = time.monotonic() + self.refresh_s
        sent = 0
        for info, feats in states:
            if not schemas.NAME_RE.match(info.name):
                continue
            view = (info.state, info.reason, feats, info.name in maint)
            if not refresh and self._sent.get(info.name) == view:
                continue
            try:
                msg = make_record(info, feats, info.name in maint, now, self.key)
            except schemas.MessageError as e:  # Slurm said something no record can hold
                log.warning("no slurm_node record for %s: %s", info.name, e)
                continue
            self.producer.send(self.topic, key=info.name.encode(), value=schemas.encode(msg))
            self._sent[info.name] = view
            sent += 1
        return sent

    def _maintenance(self) -> set[str]:
        """The nodes in people's maintenance (the adapter's own validation reservations are
        fleetwatch's, not people's). Where one reservation's node list cannot be read, those of the
        others: withholding every node's record for it aged every view out (the adapter's own
        requests are deferred meanwhile, slurm_drainer)."""
        try:
            return self.slurm.maintenance_nodes(except_prefix=RESERVATION_PREFIX)
        except ReservationsNotUnderstood as e:
            log.warning("node states published without an unreadable reservation: %s", e)
            return e.nodes
