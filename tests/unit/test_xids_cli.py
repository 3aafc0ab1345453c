"""`fleetwatch xids`: a saved kernel log in, one JSON object per event out, with what each means."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

from tests.helpers.paths import REPO

FIXTURES = REPO / "tests" / "fixtures" / "kernel_log"
FIELDS = {"kind", "code", "pci", "severity", "action", "text"}


def _xids(*argv: str, stdin: bytes | None = None) -> tuple[int, list[dict], str]:
    r = subprocess.run(
        [sys.executable, "-m", "fleetwatch.cli", "xids", *argv],
        input=stdin,
        capture_output=True,
        timeout=60,
        cwd=REPO,
    )
    return r.returncode, [orjson.loads(x) for x in r.stdout.splitlines()], r.stderr.decode()


def test_a_saved_log_gives_its_events_with_severity_action_gpu_and_uuid() -> None:
    rc, events, err = _xids(str(FIXTURES / "fallen_off_bus.txt"), "--gpus", "3=00000000:91:00.0")
    assert rc == 0, err
    assert [(e["kind"], e.get("code")) for e in events] == [
        ("fallen_off_bus", None),
        ("xid", 79),
        ("xid", 79),
        ("xid", 79),
        ("fallen_off_bus", None),
    ]
    assert all(FIELDS - {"code"} <= set(e) for e in events)
    assert all(e["severity"] == "critical" and e["action"] == "drain_node" for e in events)
    gpu3 = [e for e in events if e["pci"] == "0000:91:00.0"]
    assert len(gpu3) == 2 and all(e["gpu"] == 3 for e in gpu3)
    assert all(e["uuid"] == "GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b" for e in gpu3)  # from "GPU at PCI:"
    # where in the file each event starts, for the SRE who opens it
    lines = (FIXTURES / "fallen_off_bus.txt").read_text().splitlines()
    assert all("NVRM" in lines[e["line"] - 1] for e in events)
    assert "5 events" in err


def test_stdin_and_the_recovery_action_decides() -> None:
    rc, events, _err = _xids("-", stdin=(FIXTURES / "nvlink5_xid.txt").read_bytes())
    assert rc == 0
    drain = [e for e in events if e.get("recovery_action") == 4]
    assert drain and all((e["severity"], e["action"]) == ("critical", "drain_node") for e in drain)
    reset = [e for e in events if e.get("recovery_action") == 1]
    assert reset and all(e["action"] == "reset_gpu" for e in reset)


def test_garbage_is_counted_not_fatal(tmp_path: Path) -> None:
    junk = tmp_path / "junk.log"
    junk.write_bytes(
        b"\x00\xff\xfe garbage\n" + b"A" * 200_000 + b"\nNVRM: Xid (PCI:0000:9b:00): 99999999999, x\n"
    )
    rc, events, err = _xids(str(junk))
    assert rc == 0 and events == []
    assert "1 lines that broke an event's grammar" in err


def test_a_bad_gpu_map_is_a_clear_error() -> None:
    rc, _events, err = _xids(str(FIXTURES / "nvrm_xid.txt"), "--gpus", "zero=0000:9b:00.0")
    assert rc == 2 and "--gpus" in err and "Traceback" not in err
