"""The per-node stage: telemetry (keyed by node) -> hardware, statistical and lemon findings,
plus per-node features re-keyed by job for the straggler stage.

A task holds the detectors for the nodes of one fleet.telemetry.v1 partition, and one index of
those nodes (detectors/node_index.py) that its own per-node arrays and every detector's are
indexed by. Duplicate and late samples (by the agent's numbering: instance and seq, not the
clock) are dropped there before any detector sees them, and counted: at-least-once delivery
upstream makes duplicates normal, and an XID must not be counted twice. Each new sample reaches
the detectors at its event time (never ahead of the broker's time, never before its node's
previous sample); a clock that jumped is reported (detectors/clock.py).

Nodes come and go (re-imaged, renamed, retired): a node whose last sample is more than
`forget_after_s` older than the partition's clock is forgotten, checked every `forget_every_s` of
that clock. The clock is the 90th percentile (the silence detector's) of the latest samples of
the nodes that reported since the previous check, so one node with a clock ahead cannot make the
rest forgotten; not of every node the task holds, as the silence detector takes it: where more
than a tenth of the names have gone quiet, that percentile stops where they stopped, and the
names that made it stop would never be forgotten. Every detector resolves the
node's open incidents with a finding that says so (evidence `resolution: forgotten`,
`unseen_for_s`) and drops its state, compacting its dense tables with the index's renumbering; the
task drops it from its own
and publishes a census tombstone (fleetwatch/census.py), so act neither counts it in the fleet
nor keeps its alerts. A node silent for longer than forget_after_s is therefore no longer paged
about. If it reports again it is a new node: new first_seen, a census message, fresh baselines.
Without this, state, snapshots, /metrics series and open "silent" findings grew with every name
a partition had ever seen (issue 15, item 17).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import orjson

from fleetwatch import census, schemas, topics
from fleetwatch.config import knob, why
from fleetwatch.detectors.batch import GPU_COL, TelemetryBatch
from fleetwatch.detectors.clock import ClockConfig, ClockDetector
from fleetwatch.detectors.findings import Forgotten
from fleetwatch.detectors.gpu_stats import GpuStats, GpuStatsConfig
from fleetwatch.detectors.hardware import HardwareConfig, HardwareDetector
from fleetwatch.detectors.lemon import LemonConfig, LemonScorer
from fleetwatch.detectors.node_checks import NodeChecks, NodeChecksConfig
from fleetwatch.detectors.node_index import CLOCK_LEAD_S, NodeIndex
from fleetwatch.detectors.protocol import NodeContext, NodeDetector, admit
from fleetwatch.detectors.registry import NODE_DETECTORS
from fleetwatch.detectors.rows import Compaction, grow
from fleetwatch.detectors.silence import SilenceConfig, SilenceDetector, reference_time
from fleetwatch.pipeline import fleet_metrics, steady
from fleetwatch.pipeline.job_table import JobTable
from fleetwatch.pipeline.tasks import Output, Refused
from fleetwatch.refusal_log import RefusalLog

log = logging.getLogger(__name__)


_FEATURE_COLS = {
    "util": GPU_COL["util"],
    "sm_clock_mhz": GPU_COL["sm_clock_mhz"],
    "power_w": GPU_COL["power_w"],
}


@dataclass
class NodeTaskConfig:
    census_every_s: float = knob(600.0, "event-time period (s) of a node's node/1 refresh", gt=0)
    forget_after_s: float = knob(
        86400.0,
        "a node unseen this long (event time, s) is forgotten, its findings resolved; inf: never",
        gt=0,
    )
    forget_every_s: float = knob(60.0, "event-time period (s) of the check for nodes to forget", gt=0)
    exported_nodes: int = knob(
        fleet_metrics.MAX_EXPORTED_NODES,
        "nodes whose per-node /metrics series a worker exports at most, the worst health first (the "
        "rest counted in fleetwatch_detect_nodes_unexported); made-up names kept reporting warm up too",
        gt=0,
    )
    max_nodes: int = knob(
        8192,
        "node names one partition holds at most; samples of a new name past it are dead-lettered "
        "(too_many_nodes): names come from the agents, unsigned, and each one held costs state",
        gt=0,
    )
    emit_features: bool = knob(
        True, "re-key node features by job onto fleet.nodefeatures.v1 (the job stage's input)"
    )
    # detectors/node_index.py
    max_clock_lead_s: float = knob(
        CLOCK_LEAD_S, "a sample's time is believed at most this far (s) ahead of the broker's for it", ge=0
    )
    # census warm-up: pipeline/steady.py
    steady_gap_s: float = knob(
        300.0, "a gap longer than this (s, broker time) in a node's samples restarts its steady run", gt=0
    )
    warm_up_s: float = knob(
        1200.0, "steady reporting (s) that makes a node warm (act's fleet, per-node /metrics series)", ge=0
    )
    lemon: LemonConfig = field(
        default_factory=LemonConfig, metadata=why("lemons: nodes that fail more often than the fleet")
    )
    clock: ClockConfig = field(default_factory=ClockConfig, metadata=why("clock jumps on a node"))
    silence: SilenceConfig = field(default_factory=SilenceConfig, metadata=why("nodes that stop reporting"))
    stats: GpuStatsConfig = field(
        default_factory=GpuStatsConfig, metadata=why("GPU signals unusual for the GPU and its siblings")
    )
    hardware: HardwareConfig = field(
        default_factory=HardwareConfig, metadata=why("hardware error counters, XIDs, throttling, InfiniBand")
    )
    node_checks: NodeChecksConfig = field(
        default_factory=NodeChecksConfig,
        metadata=why("mounts, block devices, disk, hung tasks, PCIe links, device counts"),
    )

    @classmethod
    def for_time_scale(cls, scale: float, base: NodeTaskConfig | None = None) -> NodeTaskConfig:
        """`base` (default: the code defaults) with the day-long lemon windows and the node checks'
        sustained time shortened by `scale` (compressed scenarios)."""
        base = base or cls()
        lemon = base.lemon
        return replace(
            base,
            lemon=replace(
                lemon,
                judge_every_s=lemon.judge_every_s * scale,
                tau_s=lemon.tau_s * scale,
                episode_gap_s=lemon.episode_gap_s * scale,
                clear_after_s=lemon.clear_after_s * scale,
            ),
            node_checks=replace(base.node_checks, sustained_s=base.node_checks.sustained_s * scale),
        )


@dataclass(eq=False)  # identity: tasks are registered with the metrics collector
class NodeTask:
    jobs: JobTable
    config: NodeTaskConfig = field(default_factory=NodeTaskConfig)
    # the nodes the task holds and each one's latest sample ts; every per-node array below and in
    # the detectors is indexed by its rows
    index: NodeIndex = field(default_factory=NodeIndex)
    hardware: HardwareDetector | None = None
    lemon: LemonScorer | None = None
    clock: ClockDetector | None = None
    silence: SilenceDetector | None = None
    stats: GpuStats | None = None
    node_checks: NodeChecks | None = None
    failed_jobs_seen: set[str] = field(default_factory=set)
    # per node row (grown to the index by _grow): its first sample's ts (NaN: none yet)...
    first_seen: np.ndarray = field(default_factory=lambda: np.full(0, np.nan))
    # ... the ts of its last node/1 (-inf: none yet) ...
    census_at: np.ndarray = field(default_factory=lambda: np.full(0, -np.inf))
    # ... the broker time its current unbroken run of samples began and its latest sample's broker
    # time (NaN: none yet; pipeline/steady.py) ...
    steady_since: np.ndarray = field(default_factory=lambda: np.full(0, np.nan))
    seen_at: np.ndarray = field(default_factory=lambda: np.full(0, np.nan))
    # ... (and when the whole partition was quiet: no node's run breaks across that)
    pauses: steady.Pauses = field(default_factory=steady.Pauses)
    # ... and its latest sample's ts minus the time the broker took it (NaN: not known; metric
    # only, not snapshotted)
    clock_skew: np.ndarray = field(default_factory=lambda: np.full(0, np.nan))
    forget_clock: float = 0.0  # the partition's clock at the last check for nodes to forget (0: none)
    # JobTable.failed_version when the failed jobs were last scanned (not snapshotted: a restored
    # task scans once; failed_jobs_seen says which it has counted)
    _failed_version: int = field(default=-1, repr=False)
    # where the task exports its nodes and counts (fleetwatch detect: fleet_metrics.exported());
    # None, as eval and tests build it: nothing exported, the global registry untouched
    metrics: fleet_metrics.FleetStateCollector | None = field(default=None, repr=False)
    # the samples the latest process() refused (the worker dead-letters them: pipeline/tasks.py)
    refused: list[Refused] = field(default_factory=list, repr=False)
    _refusals: RefusalLog = field(default_factory=lambda: RefusalLog(log), repr=False)

    def __post_init__(self) -> None:
        for reg in NODE_DETECTORS:  # each one the task was not given starts empty, on its index
            if getattr(self, reg.name) is None:
                setattr(self, reg.name, reg.detector(getattr(self.config, reg.name), self.index))
        self._grow()
        if self.metrics is not None:
            self.metrics.add_nodes(self)

    def _grow(self) -> None:
        """Room in the task's per-node arrays for every node of the index."""
        n = len(self.index)
        self.first_seen = grow(self.first_seen, n, np.nan)
        self.census_at = grow(self.census_at, n, -np.inf)
        self.steady_since = grow(self.steady_since, n, np.nan)
        self.seen_at = grow(self.seen_at, n, np.nan)
        self.clock_skew = grow(self.clock_skew, n, np.nan)

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
        from fleetwatch.detectors import admission_kernels, counter_kernels, stat_kernels
        from fleetwatch.pipeline.telemetry_decode import load_scanner

        # the kernels first: numba compiles one function at a time (a process-wide lock), and
        # the first batch needs them
        admission_kernels.warm_up()
        counter_kernels.warm_up()
        stat_kernels.warm_up()
        load_scanner(background=scanner_in_background)

    def process(self, topic: str, batch: TelemetryBatch) -> list[Output]:
        """Telemetry as a columnar batch: the worker decodes it so (pipeline/telemetry_decode.py);
        dicts (eval, tests) are converted by TelemetryBatch.from_messages."""
        if not isinstance(batch, TelemetryBatch):
            raise TypeError(f"the node stage takes a TelemetryBatch, not {type(batch).__name__}")
        self.refused = []
        batch = self._within_max_nodes(batch)
        if len(batch) == 0:
            return []
        admitted, new, ctx = admit(batch, self.index, self.config.max_clock_lead_s)
        keep = admitted.keep
        self._stale(keep)
        if not keep.any():
            return []
        self._grow()
        self._note_skew(batch, admitted.rows, keep)
        batch = new
        ctx = replace(ctx, job_failures=self._failed_job_events(float(batch.ts.max()), ctx.seen))
        findings: list[dict[str, Any]] = []
        for detector in self.detectors:
            findings += detector.observe(batch, replace(ctx, findings=findings))
        if self.metrics is not None:
            for kind, ports in (("ib", self.hardware.ib_map), ("eth", self.hardware.eth_map)):
                if refused := ports.take_refused():
                    self.metrics.ports_refused.labels(kind).inc(refused)
        nodes = ctx.nodes
        jobs = self.jobs.jobs_of(nodes)
        out: list[Output] = [(topics.FINDINGS, f["node"], f) for f in findings]
        out += self._census(batch, ctx)
        if self.config.emit_features:
            out += self._features(batch, nodes, jobs)
        out += self._sweep(float(batch.ts.max()), ctx.seen)
        return out

    @property
    def exported_nodes(self) -> int:
        """How many nodes' series the worker's collector exports at most (fleet_metrics)."""
        return self.config.exported_nodes

    def _within_max_nodes(self, batch: TelemetryBatch) -> TelemetryBatch:
        """The batch without the samples of new names that would take the index past max_nodes
        (those refused, in self.refused); the first new names of the batch take the room left."""
        held = self.index.rows
        new = [j for j, name in enumerate(batch.node_names) if name not in held]
        room = self.config.max_nodes - len(self.index)
        if len(new) <= room:
            return batch
        out = np.isin(batch.node_idx, new[max(room, 0) :])
        for i in np.flatnonzero(out).tolist():
            name = batch.node_names[int(batch.node_idx[i])]
            why = f"node {name}: this partition holds {self.config.max_nodes} nodes (max_nodes)"
            self.refused.append(Refused(topics.TELEMETRY, "too_many_nodes", why, {"node": name}, i))
        self._refusals("too_many_nodes", f"telemetry refused: {self.refused[0].detail[:200]}")
        return batch.select(~out)

    def _stale(self, keep: np.ndarray) -> list[Output]:
        """Count the samples admission dropped (duplicates or out of order)."""
        stale = len(keep) - int(keep.sum())
        if stale and self.metrics is not None:
            self.metrics.stale_samples.inc(stale)
        return []

    # ------------------------------------------------------------ forgetting nodes

    def _sweep(self, newest: float, seen: set[str]) -> list[Output]:
        """Every forget_every_s of the partition's clock: forget the nodes unseen for
        forget_after_s by it (never one that reported in this batch, whatever its timestamp)."""
        due = self.forget_clock + self.config.forget_every_s
        if newest < due:  # the clock is at most the newest sample: nothing due yet
            return []
        names, latest = self.index.names, self.index.last_ts
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
        goodbyes = self._gone_records(gone)
        rows = self.index.drop(gone)
        findings: list[dict[str, Any]] = []
        for detector in self.detectors:
            findings += detector.forget(gone, rows)
        if rows is not None:
            self._compact(rows)
        if self.metrics is not None:
            self.metrics.nodes_forgotten.inc(len(gone))
        out: list[Output] = [(topics.FINDINGS, f["node"], f) for f in findings]
        return out + goodbyes

    def _gone_records(self, gone: Forgotten) -> list[Output]:
        """Per forgotten node, the signed gone record act forgets it on, then the tombstone that
        lets the broker compact its key (act ignores tombstones: they cannot be signed)."""
        out: list[Output] = []
        for node in sorted(gone):
            row = self.index.rows.get(node)
            last = float(gone.last_seen[node])
            if row is None or not np.isfinite(last):
                out.append((topics.NODES, node, None))
                continue
            first = float(np.fmin(self.first_seen[row], last))  # NaN (no census yet): last
            seen = float(self.seen_at[row]) if np.isfinite(self.seen_at[row]) else last
            since = float(np.fmin(self.steady_since[row], seen))
            msg = census.node_message(node, first, last, steady_since=since, seen_at=seen, gone=True)
            out += [(topics.NODES, node, msg), (topics.NODES, node, None)]
        return out

    # ------------------------------------------------------------ what Prometheus reads (fleet_metrics)

    def node_health(self) -> Iterator[tuple[str, float, str]]:
        worst: dict[str, tuple[float, str]] = {}
        for book in (d.book for d in self.detectors):
            for inc in list(book.open.values()):
                health = fleet_metrics.HEALTH_BY_SEVERITY[inc.severity]
                state = "suspect" if inc.kind == "statistical" or inc.severity == "info" else "degraded"
                h, st = worst.get(inc.node, (1.0, "healthy"))
                worst[inc.node] = (min(h, health), "degraded" if "degraded" in (st, state) else state)
        for node in list(self.index.names):
            h, st = worst.get(node, (1.0, "healthy"))
            yield node, h, st

    def gpu_signals(self) -> Iterator[tuple[str, int, str, float, float]]:
        yield from self.stats.latest()

    def open_incidents(self) -> Iterator[tuple[str, str]]:
        for book in (d.book for d in self.detectors):
            for inc in list(book.open.values()):
                yield inc.kind, inc.severity

    def clock_skews(self) -> Iterator[tuple[str, float]]:
        n = len(self.index)
        known = np.flatnonzero(~np.isnan(self.clock_skew[:n]))
        names = self.index.names
        yield from [(names[r], float(self.clock_skew[r])) for r in known.tolist()]

    def warm_nodes(self) -> set[str]:
        """The nodes that have reported steadily for warm_up_s (their /metrics series are always
        exported; pipeline/fleet_metrics.py)."""
        n = len(self.index)
        names = self.index.names
        rows = np.flatnonzero(steady.warm(self.seen_at[:n], self.steady_since[:n], self.config.warm_up_s))
        return {names[r] for r in rows.tolist()}

    def clock_refused(self, key: bytes | None, skew_s: float) -> None:
        """A sample refused for its timestamp (the worker dead-lettered it): shown as the node's
        clock skew if the node is one this task holds (its key is then its name; an unknown or
        hostile key adds nothing)."""
        node = key.decode("ascii", "replace") if key is not None else None
        row = self.index.rows.get(node) if node is not None else None
        if row is not None:
            self.clock_skew[row] = skew_s

    def _note_skew(self, batch: TelemetryBatch, rows: np.ndarray, keep: np.ndarray) -> None:
        """Each new sample's own time minus the broker's time for it (a node twice: its later
        sample's, as it arrived)."""
        skew = batch.ts - batch.received
        known = keep & ~np.isnan(skew)
        self.clock_skew[rows[known]] = skew[known]

    def _census(self, batch: TelemetryBatch, ctx: NodeContext) -> list[Output]:
        """node/1 for a node's first sample, again every census_every_s of its event time, and when
        its run of steady reporting starts again after a gap: the census of reporting nodes that
        act sizes the drain budget on (fleetwatch/census.py)."""
        every = self.config.census_every_s
        t = steady.broker_times(batch.ts, batch.received)
        gap = self.config.steady_gap_s
        restarted = steady.track(self.seen_at, self.steady_since, ctx.rows, t, gap, self.pauses)
        if self.metrics is not None:
            self.metrics.new_nodes.inc(int(np.count_nonzero(np.isnan(self.first_seen[restarted]))))
        due = np.flatnonzero((batch.ts >= self.census_at[ctx.rows] + every) | np.isin(ctx.rows, restarted))
        fresh = set(restarted.tolist())  # act learns at once that a node's warm-up starts again
        out: list[Output] = []
        for i in due.tolist():
            row, ts = int(ctx.rows[i]), float(batch.ts[i])
            if ts < self.census_at[row] + every and row not in fresh:
                continue  # the node's earlier sample in this batch was due already
            fresh.discard(row)
            if np.isnan(self.first_seen[row]):
                self.first_seen[row] = ts
            self.census_at[row] = ts
            node = ctx.nodes[i]
            msg = census.node_message(
                node,
                float(self.first_seen[row]),
                ts,
                steady_since=float(self.steady_since[row]),
                seen_at=float(self.seen_at[row]),
            )
            out.append((topics.NODES, node, msg))
        return out

    def close(self) -> None:
        """The partition moved away: stop exporting its nodes."""
        if self.metrics is not None:
            self.metrics.remove(self)

    def _compact(self, rows: Compaction) -> None:
        self.first_seen = rows.take(self.first_seen, np.nan)
        self.census_at = rows.take(self.census_at, -np.inf)
        self.steady_since = rows.take(self.steady_since, np.nan)
        self.seen_at = rows.take(self.seen_at, np.nan)
        self.clock_skew = rows.take(self.clock_skew, np.nan)

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
        names = self.index.names
        n = len(names)
        return orjson.dumps(
            {
                **{reg.name: getattr(self, reg.name).to_state() for reg in NODE_DETECTORS},
                # every node, in the index's row order (from_bytes rebuilds the index from it)
                "last_ts": dict(zip(names, self.index.last_ts.tolist(), strict=True)),
                # where each node's agent numbering stands: its current instance's seq, and [current
                # instance, the one before it, that one's seq]
                "last_seq": self.index.last_seq.tolist(),
                "instances": self.index.instances.tolist(),
                "failed_jobs_seen": sorted(self.failed_jobs_seen),
                # a worker of the previous version restores its lemon timing from here
                "next_lemon": self.lemon.next_judgement,
                "first_seen": _by_name(names, self.first_seen[:n], np.isfinite),
                "census_at": _by_name(names, self.census_at[:n], np.isfinite),
                "steady_since": _by_name(names, self.steady_since[:n], np.isfinite),
                "seen_at": _by_name(names, self.seen_at[:n], np.isfinite),
                "pauses": self.pauses.to_state(),
                "forget_clock": self.forget_clock,
            }
        )

    @classmethod
    def from_bytes(
        cls,
        raw: bytes,
        jobs: JobTable,
        config: NodeTaskConfig | None = None,
        metrics: fleet_metrics.FleetStateCollector | None = None,
    ) -> NodeTask:
        """State from the snapshot, every detector's configuration from `config`: the deployment's
        (the worker's), never the one that wrote the snapshot. The lemon's next judgement and
        forget_clock are state (when the next lemon judgement and forget check are due); a changed
        forget_after_s applies at the next check."""
        d = orjson.loads(raw)
        config = config or NodeTaskConfig()
        # snapshots before the detector protocol kept the lemon's timing in the task
        d["lemon"].setdefault("next_judgement", d.get("next_lemon", 0.0))
        # the index first (its rows are every detector's); a snapshot written before the index
        # had one node order per detector, which each detector's from_state puts in this order
        last_ts = d["last_ts"]
        index = NodeIndex(
            last_ts,
            [np.nan if t is None else t for t in last_ts.values()],
            # older snapshots lack these: each node's seq is not known (admitted by time until its
            # next sample) and no instance was given
            d.get("last_seq", ()),
            d.get("instances", ()),
        )
        return cls(
            jobs=jobs,
            config=config,
            index=index,
            **{  # a detector newer than the snapshot starts empty
                reg.name: reg.detector.from_state(d[reg.name], getattr(config, reg.name), index)
                for reg in NODE_DETECTORS
                if reg.name in d
            },
            failed_jobs_seen=set(d["failed_jobs_seen"]),
            # older snapshots lack these: the census starts again
            first_seen=_by_row(index, d.get("first_seen", {}), np.nan),
            census_at=_by_row(index, d.get("census_at", {}), -np.inf),
            # older snapshots: each node's run starts at its next sample (cold until warm_up_s)
            steady_since=_by_row(index, d.get("steady_since", {}), np.nan),
            seen_at=_by_row(index, d.get("seen_at", {}), np.nan),
            pauses=steady.Pauses.from_state(d.get("pauses")),
            forget_clock=d.get("forget_clock", 0.0),  # older snapshots: checked on the first batch
            metrics=metrics,
        )


def _by_name(names: list[str], values: np.ndarray, keep: Any) -> dict[str, float]:
    """A per-node array as a snapshot keeps it: node -> value, where keep(value)."""
    rows = np.flatnonzero(keep(values))
    return dict(zip([names[r] for r in rows.tolist()], values[rows].tolist(), strict=True))


def _by_row(index: NodeIndex, by_name: dict[str, float], fill: float) -> np.ndarray:
    """A snapshot's node -> value as an array over the index's rows (fill where absent)."""
    values = np.fromiter(by_name.values(), dtype=np.float64, count=len(by_name))
    return index.place(list(by_name), values, np.full(len(index), fill))
