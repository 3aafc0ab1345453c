"""The agent's kernel source on this machine's real kernel log and the real broker: real driver lines
(tests/fixtures/kernel_log) written into /dev/kmsg, read back by `fleetwatch collect --source
kernel`, reach fleet.telemetry.v1 once each, across an agent restart, and again after a reboot (the
spool's cursor made to belong to another boot, which is what a reboot leaves behind).

/dev/kmsg must be readable and writable (root, as CI runs): without it the test fails, it does not
skip. The kernel log keeps earlier runs' lines, and the source folds repeats of an event (same
code, same device) into one: each run's lines name devices of their own (a random PCI domain).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from fleetwatch import topics
from tests.helpers.paths import REPO

KMSG = Path("/dev/kmsg")


def _printk(message: str) -> None:
    """One record in the kernel log, as a driver's printk leaves it (level 4, warning)."""
    with KMSG.open("w") as f:
        f.write(f"<4>{message}\n")


def _collect(bootstrap: str, node: str, spool: Path, samples: int) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "fleetwatch.cli", "collect", "--bootstrap", bootstrap, "--source", "kernel",
         "--node", node, "--interval", "0.3", "--spool-dir", str(spool), "--count", str(samples)],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]


def _events(tail: Any, node: str, samples: int, domain: str) -> list[dict[str, Any]]:
    recs = tail.collect(lambda rs: sum(1 for x in rs if x.key == node.encode()) >= samples, 60)
    msgs = [m for m in tail.messages(recs) if m["node"] == node]
    assert len(msgs) >= samples
    assert all(m["agent"]["source_errors"] == {} for m in msgs), [m["agent"] for m in msgs]
    events = [e for m in msgs for e in m.get("kernel", {}).get("events", [])]
    return [e for e in events if e["pci"].startswith(domain)]


def test_kernel_events_from_the_real_kernel_log_once_each_across_restart_and_reboot(
    kafka_bootstrap: str, topic_tail: Any, tmp_path: Path
) -> None:
    assert os.access(KMSG, os.R_OK | os.W_OK), "/dev/kmsg must be readable and writable (run as root)"
    marker = f"fw{uuid.uuid4().hex[:8]}"
    node = f"kmsg-{marker}"
    domain = marker[2:6]  # this run's PCI domain: its devices are no earlier run's
    tail = topic_tail(topics.TELEMETRY)
    # real lines (nvrm_xid.txt, nvswitch_sxid.txt) with this run's process name
    _printk(f"NVRM: Xid (PCI:{domain}:9b:00): 119, pid=2024380, name={marker}, Timeout after 6s of waiting")
    sxid = f"nvidia-nvswitch0: SXid (PCI:{domain}:05:00.0): 20034, "
    for part in (
        f"Fatal, Link 62 LTSSM Fault Up {marker}",
        "Severity 1 Engine instance 62 Sub-engine instance 00",
        "Data {0x10000000, 0x10000000, 0x00000000}",
    ):
        _printk(sxid + part)
    _collect(kafka_bootstrap, node, tmp_path, 3)
    first = _events(tail, node, 3, domain)
    assert [(e["kind"], e["code"]) for e in first] == [("xid", 119), ("sxid", 20034)]
    assert first[0]["process"] == marker and first[0]["pci"] == f"{domain}:9b:00.0"
    assert first[1]["engine"] == 62 and first[1]["data"].startswith("0x10000000")
    assert all(isinstance(e["seq"], int) and e["since_boot_s"] > 0 for e in first)

    # restart: what was read is not read again; what came meanwhile is
    _printk(
        f"NVRM: Xid (PCI:{domain}:91:00): 79, pid='<unknown>', name={marker}, GPU has fallen off the bus."
    )
    _collect(kafka_bootstrap, node, tmp_path, 3)
    second = _events(tail, node, 3, domain)
    assert [(e["kind"], e["code"]) for e in second] == [("xid", 79)]

    # a reboot: the cursor in the spool is of another boot; the new boot is read from its start
    with sqlite3.connect(tmp_path / f"{node}.sqlite") as db:
        db.execute("UPDATE meta SET v = v + 1 WHERE k = 'kmsg_boot'")
    _collect(kafka_bootstrap, node, tmp_path, 3)
    third = _events(tail, node, 3, domain)
    assert [(e["kind"], e["code"]) for e in third] == [("xid", 119), ("sxid", 20034), ("xid", 79)]
