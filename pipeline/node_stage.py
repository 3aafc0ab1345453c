"""The per-node stage: telemetry (keyed by node) -> hardware, statistical and lemon findings,
plus per-node features re-keyed by job for the straggler stage.

A task holds the detectors for the nodes of one fleet.telemetry.v1 partition. Duplicate and
out-of-order samples (ts not after the node's last accepted ts) are dropped before any
detector sees them and counted: at-least-once delivery upstream makes duplicates normal,
and an XID must not be counted twice.

Nodes come and go (re-imaged, renamed, retired): a node whose last sample is more than
`forget_after_s` older than the partition's clock is forgotten, checked every `forget_every_s` of
that clock. The clock is the 90th percentile (the silence detector's) of the latest samples of
the nodes that reported since the previous check, so one node with a clock ahead cannot make the
rest forgotten; not of every node the task holds, as the silence detector takes it: where more
than a tenth of the names have gone quiet, that percentile stops where they stopped, and the
names that made it stop would never be forgotten. Every detector resolves the
node's open incidents with a finding that says so (evidence `resolution: forgotten`,
`unseen_for_s`) and drops its state, compacting its dense tables; the task drops it from its own
and publishes a census tombstone (fleetwatch/census.py), so act neither counts it in the fleet
nor keeps its alerts. A node silent for longer than forget_after_s is therefore no longer paged
about. If it reports again it is a new node: new first_seen, a census message, fresh baselines.
Without this, state, snapshots, /metrics series and open "silent" findings grew with every name
a partition had ever seen (issue 15, item 17).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from itertools import compress, repeat
from typing import Any

import numpy as np
import orjson
from prometheus_client import Counter

from fleetwatch import census, schemas, topics
from fleetwatch.detectors.batch import GPU_COL, TelemetryBatch
from fleetwatch.detectors.findings import Forgotten
from fleetwatch.detectors.gpu_stats import GpuStats, GpuStatsConfig
from fleetwatch.detectors.hardware import HardwareConfig, HardwareDetector
from fleetwatch.detectors.lemon import LemonConfig, LemonScorer
from fleetwatch.detectors.protocol import NodeContext, NodeDetector
from fleetwatch.detectors.registry import NODE_DETECTORS
from fleetwatch.detectors.silence import SilenceConfig, SilenceDetector, reference_time
from fleetwatch.pipeline import fleet_metrics
from fleetwatch.pipeline.job_table import JobTable
from fleetwatch.pipeline.tasks import Output

log = logging.getLogger(__name__)

STALE = Counter(
    "fleetwatch_detect_stale_samples_total", "telemetry samples dropped as duplicate or out of order"
)
FORGOTTEN = Counter(
    "fleetwatch_detect_nodes_forgotten_total", "nodes forgotten after forget_after_s without telemetry"
)

_FEATURE_COLS = {
    "util": GPU_COL["util"],
    "sm_clock_mhz": GPU_COL["sm_clock_mhz"],
    "power_w": GPU_COL["power_w"],
}


@dataclass
class NodeTaskConfig:
    census_every_s: float = 600.0  # event-time period of a node's node/1 refresh (fleetwatch/census.py)
    forget_after_s: float = 86400.0  # a node unseen this long (event time) is forgotten; inf: never
    forget_every_s: float = 60.0  # event-time period of the check
    emit_features: bool = True
    lemon: LemonConfig = field(default_factory=LemonConfig)
    silence: SilenceConfig = field(default_factory=SilenceConfig)
    stats: GpuStatsConfig = field(default_factory=GpuStatsConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)

    @classmethod
    def for_time_scale(cls, scale: float) -> NodeTaskConfig:
        """Defaults with the day-long lemon windows shortened by `scale` (compressed scenarios)."""
        lemon = LemonConfig()
        return cls(
            lemon=replace(
                lemon,
                judge_every_s=lemon.judge_every_s * scale,
                tau_s=lemon.tau_s * scale,
                episode_gap_s=lemon.episode_gap_s * scale,
                clear_after_s=lemon.clear_after_s * scale,
            ),
        )


@dataclass(eq=False)  # identity: tasks are registered with the metrics collector
class NodeTask:
    jobs: JobTable
    config: NodeTaskConfig = field(default_factory=NodeTaskConfig)
    hardware: HardwareDetector | None = None
    lemon: LemonScorer | None = None
    silence: SilenceDetector | None = None
    stats: GpuStats | None = None
    last_ts: dict[str, float] = field(default_factory=dict)
    failed_jobs_seen: set[str] = field(default_factory=set)
    first_seen: dict[str, float] = field(default_factory=dict)  # node -> its first sample's ts
    census_at: dict[str, float] = field(default_factory=dict)  # node -> ts of its last node/1
    # node -> its latest sample's ts minus the time the broker took it (metric only, not snapshotted)
    clock_skew: dict[str, float] = field(default_factory=dict)
    forget_clock: float = 0.0  # the partition's clock at the last check for nodes to forget (0: none)
    # JobTable.failed_version when the failed jobs were last scanned (not snapshotted: a restored
    # task scans once; failed_jobs_seen says which it has counted)
    _failed_version: int = field(default=-1, repr=False)

    def __post_init__(self) -> None:
        for reg in NODE_DETECTORS:  # each one the task was not given starts empty
            if getattr(self, reg.name) is None:
                setattr(self, reg.name, reg.detector(getattr(self.config, reg.name)))
        fleet_metrics.COLLECTOR.add_nodes(self)

    @property
    def detectors(self) -> list[NodeDetector]:
        """The registered detectors (detectors/registry.py), in the order they run."""
        return [getattr(self, reg.name) for reg in NODE_DETECTORS]

    @staticmethod
    def warm_up(scanner_in_background: bool = False) -> None:
        """Load the compiled code the stage runs (the counter and statistical kernels, and the
        telemetry scanner) from numba's cache, compiling it first on a fresh install. With
        scanner_in_background the scanner, the longest compile (~1.5-2 min on 2 cores), loads on a
        thread while the worker already decodes with the message decoders
        (pipeline/telemetry_decode.py): what `fleetwatch detect` does, so a fresh install starts
        at once."""
        from fleetwatch.detectors import counter_kernels, stat_kernels
        from fleetwatch.pipeline.telemetry_decode import load_scanner

        # the kernels first: numba compiles one function at a time (a process-wide lock), and
        # the first batch needs them
        counter_kernels.warm_up()
        stat_kernels.warm_up()
        load_scanner(background=scanner_in_background)

    def process(self, topic: str, msgs: Sequence[Any] | TelemetryBatch) -> list[Output]:
        """Telemetry as dicts (evaluator, tests), fleetwatch.fast_schema structs, or already a
        columnar batch (the worker's hot path, pipeline/telemetry_decode.py)."""
        if isinstance(msgs, TelemetryBatch):
            keep, prev_ts = self._fresh(msgs.nodes(), msgs.ts.tolist())
            if not keep.any():
                return []
            batch = msgs if keep.all() else msgs.select(keep)
        else:
            # dicts or structs
            names = [m["node"] if type(m) is dict else m.node for m in msgs]
            times = [m["ts"] if type(m) is dict else m.ts for m in msgs]
            keep, prev_ts = self._fresh(names, times)
            fresh = list(compress(msgs, keep.tolist()))
            if not fresh:
                return []
            batch = TelemetryBatch.from_any(fresh)
        nodes = batch.nodes()
        seen = set(nodes)
        ctx = NodeContext(
            nodes=nodes,
            seen=seen,
            last_ts=self.last_ts,
            prev_ts=prev_ts,
            job_failures=self._failed_job_events(float(batch.ts.max()), seen),
        )
        findings: list[dict[str, Any]] = []
        for detector in self.detectors:
            findings += detector.observe(batch, replace(ctx, findings=findings))
        jobs = self.jobs.jobs_of(nodes)
        self._note_skew(batch, nodes)
        out: list[Output] = [(topics.FINDINGS, f["node"], f) for f in findings]
        out += self._census(batch, nodes)
        if self.config.emit_features:
            out += self._features(batch, nodes, jobs)
        out += self._sweep(float(batch.ts.max()), seen)
        return out

    # ------------------------------------------------------------ forgetting nodes

    def _sweep(self, newest: float, seen: set[str]) -> list[Output]:
        """Every forget_every_s of the partition's clock: forget the nodes unseen for
        forget_after_s by it (never one that reported in this batch, whatever its timestamp)."""
        due = self.forget_clock + self.config.forget_every_s
        if newest < due:  # the clock is at most the newest sample: nothing due yet
            return []
        names = list(self.last_ts)
        latest = np.fromiter(self.last_ts.values(), dtype=np.float64, count=len(names))
        # the nodes that reported since the last check (this batch's at least) set the clock
        clock = reference_time(latest[latest >= self.forget_clock], self.config.silence)
        if clock < due:
            return []
        self.forget_clock = clock
        self.failed_jobs_seen &= self.jobs.failed_ids()  # the table no longer offers the others
        stale = np.flatnonzero(clock - latest > self.config.forget_after_s)
        gone = {names[i]: float(latest[i]) for i in stale.tolist() if names[i] not in seen}
        return self.forget(Forgotten(gone, self.config.forget_after_s)) if gone else []

    def forget(self, gone: Forgotten) -> list[Output]:
        """Forget these nodes: every detector resolves their open incidents (saying why) and drops
        their state; the task drops them from its tables and removes them from the census."""
        findings: list[dict[str, Any]] = []
        for detector in self.detectors:
            findings += detector.forget(gone)
        for table in (self.last_ts, self.first_seen, self.census_at, self.clock_skew):
            for node in gone:
                table.pop(node, None)
        FORGOTTEN.inc(len(gone))
        out: list[Output] = [(topics.FINDINGS, f["node"], f) for f in findings]
        return out + [(topics.NODES, node, None) for node in sorted(gone)]  # census tombstones

    # ------------------------------------------------------------ what Prometheus reads (fleet_metrics)

    def node_health(self) -> Iterator[tuple[str, float, str]]:
        worst: dict[str, tuple[float, str]] = {}
        for book in (d.book for d in self.detectors):
            for inc in list(book.open.values()):
                health = fleet_metrics.HEALTH_BY_SEVERITY[inc.severity]
                state = "suspect" if inc.kind == "statistical" or inc.severity == "info" else "degraded"
                h, st = worst.get(inc.node, (1.0, "healthy"))
                worst[inc.node] = (min(h, health), "degraded" if "degraded" in (st, state) else state)
        for node in list(self.last_ts):
            h, st = worst.get(node, (1.0, "healthy"))
            yield node, h, st

    def gpu_signals(self) -> Iterator[tuple[str, int, str, float, float]]:
        yield from self.stats.latest()

    def open_incidents(self) -> Iterator[tuple[str, str]]:
        for book in (d.book for d in self.detectors):
            for inc in list(book.open.values()):
                yield inc.kind, inc.severity

    def clock_skews(self) -> Iterator[tuple[str, float]]:
        yield from list(self.clock_skew.items())

    def clock_refused(self, key: bytes | None, skew_s: float) -> None:
        """A sample refused for its timestamp (the worker dead-lettered it): shown as the node's
        clock skew if the node is one this task holds (its key is then its name; an unknown or
        hostile key adds nothing)."""
        node = key.decode("ascii", "replace") if key is not None else None
        if node is not None and node in self.last_ts:
            self.clock_skew[node] = skew_s

    def _note_skew(self, batch: TelemetryBatch, nodes: list[str]) -> None:
        skew = batch.ts - batch.received
        known = np.flatnonzero(~np.isnan(skew))
        if len(known):
            self.clock_skew.update(zip([nodes[i] for i in known.tolist()], skew[known].tolist(), strict=True))

    def _census(self, batch: TelemetryBatch, nodes: list[str]) -> list[Output]:
        """node/1 for a node's first sample and again every census_every_s of its event time: the
        census of reporting nodes that act sizes the drain budget on (fleetwatch/census.py)."""
        last = np.fromiter(
            map(self.census_at.get, nodes, repeat(-np.inf)), dtype=np.float64, count=len(nodes)
        )
        due = np.flatnonzero(batch.ts >= last + self.config.census_every_s)
        out: list[Output] = []
        for i in due.tolist():
            node, ts = nodes[i], float(batch.ts[i])
            if ts < self.census_at.get(node, -np.inf) + self.config.census_every_s:
                continue  # the node's earlier sample in this batch was due already
            first = self.first_seen.setdefault(node, ts)
            self.census_at[node] = ts
            out.append((topics.NODES, node, census.node_message(node, first, ts)))
        return out

    def close(self) -> None:
        """The partition moved away: stop exporting its nodes."""
        fleet_metrics.COLLECTOR.remove(self)

    def _fresh(self, nodes: list[str], times: list[float]) -> tuple[np.ndarray, dict[str, float]]:
        """Which samples are new (the rest are duplicates or out of order, counted), and each of
        their nodes' latest sample time before this batch (for the silence detector; a node seen
        for the first time is absent)."""
        last = self.last_ts
        if len(set(nodes)) == len(nodes):  # one sample per node, as a batch nearly always has
            old = np.fromiter(map(last.get, nodes, repeat(np.nan)), dtype=np.float64, count=len(nodes))
            ts = np.asarray(times, dtype=np.float64)
            seen = ~np.isnan(old)
            keep = ~seen | (ts > old)
            again = keep & seen  # kept, and seen before: their previous time goes to `prev`
            prev = dict(zip(compress(nodes, again.tolist()), old[again].tolist(), strict=True))
            last.update(zip(compress(nodes, keep.tolist()), ts[keep].tolist(), strict=True))
        else:  # a node twice or more: each sample against the latest before it
            kept = []
            prev = {}
            for node, t in zip(nodes, times, strict=True):
                before = last.get(node)
                new = before is None or t > before
                if new:
                    if before is not None and node not in prev:
                        prev[node] = before
                    last[node] = t
                kept.append(new)
            keep = np.array(kept, dtype=bool)
        stale = len(keep) - int(keep.sum())
        if stale:
            STALE.inc(stale)
        return keep, prev

    def _failed_job_events(self, now: float, mine: set[str]) -> list[tuple[float, str, float]]:
        """Lemon events of the failed jobs not counted yet (the table is only scanned when it has
        gained one: it may hold 100k)."""
        if self.jobs.failed_version == self._failed_version:
            return []
        self._failed_version, failed = self.jobs.failed()
        events: list[tuple[float, str, float]] = []
        for job, job_nodes in failed:
            if job not in self.failed_jobs_seen:
                self.failed_jobs_seen.add(job)
                # Blame is shared: a failed 8-node job is 1/8 of an event for each of its nodes, so
                # a lemon's job-mates do not inherit its history, while a node that keeps turning
                # up in failed jobs with different peers accumulates it.
                share = self.lemon.cfg.job_failure_weight / max(1, len(job_nodes))
                events += [(now, n, share) for n in job_nodes if n in mine]
        return events

    def _features(self, batch: TelemetryBatch, nodes: list[str], jobs: list[tuple[str, ...]]) -> list[Output]:
        """One nodefeatures/1 per sample of a node and running job it is in, keyed by the job: a
        node that several jobs share sends its features to each, and is compared with each job's
        other nodes only (the straggler stage keeps windows per job)."""
        if not any(jobs):
            return []
        with warnings.catch_warnings():  # all-NaN rows (a node without GPU metrics) are expected
            warnings.simplefilter("ignore", RuntimeWarning)
            means = {k: np.nanmean(batch.gpu[:, :, c], axis=1) for k, c in _FEATURE_COLS.items()}
        lost = batch.lost.sum(axis=1)
        out: list[Output] = []
        seq = batch.seq
        for i in np.flatnonzero([bool(j) for j in jobs]).tolist():
            # not NaN: absent stays absent
            signals = {k: round(float(v[i]), 3) for k, v in means.items() if v[i] == v[i]}
            for job in jobs[i]:
                msg: dict[str, Any] = {
                    "schema": schemas.NODE_FEATURES,
                    "node": nodes[i],
                    "job": job,
                    "ts": float(batch.ts[i]),
                    "seq": int(seq[i]),
                    "gpus_lost": int(lost[i]),
                    **signals,
                }
                out.append((topics.NODE_FEATURES, job, msg))
        return out

    def to_bytes(self) -> bytes:
        return orjson.dumps(
            {
                **{reg.name: getattr(self, reg.name).to_state() for reg in NODE_DETECTORS},
                "last_ts": self.last_ts,
                "failed_jobs_seen": sorted(self.failed_jobs_seen),
                # a worker of the previous version restores its lemon timing from here
                "next_lemon": self.lemon.next_judgement,
                "first_seen": self.first_seen,
                "census_at": self.census_at,
                "forget_clock": self.forget_clock,
            }
        )

    @classmethod
    def from_bytes(cls, raw: bytes, jobs: JobTable, config: NodeTaskConfig | None = None) -> NodeTask:
        """State from the snapshot, every detector's configuration from `config`: the deployment's
        (the worker's), never the one that wrote the snapshot. The lemon's next judgement and
        forget_clock are state (when the next lemon judgement and forget check are due); a changed
        forget_after_s applies at the next check."""
        d = orjson.loads(raw)
        config = config or NodeTaskConfig()
        # snapshots before the detector protocol kept the lemon's timing in the task
        d["lemon"].setdefault("next_judgement", d.get("next_lemon", 0.0))
        return cls(
            jobs=jobs,
            config=config,
            **{
                reg.name: reg.detector.from_state(d[reg.name], getattr(config, reg.name))
                for reg in NODE_DETECTORS
            },
            last_ts=d["last_ts"],
            failed_jobs_seen=set(d["failed_jobs_seen"]),
            first_seen=d.get("first_seen", {}),  # older snapshots: the census starts again
            census_at=d.get("census_at", {}),
            forget_clock=d.get("forget_clock", 0.0),  # older snapshots: checked on the first batch
        )
