"""Kafka topic names (docs/contract.md, "Kafka topics")."""

TELEMETRY = "fleet.telemetry.v1"  # key = node
JOBS = "fleet.jobs.v1"  # key = job; compacted: each job's latest job/1, null = forgotten (JOB_HISTORY_S)
STEPS = "fleet.steps.v1"  # key = job
TRUTH = "fleet.truth.v1"  # key = node; simulator ground truth only
NODE_FEATURES = "fleet.nodefeatures.v1"  # key = job; repartition for peer comparison
STATE = "fleet.state.v1"  # compacted worker state snapshots
FINDINGS = "fleet.findings.v1"  # key = node
DRAIN = "scheduler.drain.v1"  # key = node
DRAIN_RESULTS = "scheduler.drain.results.v1"  # key = node; drain_result/1 from the Slurm adapter
NODES = "fleet.nodes.v1"  # key = node; compacted census of reporting nodes (node/1, null = forgotten)
DEADLETTER = "fleet.deadletter.v1"
# key = switch name: operators' fleet-wide switches (control/1: the drain pause). NOT compacted:
# compaction would keep only a switch's last offset, so a replayed old pause (signed, but older)
# written after its lift would be all that a restarted act reads. Kept CONTROL_RETENTION_S instead.
CONTROL = "fleet.control.v1"
CONTROL_RETENTION_S = 8 * 86400.0  # longer than any pause (7 days at most)
# key = node; `act --dry-run`'s would-be drain/1 requests: no adapter reads this topic
DRAIN_DRY_RUN = "scheduler.drain.dryrun.v1"
# key = node; compacted: each node as Slurm shows it (slurm_node/1, from slurm-drainer)
SLURM_NODES = "scheduler.nodes.v1"

DETECT_GROUP = "fleetwatch-detect"
ACT_GROUP = "fleetwatch-act"
ACT_DRY_RUN_GROUP = "fleetwatch-act-dry-run"  # a shadow act must not take the real one's partitions

ALL = (
    TELEMETRY,
    JOBS,
    STEPS,
    TRUTH,
    NODE_FEATURES,
    STATE,
    FINDINGS,
    DRAIN,
    DRAIN_RESULTS,
    NODES,
    DEADLETTER,
    CONTROL,
    DRAIN_DRY_RUN,
    SLURM_NODES,
)
COMPACTED = frozenset({STATE, NODES, JOBS, SLURM_NODES})
# How long an ended job stays on fleet.jobs.v1: the lemon detector's window of failed jobs
# (pipeline/job_table.py keeps failures this long). The job publisher tombstones a job (key = job,
# value null) once its end is older than this, and compaction then drops all its records, so the
# topic holds about one window of jobs however old the cluster is; each worker keeps the lemon
# history those jobs added in its own snapshotted state. Here, not in pipeline/, because the
# publisher (collectors/) must not import the pipeline.
JOB_HISTORY_S = 7 * 86400.0
# Topics written by nodes, the scheduler and training jobs, whose clocks fleetwatch does not own,
# by the Slurm adapter on the scheduler's host (its node views and its answers) and by operators'
# hosts (the drain pause): kept with LogAppendTime, so each record carries the time the broker took
# it, the reference its message's own timestamp is checked against (fleetwatch.schemas.ClockLimits;
# act's view of Slurm, alerts/slurm_nodes.py; the pause, alerts/drain_pause.py), and the order of
# one writer's records whatever its clock did (a Slurm view before or after a drain's answer,
# alerts/actor.py). A replay checks a record against the same reference as the first reading did.
BROKER_TIMED = frozenset({TELEMETRY, JOBS, STEPS, SLURM_NODES, CONTROL, DRAIN_RESULTS})
