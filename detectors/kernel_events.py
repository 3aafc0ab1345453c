"""What a kernel-log event (telemetry/1 `kernel.events[]`, collectors/kernel_log) means: its
severity and the action it asks for.

- xid: the XID catalogue (xid_catalog.py: NVIDIA's resolution buckets), where an NVLink5 XID
  (144-150) whose line says Fatal drains; XID 154 says itself what the driver wants (its recovery
  action: NVML's nvmlDeviceGpuRecoveryAction_t values, 0 none, 1 GPU reset, 2 node reboot, 3 drain
  P2P, 4 drain and reset), and so does any event that carries a recovery action;
- fallen_off_bus: the GPU no longer answers on PCIe: critical, drain (it needs a reboot at least);
- sxid: an NVSwitch error: fatal ones take the fabric's links down (critical, drain), non-fatal
  ones are a warning;
- aer: a PCIe error on the device: fatal uncorrectable critical, non-fatal warning, corrected info
  (corrected errors matter by their rate, which the hardware rules judge on counters);
- io_error, hung_task, nfs_timeout: a disk's failed request, a task the kernel's watchdog found
  hung, an NFS server not answering: warnings to look at (the node checks judge the mounts and
  devices themselves: the agent's probes and sysfs).
An event of a kind this release does not know is a warning to look at, never dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleetwatch.detectors import xid_catalog

# nvmlDeviceGpuRecoveryAction_t (nvml.h): the driver's own verdict, the strongest signal there is
RECOVERY_ACTIONS: dict[int, tuple[str, str, str]] = {  # value -> (name, severity, action)
    0: ("none", "info", "none"),
    1: ("GPU reset", "critical", "reset_gpu"),
    2: ("node reboot", "critical", "drain_node"),
    3: ("drain P2P", "critical", "drain_node"),
    4: ("drain and reset", "critical", "drain_node"),
    # added in NVML 610-615; headers disagree on 5 (GPU bus reset in nvidia-ml-py, IMEX domain
    # recovery in a later nvml.h): each takes the GPU out of work until an operator acts
    5: ("GPU bus reset or IMEX domain recovery", "critical", "drain_node"),
    6: ("bus reset", "critical", "drain_node"),
    7: ("system reboot", "critical", "drain_node"),
}


@dataclass(frozen=True, slots=True)
class Judgement:
    severity: str  # info | warning | critical
    action: str  # xid_catalog.ACTION_TEXT's keys
    name: str  # what the event is, in a few words


def judge(event: Mapping[str, Any]) -> Judgement:
    kind, code = event.get("kind"), event.get("code")
    recovery = event.get("recovery_action")
    if isinstance(recovery, int) and not isinstance(recovery, bool):
        name, severity, action = RECOVERY_ACTIONS.get(
            recovery, (f"recovery action {recovery}", "warning", "investigate")
        )
        return Judgement(severity, action, f"GPU recovery action: {name}")
    if kind == "xid" and isinstance(code, int):
        info = xid_catalog.lookup(code)
        if info.bucket == "WORKFLOW_NVLINK5_ERR" and event.get("severity") == "fatal":
            # NVIDIA's NVLink5 workflow: the line's own Fatal takes the link (and its job) down
            return Judgement("critical", "drain_node", f"XID {code} {info.name} (fatal)")
        return Judgement(info.severity, info.action, f"XID {code} {info.name}")
    if kind == "fallen_off_bus":
        return Judgement("critical", "drain_node", "GPU has fallen off the bus")
    if kind == "sxid":
        if event.get("severity") == "fatal":
            return Judgement("critical", "drain_node", f"NVSwitch SXid {code} (fatal)")
        return Judgement("warning", "investigate", f"NVSwitch SXid {code}")
    if kind == "aer":
        sev = event.get("severity")
        if sev == "fatal":
            return Judgement("critical", "drain_node", "PCIe uncorrectable (fatal) error")
        if sev == "nonfatal":
            return Judgement("warning", "investigate", "PCIe uncorrectable (non-fatal) error")
        return Judgement("info", "none", "PCIe corrected error")
    if kind == "io_error":  # the block layer or a filesystem gave up on a request: the disk is failing
        return Judgement("warning", "investigate", f"I/O error on {str(event.get('device', 'a disk'))[:32]}")
    if kind == "hung_task":  # the kernel's hung-task watchdog: a task in D state past its timeout
        return Judgement(
            "warning", "investigate", f"task {str(event.get('process', '?'))[:32]} hung in the kernel"
        )
    if kind == "nfs_timeout":
        return Judgement(
            "warning", "investigate", f"NFS server {str(event.get('server', '?'))[:64]} not responding"
        )
    return Judgement("warning", "investigate", f"kernel event {kind!s:.32}")
