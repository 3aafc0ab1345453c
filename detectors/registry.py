"""The per-node detectors, in the order the node stage runs them on each batch.

Adding one: a module in detectors/ whose class follows detectors/protocol.NodeDetector, a line
here, its configuration as a field of the same name in pipeline/node_stage.NodeTaskConfig and a
typed field of that name on NodeTask; docs/ARCHITECTURE.md ("How to add a detector") lists every
other place, and those that reach into a specific detector. The name is also its key in the
task's snapshot. The generic checks (tests/unit/test_detector_checks.py) then run against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetwatch.detectors.clock import ClockConfig, ClockDetector
from fleetwatch.detectors.gpu_stats import GpuStats, GpuStatsConfig
from fleetwatch.detectors.hardware import HardwareConfig, HardwareDetector
from fleetwatch.detectors.lemon import LemonConfig, LemonScorer
from fleetwatch.detectors.node_checks import NodeChecks, NodeChecksConfig
from fleetwatch.detectors.silence import SilenceConfig, SilenceDetector
from fleetwatch.detectors.straggler import StragglerConfig, StragglerDetector


@dataclass(frozen=True)
class Registered:
    name: str  # NodeTaskConfig's field with its configuration; its key in the task's snapshot
    # the class: Detector(config, index), Detector.from_state(state, config, index) for a node
    # detector (the task's NodeIndex); Detector(config), Detector.from_state(state, config) for a job one
    detector: Any
    config: type  # its configuration's class (defaults: config())


NODE_DETECTORS: tuple[Registered, ...] = (
    Registered("hardware", HardwareDetector, HardwareConfig),
    Registered("silence", SilenceDetector, SilenceConfig),
    Registered("stats", GpuStats, GpuStatsConfig),
    Registered("lemon", LemonScorer, LemonConfig),  # its history includes the findings above
    # after the lemon: a hung mount, a full disk or stuck processes are the node's surroundings
    # (a file server, a job's output) as often as its hardware; the jobs they fail still count
    Registered("node_checks", NodeChecks, NodeChecksConfig),
    Registered("clock", ClockDetector, ClockConfig),  # after the lemon: a clock is no hardware failure
)

# The job stage's detectors (detectors/protocol.JobDetector), in the order it runs them. Adding
# one: a module, a line here, its configuration as a field of the same name in
# pipeline/job_stage.JobTaskConfig and the task (its key in the snapshot too). The generic checks
# run on every one listed here.
JOB_DETECTORS: tuple[Registered, ...] = (Registered("straggler", StragglerDetector, StragglerConfig),)
