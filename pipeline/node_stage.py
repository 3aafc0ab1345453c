"""The per-node stage: telemetry (keyed by node) -> hardware, statistical and lemon findings,
plus per-node features re-keyed by job for the straggler stage.

A task holds the detectors for the nodes of one fleet.telemetry.v1 partition. Duplicate and
out-of-order samples (ts not after the node's last accepted ts) are dropped before any
detector sees them and counted: at-least-once delivery upstream makes duplicates normal,
and an XID must not be counted twice.
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

from detectors.batch import GPU_COL, TelemetryBatch
from detectors.gpu_stats import GpuStats, GpuStatsConfig
from detectors.hardware import HardwareDetector
from detectors.lemon import LemonConfig, LemonScorer
from detectors.silence import SilenceConfig, SilenceDetector
from fleetwatch import schemas, topics
from pipeline import fleet_metrics
from pipeline.job_table import JobTable
from pipeline.tasks import Output

log = logging.getLogger(__name__)

STALE = Counter(
    "fleetwatch_detect_stale_samples_total", "telemetry samples dropped as duplicate or out of order"
)

_FEATURE_COLS = {
    "util": GPU_COL["util"],
    "sm_clock_mhz": GPU_COL["sm_clock_mhz"],
    "power_w": GPU_COL["power_w"],
}


@dataclass
class NodeTaskConfig:
    lemon_every_s: float = 60.0  # event-time period of lemon judgements
    emit_features: bool = True
    lemon: LemonConfig = field(default_factory=LemonConfig)
    silence: SilenceConfig = field(default_factory=SilenceConfig)
    stats: GpuStatsConfig = field(default_factory=GpuStatsConfig)

    @classmethod
    def for_time_scale(cls, scale: float) -> NodeTaskConfig:
        """Defaults with the day-long lemon windows shortened by `scale` (compressed scenarios)."""
        lemon = LemonConfig()
        return cls(
            lemon_every_s=cls.lemon_every_s * scale,
            lemon=replace(
                lemon,
                tau_s=lemon.tau_s * scale,
                episode_gap_s=lemon.episode_gap_s * scale,
                clear_after_s=lemon.clear_after_s * scale,
            ),
        )


@dataclass(eq=False)  # identity: tasks are registered with the metrics collector
class NodeTask:
    jobs: JobTable
    config: NodeTaskConfig = field(default_factory=NodeTaskConfig)
    hardware: HardwareDetector = field(default_factory=HardwareDetector)
    lemon: LemonScorer | None = None
    silence: SilenceDetector | None = None
    stats: GpuStats | None = None
    last_ts: dict[str, float] = field(default_factory=dict)
    failed_jobs_seen: set[str] = field(default_factory=set)
    next_lemon: float = 0.0

    def __post_init__(self) -> None:
        if self.lemon is None:
            self.lemon = LemonScorer(self.config.lemon)
        if self.silence is None:
            self.silence = SilenceDetector(self.config.silence)
        if self.stats is None:
            self.stats = GpuStats(self.config.stats)
        fleet_metrics.COLLECTOR.add_nodes(self)

    @staticmethod
    def warm_up() -> None:
        """Load the compiled code the stage runs (the telemetry scanner, the counter and statistical
        kernels) from numba's cache, compiling it first on a fresh install (~2 min on 2 cores)."""
        from detectors import counter_kernels, stat_kernels
        from fleetwatch import telemetry_scan

        telemetry_scan.warm_up()
        counter_kernels.warm_up()
        stat_kernels.warm_up()

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
        findings = self.hardware.process(batch)
        nodes = batch.nodes()
        jobs = self.jobs.jobs_of(nodes)
        findings += self.silence.process(
            self.last_ts,
            set(nodes),
            float(batch.ts.max()),
            batch=batch,
            prev_ts=prev_ts,
        )
        findings += self.stats.process(batch, nodes)
        out: list[Output] = [(topics.FINDINGS, f["node"], f) for f in findings]
        out += self._lemon(batch, nodes, findings)
        if self.config.emit_features:
            out += self._features(batch, nodes, jobs)
        return out

    # ------------------------------------------------------------ what Prometheus reads (fleet_metrics)

    def node_health(self) -> Iterator[tuple[str, float, str]]:
        worst: dict[str, tuple[float, str]] = {}
        for book in (self.hardware.book, self.silence.book, self.stats.book, self.lemon.book):
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
        for book in (self.hardware.book, self.silence.book, self.stats.book, self.lemon.book):
            for inc in list(book.open.values()):
                yield inc.kind, inc.severity

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

    def _lemon(self, batch: TelemetryBatch, nodes: list[str], findings: list[dict[str, Any]]) -> list[Output]:
        lemon, ts = self.lemon, batch.ts
        lemon.observe_samples(nodes, ts)
        # A node's history: its XIDs (Meta's lemon signal counts them), the findings that open on
        # it and the failed jobs it was in; the scorer merges events close in time into one episode.
        events = [(float(ts[m]), nodes[m], 1.0) for m in batch.xid_msg.tolist()]
        events += [
            (f["ts"], f["node"], 1.0)
            for f in findings
            if not f["resolved"]
            and f["ts"] == f["first_seen"]
            and f["kind"] != "lemon"
            and f["severity"] != "info"
        ]
        now = float(ts.max())
        mine = set(nodes)
        for job, job_nodes in list(self.jobs.failed_jobs.items()):
            if job not in self.failed_jobs_seen:
                self.failed_jobs_seen.add(job)
                # Blame is shared: a failed 8-node job is 1/8 of an event for each of its nodes, so
                # a lemon's job-mates do not inherit its history, while a node that keeps turning
                # up in failed jobs with different peers accumulates it.
                share = lemon.cfg.job_failure_weight / max(1, len(job_nodes))
                events += [(now, n, share) for n in job_nodes if n in mine]
        if events:
            events.sort()
            lemon.observe_events([e[1] for e in events], [e[0] for e in events], [e[2] for e in events])
        if now < self.next_lemon:
            return []
        self.next_lemon = now + self.config.lemon_every_s
        return [(topics.FINDINGS, f["node"], f) for f in lemon.judge(now)]

    def _features(self, batch: TelemetryBatch, nodes: list[str], jobs: list[str | None]) -> list[Output]:
        """One nodefeatures/1 per sample of a node that is in a running job, keyed by the job."""
        if not any(jobs):
            return []
        with warnings.catch_warnings():  # all-NaN rows (a node without GPU metrics) are expected
            warnings.simplefilter("ignore", RuntimeWarning)
            means = {k: np.nanmean(batch.gpu[:, :, c], axis=1) for k, c in _FEATURE_COLS.items()}
        lost = batch.lost.sum(axis=1)
        out: list[Output] = []
        seq = batch.seq
        for i in np.flatnonzero([j is not None for j in jobs]):
            msg: dict[str, Any] = {
                "schema": schemas.NODE_FEATURES,
                "node": nodes[i],
                "job": jobs[i],
                "ts": float(batch.ts[i]),
                "seq": int(seq[i]),
                "gpus_lost": int(lost[i]),
            }
            for k, v in means.items():
                if v[i] == v[i]:  # not NaN: absent stays absent
                    msg[k] = round(float(v[i]), 3)
            out.append((topics.NODE_FEATURES, jobs[i], msg))
        return out

    def to_bytes(self) -> bytes:
        return orjson.dumps(
            {
                "hardware": self.hardware.to_state(),
                "lemon": self.lemon.to_state(),
                "silence": self.silence.to_state(),
                "stats": self.stats.to_state(),
                "last_ts": self.last_ts,
                "failed_jobs_seen": sorted(self.failed_jobs_seen),
                "next_lemon": self.next_lemon,
            }
        )

    @classmethod
    def from_bytes(cls, raw: bytes, jobs: JobTable, config: NodeTaskConfig | None = None) -> NodeTask:
        d = orjson.loads(raw)
        config = config or NodeTaskConfig()
        return cls(
            jobs=jobs,
            config=config,
            hardware=HardwareDetector.from_state(d["hardware"]),
            lemon=LemonScorer.from_state(d["lemon"], config.lemon),
            silence=SilenceDetector.from_state(d["silence"], config.silence),
            stats=GpuStats.from_state(d["stats"]),
            last_ts=d["last_ts"],
            failed_jobs_seen=set(d["failed_jobs_seen"]),
            next_lemon=d["next_lemon"],
        )
