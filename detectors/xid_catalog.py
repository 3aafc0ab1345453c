"""What an NVIDIA XID means and what to do about it.

Sources: NVIDIA, "XID Errors" (https://docs.nvidia.com/deploy/xid-errors/index.html) and its
"Analyzing Xid Errors with the Xid Catalog" table for Ampere and newer GPUs
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), which gives each XID a
mnemonic, a description and "resolution buckets" (RESTART_APP, RESET_GPU, CONTACT_SUPPORT, ...).
The severity here is fleetwatch's operational reading of those buckets for a training cluster:

- application-side XIDs (13, 31, 43, 45, ...) are the job's fault (bad kernel, illegal address, a
  process killed after an earlier error): info/warning, never drain on them alone. A GPU that
  keeps producing them across jobs is the lemon detector's business, not this table's;
- memory, bus, link and firmware failures (48, 64, 74, 79, 95, 119, 120, ...) make the GPU unfit
  for the next job: critical, and the action layer drains;
- early-warning hardware signals (63, 92, 94) are warning: the GPU keeps working, but needs a reset
  at the next convenient moment or watching.

Codes not in the table become `unknown` with severity warning (an unknown XID is worth a look, but
not worth draining a node over).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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

    @property
    def action_text(self) -> str:
        return ACTION_TEXT[self.action]


def _x(code: int, name: str, description: str, cause: Cause, severity: Severity, action: Action) -> XidInfo:
    return XidInfo(code, name, description, cause, severity, action)


# fmt: off
CATALOG: dict[int, XidInfo] = {
    x.code: x
    for x in (
        _x(8, "GPU stopped processing", "channel idle timeout: the GPU stopped making progress",
           "driver", "warning", "restart_app"),
        _x(13, "Graphics Engine Exception", "usually an application fault (out-of-range access, illegal "
           "instruction); rarely driver or hardware", "application", "warning", "restart_app"),
        _x(31, "GPU memory page fault", "the application touched an unmapped/illegal GPU address "
           "(MMU fault)", "application", "warning", "restart_app"),
        _x(32, "Invalid or corrupted push buffer stream", "command stream corrupted: driver, PCIe "
           "transfer error or application", "driver", "warning", "restart_app"),
        _x(38, "Driver firmware error", "the driver saw an error from GPU firmware", "driver",
           "warning", "reset_gpu"),
        _x(43, "GPU stopped processing", "reset channel verification error: the application hit a fault "
           "and its channel was torn down; the GPU is fine", "application", "info", "none"),
        _x(45, "Preemptive cleanup, due to previous errors", "a process was killed or cleaned up after an "
           "earlier error (often follows 13/31/43)", "application", "info", "none"),
        _x(46, "GPU stopped processing", "the GPU is hung and does not respond", "driver", "critical",
           "reset_gpu"),
        _x(48, "Double Bit ECC Error", "uncorrectable (double-bit) ECC error in GPU memory", "hardware",
           "critical", "drain_node"),
        _x(54, "Auxiliary power is not connected to the GPU board", "board power problem", "hardware",
           "critical", "drain_node"),
        _x(57, "Error programming video memory interface", "memory interface initialisation failed",
           "hardware", "critical", "rma"),
        _x(61, "Internal micro-controller breakpoint/warning", "GPU firmware (PMU) hit a breakpoint or "
           "warning; may precede a halt (62)", "driver", "warning", "reset_gpu"),
        _x(62, "Internal micro-controller halt", "GPU firmware halted; the GPU needs a reset",
           "hardware", "critical", "reset_gpu"),
        _x(63, "ECC page retirement or row remapping recording event", "a memory row/page was marked "
           "for remapping; it takes effect at the next GPU reset", "hardware", "warning", "reset_gpu"),
        _x(64, "ECC page retirement or row remapper recording failure", "the remap/retirement could not "
           "be recorded (e.g. no spare rows left)", "hardware", "critical", "rma"),
        _x(68, "NVDEC0 Exception", "video decoder engine exception", "hardware", "warning", "reset_gpu"),
        _x(69, "Graphics Engine class error", "illegal class/method from the command stream",
           "application", "warning", "restart_app"),
        _x(74, "NVLink Error", "an NVLink link error (bad link, cable/bridge, or NVSwitch side)",
           "hardware", "critical", "drain_node"),
        _x(79, "GPU has fallen off the bus", "the GPU is no longer reachable over PCIe (bus, power, "
           "thermal or board failure)", "hardware", "critical", "drain_node"),
        _x(92, "High single-bit ECC error rate", "correctable ECC errors above the driver's rate "
           "threshold: memory is degrading", "hardware", "warning", "none"),
        _x(94, "Contained ECC error", "uncorrectable ECC error contained to the application that hit "
           "it; other work on the GPU is unaffected", "hardware", "warning", "restart_app"),
        _x(95, "Uncontained ECC error", "uncorrectable ECC error that could not be contained: every "
           "application on the GPU is affected", "hardware", "critical", "drain_node"),
        _x(109, "Context Switch Timeout Error", "a context switch did not complete in time",
           "application", "warning", "restart_app"),
        _x(119, "GSP RPC Timeout", "the GPU System Processor did not answer a driver RPC in time",
           "driver", "critical", "reset_gpu"),
        _x(120, "GSP Error", "the GPU System Processor reported an error", "driver", "critical",
           "reset_gpu"),
        _x(140, "Unrecovered ECC Error", "uncorrectable memory error the driver could not retire or "
           "remap", "hardware", "critical", "drain_node"),
    )
}
# fmt: on


def lookup(code: int) -> XidInfo:
    """Catalog entry for `code`; unknown codes get a generic warning entry named "unknown"."""
    info = CATALOG.get(code)
    if info is None:
        return XidInfo(
            code, "unknown", f"XID {code} is not in fleetwatch's catalog", "unknown", "warning", "investigate"
        )
    return info
