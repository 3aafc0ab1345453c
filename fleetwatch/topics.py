"""Kafka topic names (DESIGN.md, "Data flow")."""

TELEMETRY = "fleet.telemetry.v1"  # key = node
JOBS = "fleet.jobs.v1"  # key = job
STEPS = "fleet.steps.v1"  # key = job
TRUTH = "fleet.truth.v1"  # key = node; simulator ground truth only
NODE_FEATURES = "fleet.nodefeatures.v1"  # key = job; repartition for peer comparison
STATE = "fleet.state.v1"  # compacted worker state snapshots
FINDINGS = "fleet.findings.v1"  # key = node
DRAIN = "scheduler.drain.v1"  # key = node
DEADLETTER = "fleet.deadletter.v1"

DETECT_GROUP = "fleetwatch-detect"
ACT_GROUP = "fleetwatch-act"

ALL = (TELEMETRY, JOBS, STEPS, TRUTH, NODE_FEATURES, STATE, FINDINGS, DRAIN, DEADLETTER)
COMPACTED = frozenset({STATE})
