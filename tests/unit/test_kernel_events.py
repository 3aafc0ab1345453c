"""What a kernel-log event means (detectors/kernel_events.py): NVIDIA's bucket for an XID, the line's
own Fatal for NVLink5 XIDs and NVSwitch SXids, the driver's recovery action above all, and a kind
this release does not know as a warning (never dropped, never a drain)."""

from __future__ import annotations

import pytest

from fleetwatch.detectors.kernel_events import judge


@pytest.mark.parametrize(
    ("event", "severity", "action"),
    [
        ({"kind": "xid", "code": 79}, "critical", "drain_node"),  # RESTART_BM
        ({"kind": "xid", "code": 13}, "warning", "restart_app"),
        ({"kind": "xid", "code": 149, "severity": "fatal"}, "critical", "drain_node"),  # NVLink5, Fatal
        ({"kind": "xid", "code": 145, "severity": "nonfatal"}, "warning", "investigate"),
        ({"kind": "xid", "code": 154, "recovery_action": 4}, "critical", "drain_node"),  # drain and reset
        ({"kind": "xid", "code": 154, "recovery_action": 1}, "critical", "reset_gpu"),
        ({"kind": "xid", "code": 154, "recovery_action": 0}, "info", "none"),
        ({"kind": "xid", "code": 154, "recovery_action": 7}, "critical", "drain_node"),  # NVML 615: reboot
        ({"kind": "xid", "code": 154, "recovery_action": 9}, "warning", "investigate"),  # a value none names
        ({"kind": "fallen_off_bus"}, "critical", "drain_node"),
        ({"kind": "sxid", "code": 20034, "severity": "fatal"}, "critical", "drain_node"),
        ({"kind": "sxid", "code": 12028, "severity": "nonfatal"}, "warning", "investigate"),
        ({"kind": "aer", "severity": "fatal"}, "critical", "drain_node"),
        ({"kind": "aer", "severity": "corrected"}, "info", "none"),
        ({"kind": "thermal_trip_from_a_newer_agent"}, "warning", "investigate"),
        ({"kind": "xid", "code": 4000}, "warning", "investigate"),  # beyond NVIDIA's catalogue
    ],
)
def test_judgement(event: dict, severity: str, action: str) -> None:
    j = judge(event)
    assert (j.severity, j.action) == (severity, action) and j.name
