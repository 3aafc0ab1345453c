"""Text others sent, where it is shown (an adversarial probe's finds): a node's agent names its
devices, ports, mounts, NFS servers and hung processes, and those names reach finding summaries,
Alertmanager's annotations, the demo's console; a Slurm user names jobs, which reach report.md and
the Slurm publisher's log. Each is shown as one plain line: no control or format character (a
terminal escape, a carriage return forging a log line, a bidi override), no chat markup
(`<!channel>`, `<url|text>`, a Markdown link), no Rich markup."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
import unicodedata

import orjson
import pytest
from rich.console import Console

from fleetwatch import schemas, topics
from fleetwatch.alerts.alert_model import AlertBuilder
from fleetwatch.alerts.drain_pause import Pause
from fleetwatch.alerts.policy import drain_reason
from fleetwatch.bus import Record
from fleetwatch.demo import LiveView
from fleetwatch.detectors.hardware import HardwareDetector
from fleetwatch.detectors.node_checks import NodeChecks
from fleetwatch.pipeline.reliability.render import _md_cell
from fleetwatch.pipeline.telemetry_decode import decode_telemetry
from fleetwatch.plain_text import clean_text, no_markup
from tests.helpers.admission import observe
from tests.helpers.batches import telemetry
from tests.helpers.paths import REPO

T0 = 1_760_000_000.0
HOSTILE = {
    "server": "<!channel> <https://evil.example/login|VPN re-auth>",
    "device": "sda\n2026-01-01 ERROR forged\x1b[2K",
    "process": "\x1b]8;;https://evil\x07click\x1b]8;;\x07",
    "hca": "mlx5_0\r\n*all clear*",
    "blockdev": "nvme0n1\n\x1b[1mOK\x1b[0m <@here>",
    "mount": "/mnt/<!everyone> [click](https://evil.example)",
    "ib": "mlx5_0\n<!here>\u202e\x1b[8m",
    "eth": "eth0 <https://evil.example|x>",
}


def plain(text: str) -> bool:
    """One line, no control or format character, no chat or Markdown link markup."""
    return (
        not any(unicodedata.category(c)[0] == "C" for c in text)
        and "<" not in text
        and ">" not in text
        and "](" not in text
    )


def hostile_findings() -> list[dict]:
    m = telemetry("gpu-node-07", T0, 8, seq=1)
    m["kernel"] = {
        "events": [
            {"kind": "nfs_timeout", "server": HOSTILE["server"], "text": "x"},
            {"kind": "io_error", "device": HOSTILE["device"]},
            {"kind": "hung_task", "process": HOSTILE["process"]},
            {"kind": "aer", "severity": "fatal", "hca": HOSTILE["hca"]},
        ]
    }
    m["host"] = {**m.get("host", {}), "blockdevs_missing": 1, "mounts_missing": 1}
    m["checks"] = {
        "blockdevs": [{"name": HOSTILE["blockdev"], "problem": "missing"}],
        "mounts": [{"path": HOSTILE["mount"], "problem": "missing"}],
    }
    found = []
    for det in (HardwareDetector(), NodeChecks()):
        raw = orjson.dumps(schemas.validate(m, schemas.TELEMETRY))
        batch, bad = decode_telemetry([raw], now=T0 + 10, clock=None)
        assert bad == []
        found += observe(det, det.index, batch)
    det = HardwareDetector()
    for k, state in enumerate(("ACTIVE", "DOWN", "DOWN", "DOWN")):
        s = telemetry("gpu-node-07", T0 + 10 * k, 8, seq=k + 1)
        s["net"] = {
            "ib": [{"device": HOSTILE["ib"], "port": 1, "state": state, "rate_gbps": 400}],
            "eth": [{"iface": HOSTILE["eth"], "state": "up" if k == 0 else "down"}],
        }
        batch, bad = decode_telemetry(
            [orjson.dumps(schemas.validate(s, schemas.TELEMETRY))], now=T0 + 100, clock=None
        )
        assert bad == []
        found += observe(det, det.index, batch)
    return found


def test_node_text_in_summaries_and_alert_annotations_is_one_plain_line() -> None:
    found = hostile_findings()
    rules = {f["evidence"]["rule"] for f in found}
    assert {
        "aer",
        "io_errors",
        "hung_task_report",
        "blockdev_missing",
        "ib_port_state",
        "eth_link_down",
    } <= rules, rules
    builder = AlertBuilder("prod")
    for f in found:
        schemas.validate(f, schemas.FINDING)
        assert plain(f["summary"]), repr(f["summary"])
        _labels, annotations = builder.from_finding(f, drain_reason(f))
        assert plain(annotations["summary"]), repr(annotations["summary"])
        assert "<" not in annotations["evidence"] and ">" not in annotations["evidence"]
        orjson.loads(annotations["evidence"])  # still JSON
        assert "<" not in annotations["evidence"] and ">" not in annotations["evidence"]
        orjson.loads(annotations["evidence"])  # still JSON
    # what the node named is still there to read, made plain
    summaries = " ".join(f["summary"] for f in found)
    assert "\u2039!channel\u203a" in summaries and "[click] (https://evil.example)" in summaries


def test_clean_text_and_no_markup() -> None:
    assert clean_text("a\r\nb\x1b[2K\u202ec\u200b d", 50) == "a b [2K c d"
    assert clean_text("x" * 300, 10) == "xxxxxxx..."
    assert no_markup("<!here> [a](b) x > y") == "\u2039!here\u203a [a] (b) x \u203a y"


def test_the_demo_shows_a_summary_as_text_not_rich_markup() -> None:
    """A summary with Rich markup ([link=...], a closing tag that matches nothing) was styled, or
    stopped the demo's console with a MarkupError."""
    view = LiveView.__new__(LiveView)
    out = io.StringIO()
    view.console = Console(file=out, width=300, color_system=None)
    view.epoch, view.findings, view._seen, view.storms = T0, [], set(), None
    finding = {
        "id": "f1", "node": "n1", "severity": "critical", "resolved": False, "ts": T0 + 1, "kind": "xid",
        "summary": "n1: x[/bold] [link=https://evil.example]click[/link] [bold red]ALL CLEAR[/]",
    }  # fmt: skip

    class Reader:
        def poll(self, _timeout: float) -> list[Record]:
            return [Record(topics.FINDINGS, 0, 0, b"n1", orjson.dumps(finding), -1, False)]

    view.reader = Reader()  # type: ignore[assignment]
    view.poll()
    assert finding["summary"] in out.getvalue()  # shown as written, every bracket


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("[Re-auth](https://evil.example/sso)", r"\[Re-auth\]\(https://evil.example/sso\)"),
        ("<img src=x onerror=alert(1)>", r"\<img src=x onerror=alert\(1\)\>"),
        ("a|b\nc", r"a\|b c"),
        ("gpu-node-01: 3 failures", "gpu-node-01: 3 failures"),
    ],
)
def test_report_markdown_cells_show_their_text_literally(text: str, shown: str) -> None:
    assert _md_cell(text) == shown


def test_the_slurm_publisher_logs_an_unparsable_line_as_a_quoted_literal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A job name repeating Slurm's fields (its user's to choose) with a carriage return and a
    terminal escape: the line is logged as a quoted literal, which forges no log line."""
    from collections import OrderedDict

    from fleetwatch.collectors.slurm_jobs import jobcomp
    from fleetwatch.collectors.slurm_jobs.model import SlurmParseError
    from fleetwatch.collectors.slurm_jobs.publisher import Publisher

    raw = "JobId=7 UserId=a(1) Name=x\r\x1b[2K2026-05-12 INFO all good JobId=8 JobState=COMPLETED"
    with pytest.raises(SlurmParseError) as caught:
        jobcomp.parse_line(raw)
    pub = Publisher.__new__(Publisher)
    pub._logged = OrderedDict()
    caplog.set_level(logging.ERROR)
    pub.report(caught.value)
    assert "unparsable Slurm" in caplog.text
    assert "\x1b" not in caplog.text and "\r" not in caplog.text
    assert "\\r\\x1b[2K" in caplog.text  # the text is there, quoted


def test_a_summary_full_of_markup_stays_within_its_limit() -> None:
    """Making a Markdown link plain lengthens it (`](` becomes `] (`): two hung mounts whose
    paths are 127 of them each (within the 256 a path may have) made a summary past 500
    characters, which the finding's own check refused, failing the node's whole batch."""
    from tests.unit.test_detect_node_checks import T0 as T1
    from tests.unit.test_detect_node_checks import detect
    from tests.unit.test_detect_node_checks import sample as node_sample

    path = "/" + "](" * 127
    checks = {
        "mounts": [
            {"path": path, "problem": "hung", "fstype": "nfs", "took_s": 12.5},
            {"path": path + "x", "problem": "hung", "fstype": "nfs", "took_s": 12.5},
        ]
    }
    hung = {"mounts_hung": 2, "mounts_missing": 0}
    found = detect([node_sample(T1 + k, host=hung, checks=checks) for k in range(3)])
    assert found and all(len(f["summary"]) <= schemas.MAX_SUMMARY and plain(f["summary"]) for f in found)


# A Slurm Reason anyone with scontrol (or a node health check) wrote, as sinfo gives it: a line
# break kept whole, a forged log line after it, a terminal's escapes, chat markup
REASON = (
    "disk swap <!channel> see [runbook](http://evil.example/x)\n2025-06-01 12:00:00,000 INFO "
    "alerts.slurm_drainer: resume gpu-node-07 done\x1b[2K \x1b]8;;http://evil\x07click\x1b]8;;\x07"
)


def test_others_text_in_acts_own_alerts_is_one_plain_line() -> None:
    """act's alerts about a node carry others' text: the adapter's detail (a Slurm Reason), a
    validation's output, an operator's pause note. Each made plain as a finding's summary is (the
    critical FleetwatchDrainRefused paged a channel with a link, an adversarial probe's find)."""
    builder = AlertBuilder("prod")
    # an operator's pause, its reason and name as the control record's schema lets them be
    pause = Pause(reason=REASON.replace("\n", " "), by="alice\x1b[8m <@here>", since=T0, until=T0 + 3600)
    builder.paused = pause.note()  # as act sets it: on every alert while the pause lasts
    alerts = [
        builder.drain_refused("gpu-node-07", "adapter:not_ours", f"already drained: {REASON}", ["f1"]),
        builder.validation_failed("gpu-node-07", f"dcgmi diag -r 2 failed on GPU 3: {REASON}", ["f1"]),
        builder.node_drained("gpu-node-07", f"fleetwatch: {REASON}", ["f1"], flapping=True),
        builder.drains_paused(pause.note(), held=2),
    ]
    for a in alerts:
        summary = a["annotations"]["summary"]
        assert plain(summary) and "\u2039!channel\u203a" in summary, repr(summary)
        assert (
            plain(a["annotations"]["drains_paused"])
            and "\u2039@here\u203a" in a["annotations"]["drains_paused"]
        )
    refused = alerts[0]["annotations"]["summary"]
    assert refused.endswith("scontrol update NodeName=gpu-node-07 State=DRAIN Reason=...")


def test_a_logged_value_cannot_forge_a_line_in_a_services_log() -> None:
    """The services' logging (fleetwatch.runtime.setup_logging), in a process of its own: a value
    holding a line break and a forged line after it is one line, its unsafe characters escaped and
    readable; a traceback stays as Python writes it."""
    script = (
        "import logging\n"
        "from fleetwatch.runtime import setup_logging\n"
        "setup_logging()\n"
        "log = logging.getLogger('alerts.slurm_drainer')\n"
        f"log.warning('not resume gpu-node-07 (request ab): drained by someone else: %s', {REASON!r})\n"
        f"reason = {REASON!r}\n"
        "log.warning(f'an f-string: {reason}')\n"
        "log.info('tab\\tkept, %d ok', 3)\n"
        "try:\n    raise ValueError('x')\nexcept ValueError:\n    log.exception('with its traceback')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert [line.split(" ", 3)[2] for line in lines[:4]] == ["WARNING", "WARNING", "INFO", "ERROR"], lines
    for line in lines[:2]:
        assert "\\n2025-06-01 12:00:00,000 INFO" in line and "\\x1b[2K" in line
        assert not any(unicodedata.category(c)[0] == "C" for c in line)
    assert lines[2].endswith("tab\tkept, 3 ok")
    assert lines[4] == "Traceback (most recent call last):" and lines[-1] == "ValueError: x"


def test_services_logging_leaves_a_processs_own_handlers_as_they_are() -> None:
    """setup_logging called where the process has handlers already (a CLI run inside pytest, whose
    handlers its later tests share) filters none of them."""
    from fleetwatch.runtime import OneLineRecords, setup_logging

    root = logging.getLogger()
    mine = logging.StreamHandler(io.StringIO())
    root.addHandler(mine)
    try:
        setup_logging()
        assert not any(isinstance(f, OneLineRecords) for h in root.handlers for f in h.filters)
    finally:
        root.removeHandler(mine)
