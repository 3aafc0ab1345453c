"""The simulated nodes' kernel logs, as the agent's `kernel` source reports them (telemetry/1
`kernel`, collectors/kernel_log/source.py): a node running that source next to NVML.

- Every XID the driver raises is logged too, so an XID reaches the pipeline from both sources, as
  on a real node, and the detectors must count it once.
- Some faults show only here: an NVSwitch SXid, a PCIe AER error, the probe-time "fallen off the
  bus" message (no XID number), records the ring buffer overwrote before the agent read them; and
  what an XID's line says beyond its code (an NVLink5 XID's Fatal, XID 154's recovery action).
- A quiet tick sends no section (the agent's rule): only nodes with something to say carry one.

The event fields and line texts are those of the real source for the real lines in
tests/fixtures/kernel_log (the sim writes the same forms); PCI addresses are an HGX H100 board's.
"""

from __future__ import annotations

import uuid
from typing import Any

# The eight GPUs' PCI bus numbers on an HGX H100 8-GPU board (as lspci lists them), and the
# upstream port above each (one PCIe switch port per GPU); beyond eight, a made-up regular layout.
_HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_BOOT_NS = uuid.UUID("2d6b8f0e-3c1a-4e57-9b1f-6a0c4d9e8b21")  # fixed: boot ids stable across runs


def gpu_pci(gpu: int) -> str:
    bus = _HGX_BUSES[gpu] if gpu < len(_HGX_BUSES) else 0x100 - 8 + gpu % 8
    return f"0000:{bus:02x}:00.0"


def port_pci(gpu: int) -> str:
    """The PCIe switch port above the GPU (its bus minus one: the switch's downstream port)."""
    bus = int(gpu_pci(gpu).split(":")[1], 16) - 1
    return f"0000:{bus:02x}:00.0"


def xid_text(gpu: int, code: int, what: str) -> str:
    """An XID line as r535+ drivers print it (fixtures/kernel_log/nvrm_xid.txt)."""
    return f"NVRM: Xid (PCI:{gpu_pci(gpu)[:-2]}): {code}, pid=2024380, name=python3, {what}"


class SimKernelLog:
    """Each node's kernel-log events of the current tick; `section(node)` is what its agent sends."""

    def __init__(self, names: list[str]) -> None:
        self._boot = [str(uuid.uuid5(_BOOT_NS, name)) for name in names]
        self._events: dict[int, list[dict[str, Any]]] = {}
        self._missed: dict[int, int] = {}

    def begin_tick(self) -> None:
        self._events = {}
        self._missed = {}

    def event(self, node: int, event: dict[str, Any]) -> None:
        """One event; a repeat of the same event in a tick is folded into its `count`, as the
        agent folds repeats."""
        events = self._events.setdefault(node, [])
        for e in events:
            if {k: v for k, v in e.items() if k != "count"} == event:
                e["count"] += 1
                return
        events.append({**event, "count": 1})

    def xid(self, node: int, gpu: int, code: int, what: str = "", **line: Any) -> None:
        text = xid_text(gpu, code, what or "see NVIDIA's Xid catalogue")
        self.event(node, {"kind": "xid", "code": code, "pci": gpu_pci(gpu), "gpu": gpu, "text": text, **line})

    def lost_records(self, node: int, n: int) -> None:
        """Records the ring buffer overwrote past the agent's cursor (a flood, or the agent behind)."""
        self._missed[node] = self._missed.get(node, 0) + n

    def section(self, node: int) -> dict[str, Any] | None:
        events, missed = self._events.get(node), self._missed.get(node)
        if not events and not missed:
            return None
        out: dict[str, Any] = {"boot": self._boot[node], "events": events or []}
        out["records"] = sum(e["count"] for e in events or ())
        if missed:
            out["missed"] = missed
        return out
