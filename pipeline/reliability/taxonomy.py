"""The failure taxonomy: what a job's end state says, and what a finding says about the cause.

A job end is `completed`, `user` (the application's own failure), `system_software` or `hardware`
(each with a component), or `other` (ends that are nobody's failure: cancelled, preempted,
timed out). Slurm's end state says whether the end can be a failure at all; the findings on the
job's nodes near its end say whose (pipeline/reliability/attribution.py applies the window).

Components follow the paper's Fig. 4 causes, named by what an SRE would repair: `gpu`,
`gpu_memory`, `nvlink`, `pcie`, `ib_link`, `network`, `filesystem_mount`, `storage`, `thermal`,
`host` for the hardware; `driver` and `kernel` for the system software; `node` for a node that
stopped answering with nothing else to name (NODE_FAIL without a finding, a silent node).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Domain = Literal["hardware", "system_software", "user"]
Category = Literal["completed", "user", "system_software", "hardware", "other"]
CATEGORIES: tuple[Category, ...] = ("completed", "user", "system_software", "hardware", "other")

# Slurm end states (sacct's names). NODE_FAIL and BOOT_FAIL are never the user's: the node went.
NODE_ENDS = frozenset({"NODE_FAIL", "BOOT_FAIL"})
# Ends the application can cause: a failure whose cause the findings decide.
FAILED_ENDS = frozenset({"FAILED", "OUT_OF_MEMORY"})
COMPLETED_ENDS = frozenset({"COMPLETED"})
# Everything else (CANCELLED, TIMEOUT, PREEMPTED, REQUEUED, DEADLINE, UNKNOWN, a state a newer Slurm
# adds) is `other`: not a failure of anyone fleetwatch can name, counted but never in r_f.


def end_state_of(state: str, end_state: str | None) -> str:
    """Slurm's end state; job/1 messages without one (the simulator, replays) map from `state`."""
    if end_state:
        return end_state
    return "FAILED" if state == "failed" else "COMPLETED"


@dataclass(frozen=True)
class Cause:
    """What one finding says about a job failure: the domain it blames, the component, and its
    priority among several findings in one window (lower wins: the most specific diagnosis, as
    the paper's differential diagnosis rules causes out)."""

    domain: Domain
    component: str
    priority: int


# finding kind -> cause; kinds absent here are not causes: `statistical` (an anomaly, not a
# diagnosis), `straggler` (slow, not failed), `lemon` (derived from the failures themselves: it
# would attribute every failure on a lemon to itself), `kernel_log` (records missed: a gap in the
# evidence, not a fault).
# Priorities follow docs/reliability.md's order of components (lower wins), the most specific
# diagnosis first: a driver or firmware XID (a GSP timeout) before the bus, whose lost GPU is its
# symptom; a silent node and hung tasks last.
ORDER = (
    "gpu",
    "gpu_memory",
    "driver",
    "nvlink",
    "pcie",
    "ib_link",
    "network",
    "filesystem_mount",
    "storage",
    "thermal",
    "node",
    "kernel",
)
PRIORITY = {c: i for i, c in enumerate(ORDER)}


def _cause(domain: Domain, component: str) -> Cause:
    return Cause(domain, component, PRIORITY[component])


KIND_CAUSE: Mapping[str, Cause] = {
    "device_count": _cause("hardware", "gpu"),  # a GPU gone from the bus
    "ecc": _cause("hardware", "gpu_memory"),
    "row_remap": _cause("hardware", "gpu_memory"),
    "xid": _cause("hardware", "gpu"),  # refined by the XID's catalogued cause: xid_cause()
    "nvlink": _cause("hardware", "nvlink"),
    "nvswitch": _cause("hardware", "nvlink"),
    "pcie": _cause("hardware", "pcie"),
    "pcie_link": _cause("hardware", "pcie"),
    "ib_link": _cause("hardware", "ib_link"),
    "eth_link": _cause("hardware", "network"),
    "mount": _cause("hardware", "filesystem_mount"),
    "block_device": _cause("hardware", "storage"),
    "disk": _cause("hardware", "storage"),
    "thermal": _cause("hardware", "thermal"),
    "host": _cause("hardware", "node"),  # a silent node (detectors/silence.py)
    "hung_tasks": _cause("system_software", "kernel"),
}
# XIDs whose catalogued failure is GPU memory (double-bit ECC, row-remap failures, contained and
# uncontained memory errors) and the one that is the bus (fell off the bus)
MEMORY_XIDS = frozenset({48, 63, 64, 92, 94, 95})
BUS_XIDS = frozenset({79})


def finding_cause(kind: str, rule: str | None, evidence: Mapping[str, Any]) -> Cause | None:
    """The cause a finding names, or None when it names none (see KIND_CAUSE)."""
    if kind == "host" and rule not in (None, "silent"):
        return None  # the host kind's other rules (a clock off) fail no job
    if kind == "device_count" and rule == "hca_count":
        return _cause("hardware", "ib_link")  # an InfiniBand adapter gone, not a GPU
    cause = KIND_CAUSE.get(kind)
    if cause is None or kind != "xid":
        return cause
    return xid_cause(evidence, cause)


def xid_cause(evidence: Mapping[str, Any], default: Cause) -> Cause | None:
    """An XID finding by its worst code's catalogued cause (detectors/xid_catalog.py)."""
    why = evidence.get("cause")
    if why == "application":
        return None  # the application's own error: the failure stays the user's
    if why == "driver":
        return _cause("system_software", "driver")
    worst = evidence.get("worst_xid")
    if isinstance(worst, int) and worst in MEMORY_XIDS:
        return _cause("hardware", "gpu_memory")
    if isinstance(worst, int) and worst in BUS_XIDS:
        return _cause("hardware", "pcie")
    return default
