"""Text that others control costs each parser linear time (a ReDoS audit by a helper measured
every pattern on adversarial strings of growing length; these are the ones that grew faster, each
now bounded or rewritten). Each case runs beside the test with a generous limit. The comment, the
duration and the open events are sized so that the old code takes minutes (1 MiB: ~15 and ~44
min; 16,000 open events: ~36 s) and the new milliseconds; a kernel line is at most MAX_LINE long,
so its repeated phrases cost the old patterns ~7 ms a line, and that case checks the results."""

from __future__ import annotations

import multiprocessing
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from fleetwatch.alerts.drain_pause import parse_duration
from fleetwatch.alerts.slurm import SlurmClient, SlurmError
from fleetwatch.alerts.slurm_drainer import with_token
from fleetwatch.collectors.kernel_log.events import MAX_OPEN
from fleetwatch.collectors.kernel_log.lines import MAX_LINE
from fleetwatch.collectors.slurm_jobs.model import SlurmParseError, expand_nodes
from tests.helpers.kernel_lines import parse_all


def within(limit_s: float, fn: Callable[[], Any]) -> Any:
    """fn's result (or its exception), failing if it has not come within limit_s. fn runs in a
    forked child, killed at the limit: a regular expression holds the interpreter's lock for the
    whole of one match, so a thread could not be abandoned, and the test would wait it out."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)

    def child() -> None:
        try:
            send.send((True, fn()))
        except BaseException as e:
            send.send((False, e))

    proc = ctx.Process(target=child, daemon=True)
    proc.start()
    try:
        assert receive.poll(limit_s), f"took over {limit_s} s"
        ok, value = receive.recv()
    finally:
        proc.kill()
        proc.join(5)
    if not ok:
        raise value
    return value


def test_an_operators_comment_with_a_long_run_of_spaces() -> None:
    # 64 KiB took 3.6 s in the old token pattern, growing as the square; 1 MiB takes ~14 ms now
    comment = "ops note" + " " * 2**20 + "! [fw:" + "a" * 32 + "]"
    out = within(10, lambda: with_token(comment, "b" * 32))
    assert out == "ops note" + " " * 2**20 + "! [fw:" + "b" * 32 + "]"
    assert with_token("  [fw:" + "a" * 32 + "] swap  ", "c" * 32) == "swap [fw:" + "c" * 32 + "]"


def test_a_pause_duration_with_a_long_run_of_spaces() -> None:
    with pytest.raises(ValueError, match="not a duration"):
        within(10, lambda: parse_duration("1" + " " * 2**20 + "x"))  # 16 KiB took 0.65 s, squared
    assert parse_duration("  2h ") == 7200 and parse_duration("1.5 m") == 90 and parse_duration("30") == 30


def test_an_aer_detail_line_of_spaces() -> None:
    # the name's pattern backtracked in cubic time: 4,000 spaces took 55 s, the 8,000 here (within
    # the reader's MAX_LINE) minutes, stalling the node's kernel source on one line
    header = "[ 1.0] pcieport 0000:00:01.0: AER: Uncorrected (Non-Fatal) error received: 0000:9b:00.0"
    detail = "[ 1.0] nvidia 0000:9b:00.0:    [ 1] a" + " " * (MAX_LINE - 100) + "b"
    events = within(10, lambda: parse_all([header, detail, "[ 1.0] next"]))
    (aer,) = [e for e in events if e.kind == "aer"]
    assert aer.extra["errors"] == [("a" + " " * MAX_LINE)[:48]]


def test_kernel_lines_repeating_a_phrase_of_a_multi_line_event() -> None:
    header = "pcieport 0000:00:01.0: AER: Uncorrected (Non-Fatal) error received: 0000:9b:00.0"
    phrase = "PCIe Bus Error: severity="
    bus = "nvidia 0000:9b:00.0: " + phrase * ((MAX_LINE - 100) // len(phrase))
    recovery = "GPU recovery action changed from 0x1 ("
    xid = "NVRM: Xid (PCI:0000:9b:00): 154, " + recovery * ((MAX_LINE - 100) // len(recovery))
    lines = [header, bus, xid] * 200  # each line was milliseconds (quadratic in its length)
    events = within(30, lambda: parse_all(lines))
    assert (
        len([e for e in events if e.kind == "aer"]) == 200
        and len([e for e in events if e.kind == "xid"]) == 200
    )


def test_thousands_of_open_multi_line_events_are_not_rescanned_by_every_line() -> None:
    # AER headers naming distinct ports, then as many detail lines: each line looked at every open
    # event (4,000: 2 s, growing as the square); at most MAX_OPEN stay open, none is lost
    n = 16_000
    headers = [
        f"[1.0] pcieport 0000:{i // 256:02x}:{i % 256 // 8:02x}.{i % 8}: AER: Corrected error received: "
        f"0000:{i // 256:02x}:{i % 256 // 8:02x}.{i % 8}"
        for i in range(n)
    ]
    details = ["[1.0] nvidia 0000:ff:1f.7: [ 0] RxErr" for _ in range(n)]  # all in one fold window
    events = within(10, lambda: parse_all(headers + details))
    assert len([e for e in events if e.kind == "aer"]) == n and n > MAX_OPEN


def test_host_lists_nested_a_thousand_groups_deep_are_refused() -> None:
    # python-hostlist recurses once per bracket group: RecursionError, not its BadHostlist
    with pytest.raises(SlurmParseError):
        expand_nodes("a[1]" * 1000, "raw")
    client = object.__new__(SlurmClient)
    reservation = "ReservationName=m1 Nodes=" + "a[1]" * 1000 + " State=ACTIVE Flags=MAINT"

    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 0, reservation + "\n", "")

    client._run = run  # type: ignore[method-assign]  # scontrol's answer, without a cluster
    with pytest.raises(SlurmError, match="node list not understood"):
        client.maintenance_nodes()
