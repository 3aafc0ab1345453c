"""What the hardware detector (detectors/hardware.py) makes of the kernel log's events
(telemetry/1 `kernel`, collectors/kernel_log), each judged by detectors/kernel_events.py:

- xid: joins its GPU's XID burst, the incident NVML's XIDs open (kind xid, rule xid_burst). An XID
  that both report is one XID, whichever arrives first: `sighted` pairs each sighting with an
  unpaired one of the same code from the other source within `xid_same_event_s` (sample times),
  and only the unpaired count. The kernel log still sees what NVML cannot: XIDs logged while the
  agent was down (read from the ring buffer at its restart), a GPU whose NVML calls hang, and what
  a line says beyond the code (an NVLink5 XID's Fatal, XID 154's recovery action: `xid_variant`).
- fallen_off_bus: the lost-GPU incident (kind pcie, rule gpu_lost), the one NVML's lost or
  vanished GPU opens: one finding whichever says it first. Critical, drains.
- sxid: an NVSwitch error, kind nvswitch, rule sxid, one incident per node (a switch is not a
  GPU); fatal ones take the fabric's links down: critical, drains. Non-fatal: a warning.
- aer: a PCIe Advanced Error Reporting error, kind pcie, rule aer, on the GPU below the port where
  the event names one, else on the node. Fatal uncorrectable: critical (drains, as critical PCIe
  findings do); non-fatal uncorrectable: a warning; corrected: info (its rate is what matters,
  which the replay counters judge).
- io_error: a block device's failed request (the block layer's or a filesystem's line): kind
  block_device, rule io_errors, a warning naming the device; hung_task: the kernel's hung-task
  watchdog, kind hung_tasks, rule hung_task_report, a warning naming the task; nfs_timeout: kind
  mount, rule nfs_not_responding, a warning naming the server. The node checks judge the same
  conditions from the agent's own probes (detectors/node_checks.py): these are what the kernel
  itself said.
- an event of a kind this release does not know (a newer agent): kind kernel_log, rule
  unknown_event, a warning with its text, never a drain.
- records the kernel's ring buffer overwrote past the agent's cursor before it read them
  (`missed`: while the agent was down, or during a flood): kind kernel_log, rule records_missed,
  a warning: whatever they said is lost, so a fault may have gone unseen. Never a drain. Records
  already gone when an agent first starts on a node (`gone_before_start`) are not a finding: at a
  rollout every node that has been up a while has some.

Events are few (a sample carries at most 256 distinct ones, repeats folded into a count), so they
are read one by one; none of this runs for the common sample, which carries no `kernel` section.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from fleetwatch.detectors import xid_catalog
from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.detectors.counters import positions_in
from fleetwatch.detectors.kernel_events import RECOVERY_ACTIONS, judge

MAX_COUNT = 2**32  # one event's repeats as counted (a hostile count cannot make a number huge)
MAX_PENDING = 64  # unpaired sightings an XID incident keeps (the oldest go first)
KNOWN_KINDS = frozenset({"xid", "sxid", "fallen_off_bus", "aer", "io_error", "hung_task", "nfs_timeout"})
# the one-line events of the node's storage and tasks: (finding kind, rule)
STORAGE_EVENTS = {
    "io_error": ("block_device", "io_errors"),
    "hung_task": ("hung_tasks", "hung_task_report"),
    "nfs_timeout": ("mount", "nfs_not_responding"),
}
_TEXT = 200  # characters of an event's own line kept in evidence


def accepted_events(
    batch: TelemetryBatch, acc: np.ndarray
) -> Iterator[tuple[int, dict[str, Any], dict[str, Any]]]:
    """(position among the accepted rows `acc`, section, event) of every kernel-log event of an
    accepted message, in message order; a section with no event yields (position, section, {})
    once, for its counts."""
    if not len(batch.kernel_msg):
        return
    pos = positions_in(acc, batch.size, batch.kernel_msg).tolist()
    for p, section in zip(pos, batch.kernel, strict=True):
        if p < 0:
            continue
        events = section.get("events") or ()
        if not events:
            yield p, section, {}
        for e in events:
            yield p, section, e


def count_of(event: dict[str, Any]) -> int:
    n = event.get("count", 1)
    return min(max(int(n), 1), MAX_COUNT) if isinstance(n, int) and not isinstance(n, bool) else 1


def xid_variant(event: dict[str, Any]) -> str:
    """What a kernel-log XID says beyond its code that changes the verdict: "ra<N>" for a recovery
    action NVML defines (XID 154 and any event that carries one), "fatal" for an NVLink5 XID whose
    line says Fatal; "" for the code alone. Bounded: an XID incident counts by code and variant."""
    ra = event.get("recovery_action")
    if isinstance(ra, int) and not isinstance(ra, bool) and ra in RECOVERY_ACTIONS:
        return f"ra{ra}"
    code = event.get("code")
    if (
        event.get("severity") == "fatal"
        and isinstance(code, int)
        and xid_catalog.lookup(code).bucket == "WORKFLOW_NVLINK5_ERR"
    ):
        return "fatal"
    return ""


def variant_info(code: int, variant: str) -> xid_catalog.XidInfo:
    """The catalogue's entry for `code`, with the severity and action its variant's line asks for
    (detectors/kernel_events.judge: the recovery action, or NVIDIA's NVLink5 workflow)."""
    info = xid_catalog.lookup(code)
    if not variant:
        return info
    event: dict[str, Any] = {"kind": "xid", "code": code}
    if variant.startswith("ra"):
        event["recovery_action"] = int(variant[2:])
    else:
        event["severity"] = variant
    j = judge(event)
    return xid_catalog.XidInfo(
        code, f"{info.name} ({j.name})" if variant.startswith("ra") else f"{info.name} (fatal)",
        info.description, info.cause, j.severity, j.action, info.bucket, info.mnemonic,  # type: ignore[arg-type]
    )  # fmt: skip


def sighted(extra: dict[str, Any], source: str, code: int, ts: float, n: int, window_s: float) -> int:
    """How many of `n` sightings of XID `code` by `source` ("nvml" or "kernel") at sample time `ts`
    are new XIDs: the others pair with sightings of the same code by the other source within
    `window_s`, which were counted when they came. The unpaired wait in the incident's `extra`
    ("unpaired": {"<source>:<code>": [[ts, n], ...]}), bounded, until the window passes; "first_by"
    counts the XIDs each source reported first."""
    unpaired: dict[str, list[list[float]]] = extra.setdefault("unpaired", {})
    other = "kernel" if source == "nvml" else "nvml"
    theirs_key, mine_key = f"{other}:{code}", f"{source}:{code}"
    theirs = [x for x in unpaired.pop(theirs_key, []) if ts - x[0] <= window_s]
    left = n
    while theirs and left:
        take = min(left, int(theirs[0][1]))
        theirs[0][1] -= take
        left -= take
        if theirs[0][1] <= 0:
            theirs.pop(0)
    if theirs:
        unpaired[theirs_key] = theirs
    if left:
        mine = [x for x in unpaired.pop(mine_key, []) if ts - x[0] <= window_s]
        if mine and mine[-1][0] == ts:
            mine[-1][1] += left
        else:
            mine.append([ts, left])
        unpaired[mine_key] = mine[-MAX_PENDING:]
        first_by = extra.setdefault("first_by", {})
        first_by[source] = first_by.get(source, 0) + left
    if len(unpaired) > MAX_PENDING:  # many codes: drop what the window passed, then the oldest
        for key in sorted(unpaired, key=lambda k: unpaired[k][-1][0])[: len(unpaired) - MAX_PENDING]:
            del unpaired[key]
    return left


def event_evidence(event: dict[str, Any]) -> dict[str, Any]:
    """The fields of a kernel-log event that say what and where, for a finding's evidence."""
    keep = (
        "device",
        "server",
        "process",
        "code",
        "pci",
        "port",
        "hca",
        "severity",
        "link",
        "unit",
        "switch",
        "error_type",
        "pci_id",
        "errors",
    )
    out = {k: event[k] for k in keep if k in event}
    text = event.get("text")
    if isinstance(text, str):
        out["text"] = text[:_TEXT]
    return out


def missed_records(section: dict[str, Any]) -> int:
    """Records past the agent's cursor the ring buffer lost before it read them."""
    missed = section.get("missed", 0)
    return min(missed, MAX_COUNT) if isinstance(missed, int) and not isinstance(missed, bool) else 0
