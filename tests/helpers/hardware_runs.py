"""The hardware detector fed messages in batches as the node stage feeds it (after its admission),
every finding checked against finding/1: for the hardware tests (test_detect_hardware.py,
test_detect_links.py)."""

from __future__ import annotations

from typing import Any

from fleetwatch import schemas
from fleetwatch.detectors.hardware import HardwareDetector
from tests.helpers.admission import observe


def run(
    msgs: list[dict[str, Any]], det: HardwareDetector | None = None, batch: int = 1000
) -> list[dict[str, Any]]:
    det = det or HardwareDetector()
    out: list[dict[str, Any]] = []
    for i in range(0, len(msgs), batch):
        out += observe(det, det.index, msgs[i : i + batch])
    for f in out:
        schemas.validate(f, "finding/1")
    return out


def opened(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in findings if not f["resolved"]]
