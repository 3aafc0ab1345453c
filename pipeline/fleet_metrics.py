"""Prometheus metrics of fleet state that the detect worker exports (what SREs see in Grafana).

Per-node and per-GPU gauges are not set sample by sample: at 16k node-samples/s that would
cost more than the detectors. The tasks keep their latest values in numpy arrays anyway, and
a custom collector reads them when Prometheus scrapes.

Nothing here reaches the tasks by itself: a task exports only to the FleetStateCollector it is
given (NodeTask/JobTask `metrics`, default None: nothing exported), and only the commands wire
this process's one collector into the global registry (`exported()`, pipeline/detect.py), so a task
built by `fleetwatch eval`, a benchmark or a test leaves prometheus_client's REGISTRY alone.

Label cardinality is bounded and chosen for a 16k-GPU cluster (2,048 nodes x 8 GPUs): each
worker exports only the nodes of the partitions it owns (a task leaves the registry when its
partition is revoked) and only nodes heard from within the node stage's forget_after_s (a
forgotten node's series go with its state, pipeline/node_stage.py), so fleet-wide:
- per node (node): health score + one state series + clock skew          ~6k series
- per GPU and signal (node, gpu, signal), 3 signals: value + anomaly score   ~98k series
- per job and node (job, node): step-time median and slowdown, nodes in running jobs  <= ~4k
- findings by (kind, severity): 11 x 3

Per-node series (node, GPU and clock-skew gauges) are bounded against a flood of made-up names too
(issue 23, item 9: 10,000 names sent once each had taken /metrics from 9 KB to 15 MB): they are
exported for every warm node (one that has reported steadily for the node stage's warm_up_s,
pipeline/steady.py) and for at most COLD_NODES others per worker, those with the worst health
first, and for at most MAX_EXPORTED_NODES in all (names warm up by reporting steadily, which a
made-up name can do too); the rest are counted in fleetwatch_detect_nodes_unexported. A new
fleet's first warm-up (20 minutes by default) shows at most COLD_NODES nodes per worker.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import REGISTRY, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fleetwatch.detectors.findings import TOO_MANY_JOBS, TOO_MANY_MEMBERS
from fleetwatch.schemas import FINDING_KINDS

FINDINGS = Counter(
    "fleetwatch_findings_total", "findings emitted (opened or escalated)", ["kind", "severity"]
)
FINDINGS_RESOLVED = Counter("fleetwatch_findings_resolved_total", "findings resolved", ["kind"])
# exported at 0 from the start, one series per finding kind (a bounded set): the dashboards' rates
# of resolved findings read 0, not "no data", until the first incident resolves
for _kind in sorted(FINDING_KINDS):
    FINDINGS_RESOLVED.labels(_kind)
SAMPLES = Counter("fleetwatch_detect_samples_total", "telemetry node-samples run through the detectors")
LATENCY = Histogram(
    "fleetwatch_finding_latency_seconds",
    "wall time from the sample that raised a finding to the finding being produced",
    ["kind"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
)
COLD_NODES = 256  # per-node series exported per worker for nodes not warm yet (worst health first)
# per-node series exported per worker in all (worst health first), where its tasks' configuration
# says none ([detect.node] exported_nodes): names warm up by reporting steadily, which an agent that
# makes them up can do too; twice a 16k-GPU fleet's nodes
MAX_EXPORTED_NODES = 4096

CONSUMER_LAG = Gauge(
    "fleetwatch_consumer_lag_messages",
    "high watermark - position, per input partition",
    ["group", "topic", "partition"],
)

STATES = ("healthy", "suspect", "degraded")
HEALTH_BY_SEVERITY = {"info": 0.9, "warning": 0.6, "critical": 0.1}


class NodeSource(Protocol):
    def node_health(self) -> Iterator[tuple[str, float, str]]:
        """(node, health score, state) for every node the task holds."""
        ...

    def gpu_signals(self) -> Iterator[tuple[str, int, str, float, float]]:
        """(node, gpu, signal, latest value, anomaly score or NaN)."""
        ...

    def open_incidents(self) -> Iterator[tuple[str, str]]:
        """(kind, severity) of every open incident."""
        ...

    def clock_skews(self) -> Iterator[tuple[str, float]]:
        """(node, its latest sample's timestamp minus the time the broker took it)."""
        ...

    def warm_nodes(self) -> set[str]:
        """The nodes that have reported steadily for the warm-up (pipeline/steady.py)."""
        ...


class JobSource(Protocol):
    def open_incidents(self) -> Iterator[tuple[str, str]]:
        """(kind, severity) of every open incident."""
        ...

    def job_step_times(self) -> Iterator[tuple[str, str | None, float, float]]:
        """(job, node or None for the job median, median step time, slowdown vs peers)."""
        ...


class FleetStateCollector(Collector):
    """What the tasks export: their live state, read at scrape time (weakly held: a dropped task is
    gone), and the counters they keep as they work. Tasks are given one (NodeTask/JobTask
    `metrics`); none is registered anywhere until a command does it (exported())."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: weakref.WeakSet[Any] = weakref.WeakSet()
        self._jobs: weakref.WeakSet[Any] = weakref.WeakSet()
        # the tasks' counters, in no registry of their own: collect() exports them with the state
        self.new_nodes = Counter(
            "fleetwatch_detect_new_nodes_total",
            "node names this worker started holding (a first sample; a flood of made-up names shows here)",
            registry=None,
        )
        self.stale_samples = Counter(
            "fleetwatch_detect_stale_samples_total",
            "telemetry samples dropped as duplicate or out of order",
            registry=None,
        )
        self.nodes_forgotten = Counter(
            "fleetwatch_detect_nodes_forgotten_total",
            "nodes forgotten after forget_after_s without telemetry",
            registry=None,
        )
        self.ports_refused = Counter(
            "fleetwatch_detect_ports_refused_total",
            "IB ports (kind ib) and Ethernet interfaces (eth) of a sample left unjudged: their node "
            "already has as many as one sample may list (new names in every sample: a hostile or "
            "misconfigured agent)",
            ["kind"],
            registry=None,
        )
        self.jobs_forgotten = Counter(
            "fleetwatch_detect_jobs_forgotten_total",
            "running jobs the job stage forgot without seeing them end, the least recently active past "
            "its bound on running jobs (reason max_jobs) or on the nodes they list (max_members)",
            ["reason"],
            registry=None,
        )
        for reason in (TOO_MANY_JOBS, TOO_MANY_MEMBERS):  # exported at 0: an alert rule sees the series
            self.jobs_forgotten.labels(reason)
        self.stale_job_records = Counter(
            "fleetwatch_detect_stale_job_records_total",
            "step and node-feature records dropped as duplicate, out of order, or sent after their job ended",
            registry=None,
        )

    def add_nodes(self, src: NodeSource) -> None:
        with self._lock:
            self._nodes.add(src)

    def add_jobs(self, src: JobSource) -> None:
        with self._lock:
            self._jobs.add(src)

    def remove(self, src: Any) -> None:
        with self._lock:
            self._nodes.discard(src)
            self._jobs.discard(src)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            nodes, jobs = list(self._nodes), list(self._jobs)
        health = GaugeMetricFamily(
            "fleetwatch_node_health_score",
            "1 = healthy; the worst open finding sets it (0.9 info, 0.6 warning, 0.1 critical)",
            labels=["node"],
        )
        state = GaugeMetricFamily(
            "fleetwatch_node_state",
            "1 for the node's current state: healthy, suspect, degraded",
            labels=["node", "state"],
        )
        value = GaugeMetricFamily(
            "fleetwatch_gpu_signal",
            "latest value of a GPU signal behind findings",
            labels=["node", "gpu", "signal"],
        )
        score = GaugeMetricFamily(
            "fleetwatch_gpu_anomaly_score",
            "calibrated anomaly score in [0,1] of a GPU signal vs its sibling GPUs (0.999: 1 in 1000)",
            labels=["node", "gpu", "signal"],
        )
        skew = GaugeMetricFamily(
            "fleetwatch_node_clock_skew_seconds",
            "a node's latest sample timestamp minus the time the broker took it (refused samples too: "
            "a node whose clock runs ahead has its samples dead-lettered as clock_skew)",
            labels=["node"],
        )
        open_counts: dict[tuple[str, str], int] = {}
        for src in [*nodes, *jobs]:
            for key in src.open_incidents():
                open_counts[key] = open_counts.get(key, 0) + 1
        opened = GaugeMetricFamily(
            "fleetwatch_open_findings", "open findings held by this worker", labels=["kind", "severity"]
        )
        for (kind, sev), n in sorted(open_counts.items()):
            opened.add_metric([kind, sev], n)
        # every warm node, and the COLD_NODES other nodes in the worst health
        healths: list[tuple[str, float, str]] = []
        cold: list[tuple[float, str]] = []
        for src in nodes:
            warm = src.warm_nodes()
            for node, h, st in src.node_health():
                healths.append((node, h, st))
                if node not in warm:
                    cold.append((h, node))
        cold.sort()
        hidden = {node for _, node in cold[COLD_NODES:]}
        limit = max((getattr(src, "exported_nodes", MAX_EXPORTED_NODES) for src in nodes), default=0)
        if len(healths) - len(hidden) > limit:
            shown = sorted((h, node) for node, h, _st in healths if node not in hidden)
            hidden.update(node for _h, node in shown[limit:])
        held = GaugeMetricFamily(
            "fleetwatch_detect_nodes", "nodes this worker holds, warm or not yet", labels=["warmth"]
        )
        held.add_metric(["warm"], len(healths) - len(cold))
        held.add_metric(["cold"], len(cold))
        unexported = GaugeMetricFamily(
            "fleetwatch_detect_nodes_unexported",
            f"nodes whose per-node series are not exported: not warm yet beyond {COLD_NODES} per worker, "
            "or any beyond [detect.node] exported_nodes (4096; the worst health first are exported)",
        )
        unexported.add_metric([], len(hidden))
        for node, h, st in healths:
            if node in hidden:
                continue
            health.add_metric([node], h)
            for s in STATES:
                state.add_metric([node, s], 1.0 if s == st else 0.0)
        for src in nodes:
            for node, s in src.clock_skews():
                if node not in hidden:
                    skew.add_metric([node], s)
            for node, gpu, sig, v, a in src.gpu_signals():
                if node in hidden:
                    continue
                g = str(gpu)
                value.add_metric([node, g, sig], v)
                if a == a:  # not NaN: no score during warm-up
                    score.add_metric([node, g, sig], a)
        step = GaugeMetricFamily(
            "fleetwatch_job_step_time_seconds",
            "a node's rolling median step compute time in its job",
            labels=["job", "node"],
        )
        median = GaugeMetricFamily(
            "fleetwatch_job_step_time_median_seconds",
            "median over the job's nodes of their median step time",
            labels=["job"],
        )
        slow = GaugeMetricFamily(
            "fleetwatch_job_node_slowdown", "node median step time / peer median - 1", labels=["job", "node"]
        )
        for src in jobs:
            for job, node, t, sd in src.job_step_times():
                if node is None:
                    median.add_metric([job], t)
                else:
                    step.add_metric([job, node], t)
                    slow.add_metric([job, node], sd)
        yield from (health, state, value, score, skew, step, median, slow, opened, held, unexported)
        for counter in (
            self.new_nodes,
            self.stale_samples,
            self.nodes_forgotten,
            self.ports_refused,
            self.stale_job_records,
            self.jobs_forgotten,
        ):
            yield from counter.collect()


_exported: FleetStateCollector | None = None
_exported_lock = threading.Lock()


def exported() -> FleetStateCollector:
    """This process's collector in prometheus_client's global REGISTRY (what /metrics serves),
    registered on the first call; for the commands (fleetwatch detect) to hand their tasks."""
    global _exported
    with _exported_lock:
        if _exported is None:
            _exported = FleetStateCollector()
            REGISTRY.register(_exported)
        return _exported


def count_findings(findings: list[dict[str, Any]], now: float) -> None:
    """Counters and the sample-to-finding latency for findings about to be produced."""
    for f in findings:
        if f["resolved"]:
            FINDINGS_RESOLVED.labels(f["kind"]).inc()
        else:
            FINDINGS.labels(f["kind"], f["severity"]).inc()
            LATENCY.labels(f["kind"]).observe(max(0.0, now - f["ts"]))
