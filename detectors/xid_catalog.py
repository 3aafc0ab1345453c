"""What an NVIDIA XID means and what to do about it: NVIDIA's own verdict.

Every code's resolution bucket comes from NVIDIA's Xid Catalog (detectors/xid_nvidia.py, generated
from the checked-in catalogue), and the bucket decides the severity and the action here
(BUCKET_POLICY), not a hand-made table:

- RESTART_APP (the application's fault) is a warning, IGNORE and WORKFLOW_XID_45 (a clean-up that
  follows other errors) are info: they never drain. A GPU that keeps producing them across jobs is
  the lemon detector's business;
- RESET_GPU asks for a GPU reset: critical, action reset_gpu (act drains the node for it unless the
  site resets GPUs automatically, [act.policy] gpu_reset_automated);
- RESTART_BM / RESTART_VM (a reboot), CONTACT_SUPPORT and CHECK_MECHANICALS (hardware), and the
  workflow for NVLink errors (WORKFLOW_NVLINK_ERR) are critical and drain;
- the workflows that depend on the burst's other codes (in_workflow): a double-bit ECC error
  (WORKFLOW_XID_48) asks for a GPU reset alone and a drain with XID 63 or 64; a preemptive cleanup
  (WORKFLOW_XID_45) alone is a warning (restart the Fabric Manager), else the other codes decide;
- NVLink5 errors (144-150, WORKFLOW_NVLINK5_ERR) are a warning to investigate by code alone: their
  line says Fatal or Nonfatal, which the kernel-log events judge (detectors/kernel_events.py);
- XID 154 says itself what the driver wants (its recovery action: detectors/kernel_events.py);
- UPDATE_SWFW, CHECK_UVM and the codes NVIDIA gives no bucket (162-172) are a warning to look at.

The name and description are fleetwatch's short wording where it has one (CURATED), else
NVIDIA's. A code the catalogue does not know (beyond 172 today) is `unknown`, a warning to look
at: never a crash, never a drain, never dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from fleetwatch.detectors.xid_nvidia import NVIDIA_XIDS

Cause = Literal["hardware", "driver", "application", "unknown"]
Severity = Literal["info", "warning", "critical"]
Action = Literal["none", "restart_app", "reset_gpu", "drain_node", "rma", "investigate"]

ACTION_TEXT: dict[str, str] = {
    "none": "no action",
    "restart_app": "restart the application",
    "reset_gpu": "reset the GPU",
    "drain_node": "drain node",
    "rma": "drain node, RMA the GPU",
    "investigate": "investigate",
}


@dataclass(frozen=True, slots=True)
class XidInfo:
    code: int
    name: str
    description: str
    cause: Cause
    severity: Severity
    action: Action
    bucket: str = ""  # NVIDIA's immediate resolution bucket ('' where it gives none)
    mnemonic: str = ""

    @property
    def action_text(self) -> str:
        return ACTION_TEXT[self.action]


def _x(code: int, name: str, description: str, cause: Cause) -> tuple[int, str, str, Cause]:
    return code, name, description, cause


# fleetwatch's wording of the codes SREs meet most and what fails in each (hardware, driver, the
# application); severity and action are NVIDIA's bucket's
# fmt: off
_CURATED: dict[int, tuple[str, str, Cause]] = {
    code: (name, description, cause)
    for code, name, description, cause in (
        _x(8, "GPU stopped processing", "channel idle timeout: the GPU stopped making progress", "driver"),
        _x(13, "Graphics Engine Exception", "usually an application fault (out-of-range access, illegal "
           "instruction); rarely driver or hardware", "application"),
        _x(31, "GPU memory page fault", "the application touched an unmapped/illegal GPU address "
           "(MMU fault)", "application"),
        _x(32, "Invalid or corrupted push buffer stream", "command stream corrupted: driver, PCIe "
           "transfer error or application", "driver"),
        _x(38, "Driver firmware error", "the driver saw an error from GPU firmware", "driver"),
        _x(43, "GPU stopped processing", "reset channel verification error: the application hit a fault "
           "and its channel was torn down; the GPU is fine", "application"),
        _x(45, "Preemptive cleanup, due to previous errors", "a process was killed or cleaned up after an "
           "earlier error (often follows 13/31/43)", "application"),
        _x(46, "GPU stopped processing", "the GPU is hung and does not respond", "driver"),
        _x(48, "Double Bit ECC Error", "uncorrectable (double-bit) ECC error in GPU memory", "hardware"),
        _x(54, "Auxiliary power is not connected to the GPU board", "board power problem", "hardware"),
        _x(57, "Error programming video memory interface", "memory interface initialisation failed",
           "hardware"),
        _x(61, "Internal micro-controller breakpoint/warning", "GPU firmware (PMU) hit a breakpoint or "
           "warning; may precede a halt (62)", "driver"),
        _x(62, "Internal micro-controller halt", "GPU firmware halted; the GPU needs a reset", "hardware"),
        _x(63, "ECC page retirement or row remapping recording event", "a memory row/page was marked "
           "for remapping; it takes effect at the next GPU reset", "hardware"),
        _x(64, "ECC page retirement or row remapper recording failure", "the remap/retirement could not "
           "be recorded (e.g. no spare rows left)", "hardware"),
        _x(68, "NVDEC0 Exception", "video decoder engine exception", "hardware"),
        _x(69, "Graphics Engine class error", "illegal class/method from the command stream", "application"),
        _x(74, "NVLink Error", "an NVLink link error (bad link, cable/bridge, or NVSwitch side)", "hardware"),
        _x(79, "GPU has fallen off the bus", "the GPU is no longer reachable over PCIe (bus, power, "
           "thermal or board failure)", "hardware"),
        _x(92, "High single-bit ECC error rate", "correctable ECC errors above the driver's rate "
           "threshold: memory is degrading", "hardware"),
        _x(94, "Contained ECC error", "uncorrectable ECC error contained to the application that hit "
           "it; other work on the GPU is unaffected", "hardware"),
        _x(95, "Uncontained ECC error", "uncorrectable ECC error that could not be contained: every "
           "application on the GPU is affected", "hardware"),
        _x(109, "Context Switch Timeout Error", "a context switch did not complete in time", "application"),
        _x(119, "GSP RPC Timeout", "the GPU System Processor did not answer a driver RPC in time", "driver"),
        _x(120, "GSP Error", "the GPU System Processor reported an error", "driver"),
        _x(140, "Unrecovered ECC Error", "uncorrectable memory error the driver could not retire or "
           "remap", "hardware"),
    )
}
# fmt: on


# bucket -> (cause, severity, action)
BUCKET_POLICY: dict[str, tuple[Cause, Severity, Action]] = {
    "RESTART_APP": ("application", "warning", "restart_app"),
    "IGNORE": ("driver", "info", "none"),
    "WORKFLOW_XID_45": ("application", "info", "none"),
    "XID_154": ("driver", "info", "none"),
    "RESET_GPU": ("hardware", "critical", "reset_gpu"),
    "RESTART_BM": ("hardware", "critical", "drain_node"),
    "RESTART_VM": ("hardware", "critical", "drain_node"),
    "CONTACT_SUPPORT": ("hardware", "critical", "drain_node"),
    "CHECK_MECHANICALS": ("hardware", "critical", "drain_node"),
    "WORKFLOW_XID_48": ("hardware", "critical", "drain_node"),
    "WORKFLOW_NVLINK_ERR": ("hardware", "critical", "drain_node"),
    "WORKFLOW_NVLINK5_ERR": ("hardware", "warning", "investigate"),
    "UPDATE_SWFW": ("driver", "warning", "investigate"),
    "CHECK_UVM": ("driver", "warning", "investigate"),
}
_NO_BUCKET: tuple[Cause, Severity, Action] = ("unknown", "warning", "investigate")


def _entry(code: int, mnemonic: str, description: str, bucket: str) -> XidInfo:
    cause, severity, action = BUCKET_POLICY.get(bucket, _NO_BUCKET)
    curated = _CURATED.get(code)
    if curated is None:
        name = description if description not in ("", "Unused") else mnemonic
        return XidInfo(code, name, description or mnemonic, cause, severity, action, bucket, mnemonic)
    # what fails is the curated cause (XID 94 is a memory error, whatever its remedy); what to do
    # about it is NVIDIA's bucket
    name, text, cause = curated
    return XidInfo(code, name, text, cause, severity, action, bucket, mnemonic)


CATALOG: dict[int, XidInfo] = {
    code: _entry(code, mnemonic, description, bucket)
    for code, (mnemonic, description, bucket, _investigate) in NVIDIA_XIDS.items()
}


ROW_REMAP_XIDS = frozenset({63, 64})  # row remap recorded / failed: what makes a DBE's remedy a drain


def in_workflow(info: XidInfo, codes: frozenset[int]) -> XidInfo:
    """`info` as NVIDIA's multi-event workflows judge it among the other `codes` of its burst
    (the Xid Catalog's Resolution Buckets sheet, detectors/data/nvidia_xid_buckets.csv):

    - WORKFLOW_XID_48 (a double-bit ECC error): solo, RESET_GPU (critical, reset_gpu: the GPU
      retires the row at its reset); with XID 63 or 64 (a row remap recorded or failed), DRAIN_AND_RESET
      (critical, drain_node);
    - WORKFLOW_XID_45 (preemptive cleanup): solo, RESTART_FM (a warning: restart the Fabric
      Manager, investigate); not solo, IGNORE (info: the other XID's guidance decides).
    Every other entry is its bucket's verdict as it is."""
    if info.bucket == "WORKFLOW_XID_48":
        if codes & ROW_REMAP_XIDS:
            return replace(
                info, severity="critical", action="drain_node", name=f"{info.name} with a row remap"
            )
        return replace(info, severity="critical", action="reset_gpu")
    if info.bucket == "WORKFLOW_XID_45" and codes <= {45}:
        return replace(
            info, severity="warning", action="investigate", name=f"{info.name} (solo: restart Fabric Manager)"
        )
    return info


def lookup(code: int) -> XidInfo:
    """Catalog entry for `code`; unknown codes get a generic warning entry named "unknown"."""
    info = CATALOG.get(code)
    if info is None:
        return XidInfo(code, "unknown", f"XID {code} is not in NVIDIA's catalogue", *_NO_BUCKET)
    return info
