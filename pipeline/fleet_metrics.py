"""Prometheus metrics of fleet state that the detect worker exports (what SREs see in Grafana).

Label cardinality is bounded and chosen for a 16k-GPU cluster (2,048 nodes x 8 GPUs): each
worker exports only the nodes of the partitions it owns, so the fleet-wide series count is:
- per node (node): health score + one state series  ->   2 x 2,048 = ~4k series
- per GPU and signal (node, gpu, signal), 4 signals:  value + anomaly score -> 2 x 65,536 = ~131k
- per job and node (job, node): step-time median and slowdown: nodes in running jobs, <= ~4k
- findings by (kind, severity): 11 x 3; open findings likewise
When a partition moves to another worker, the old worker removes the series of that
partition's nodes, so a node is exported by one worker at a time.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

NODE_HEALTH = Gauge(
    "fleetwatch_node_health_score",
    "1 = healthy; falls with the severity of the node's open findings (0.6 warning, 0.1 critical)",
    ["node"],
)
NODE_STATE = Gauge(
    "fleetwatch_node_state",
    "1 for the node's current state: healthy, suspect (info/statistical), degraded (warning+)",
    ["node", "state"],
)
GPU_SIGNAL = Gauge(
    "fleetwatch_gpu_signal", "latest value of a GPU signal behind findings", ["node", "gpu", "signal"]
)
GPU_ANOMALY = Gauge(
    "fleetwatch_gpu_anomaly_score",
    "calibrated anomaly score in [0,1] of a GPU signal against its job peers (0.999 = 1-in-1000 unusual)",
    ["node", "gpu", "signal"],
)
FINDINGS = Counter(
    "fleetwatch_findings_total", "findings emitted (opened or escalated)", ["kind", "severity"]
)
FINDINGS_RESOLVED = Counter("fleetwatch_findings_resolved_total", "findings resolved", ["kind"])
OPEN_FINDINGS = Gauge("fleetwatch_open_findings", "open findings held by this worker", ["kind", "severity"])
JOB_STEP_TIME = Gauge(
    "fleetwatch_job_step_time_seconds",
    "a node's rolling median step compute time in its job",
    ["job", "node"],
)
JOB_STEP_MEDIAN = Gauge(
    "fleetwatch_job_step_time_median_seconds", "the job's median of its nodes' median step times", ["job"]
)
JOB_SLOWDOWN = Gauge("fleetwatch_job_node_slowdown", "node step time / peer median - 1", ["job", "node"])
SAMPLES = Counter("fleetwatch_detect_samples_total", "telemetry node-samples run through the detectors")
LATENCY = Histogram(
    "fleetwatch_finding_latency_seconds",
    "wall time from a sample's timestamp to its finding being produced",
    ["kind"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
)
CONSUMER_LAG = Gauge(
    "fleetwatch_consumer_lag_messages", "end offset - committed offset", ["group", "topic", "partition"]
)

STATES = ("healthy", "suspect", "degraded")
