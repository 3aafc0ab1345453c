"""`fleetwatch report` (pipeline/reliability/cli.py, render.py): the JSON the contract names, the
Markdown and HTML files, and clear refusals."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from fleetwatch.cli import main
from fleetwatch.pipeline.reliability.args import span_s, when
from fleetwatch.pipeline.reliability.ingest import Ingest
from fleetwatch.pipeline.reliability.store import Store
from tests.helpers.paths import REPO
from tests.helpers.reliability import T0, finding, job


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "acc.sqlite"
    store = Store(path)
    ing = Ingest(store)
    with store.transaction() as d:
        for i in range(60):
            nodes = [f"n{(i + k) % 40}" for k in range(i % 3 * 16 + 1)]
            start = T0 + i * 3600
            ing.job(d, job(f"j{i}", nodes, "started", start, start_ts=start), None)
            end_state = "NODE_FAIL" if i % 7 == 0 else "FAILED" if i % 5 == 0 else "COMPLETED"
            state = "finished" if end_state == "COMPLETED" else "failed"
            if i % 5 == 0:
                ing.finding(
                    d,
                    finding(nodes[0], "xid", start + 28000, evidence={"cause": "hardware", "worst_xid": 79}),
                    None,
                )
            ing.job(d, job(f"j{i}", nodes, state, start + 28800, end_state=end_state, start_ts=start), None)
    store.close()
    return path


def run(capsys, *argv):
    code = main(["report", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_has_every_figure_the_contract_names(db, capsys):
    code, out, _ = run(
        capsys, "--db", str(db), "--since", str(T0 - 3600), "--until", str(T0 + 10 * 86400), "--json"
    )
    assert code == 0
    r = json.loads(out)
    assert set(r["r_f_per_1000_node_days"]) >= {"total", "by_component", "ci_low", "ci_high"}
    row = r["mttf_by_gpus"][0]
    assert set(row) >= {"gpus", "jobs", "failures", "mttf_h", "ci_low_h", "ci_high_h", "projected_mttf_h"}
    assert set(r["ettr"]) >= {"jobs", "expected"}
    assert {"lemons", "lost_gpu_hours_by_cause", "data_quality"} <= set(r)
    assert r["taxonomy"]["runs"] == 60
    assert r["taxonomy"]["infra_failures_by_component"]["pcie"] >= 1


def test_out_writes_markdown_html_and_the_plots(db, capsys, tmp_path):
    out_dir = tmp_path / "rep"
    code, out, _ = run(
        capsys,
        "--db",
        str(db),
        "--since",
        str(T0 - 3600),
        "--until",
        str(T0 + 10 * 86400),
        "--out",
        str(out_dir),
    )
    assert code == 0 and "report.html" in out
    md = (out_dir / "report.md").read_text()
    for title in (
        "Failure rate r_f",
        "Job MTTF by size",
        "ETTR",
        "GPU-hours lost",
        "Lemon nodes",
        "Data quality",
    ):
        assert f"## {title}" in md
    for name in ("mttf", "failures", "ettr", "lost", "lemons"):
        assert (out_dir / f"{name}.svg").read_bytes().startswith(b"<?xml")
        assert f"({name}.svg)" in md
    page = (out_dir / "report.html").read_text()
    assert page.count("src='data:image/svg+xml;base64,") == 5
    assert "<script" not in page and "http://" not in page.replace("http://www.w3.org", "")


def test_a_missing_store_or_an_empty_range_is_refused_clearly(tmp_path, capsys, db):
    code, _, err = run(capsys, "--db", str(tmp_path / "none.sqlite"))
    assert code == 2 and "no accounting store" in err
    code, _, err = run(capsys, "--db", str(db), "--since", "2026-02-01", "--until", "2026-01-01")
    assert code == 2 and "--since must be before --until" in err
    with pytest.raises(SystemExit):
        main(["report", "--since", "yesterday-ish"])


def test_times_and_spans():
    now = 1_800_000_000.0
    assert when("now", now) == now
    assert when("7d", now) == now - 7 * 86400
    assert when("2026-01-01", now) == 1767225600.0
    assert when("2026-01-01T01:00:00+01:00", now) == 1767225600.0
    assert when("1767225600", now) == 1767225600.0
    assert span_s("90s") == 90 and span_s("4w") == 28 * 86400
    # a span past a century (999...9d was infinite: the window failed as a NaN) is no span
    for text in ("9" * 40 + "d", "5300w"):
        with pytest.raises(argparse.ArgumentTypeError):
            span_s(text)


def _report_on_a_terminal(db, tmp_path, *argv: str) -> tuple[bytes, bytes]:
    """`fleetwatch report` with its stderr on a pseudo-terminal, as an SRE runs it: (what the
    terminal showed, stdout)."""
    main_fd, term_fd = os.openpty()
    out_path = tmp_path / "stdout"
    try:
        # stdout to a file, not a pipe: the terminal is read to its end first, and a full pipe
        # would stop the report before it closed the terminal
        with out_path.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "fleetwatch.cli", "report", "--db", str(db), *argv],
                stdout=out,
                stderr=term_fd,
                cwd=REPO,
                env={**os.environ, "TERM": "xterm", "COLUMNS": "100"},
            )
        os.close(term_fd)
        shown = b""
        while True:
            try:
                chunk = os.read(main_fd, 65536)
            except OSError:  # EIO: the process closed its end
                break
            if not chunk:
                break
            shown += chunk
        assert proc.wait(60) == 0, shown[-2000:]
    finally:
        os.close(main_fd)
    return shown, out_path.read_bytes()


def test_a_long_range_shows_a_progress_bar_on_the_terminal_and_nothing_in_the_output(db, tmp_path):
    out_dir = tmp_path / "rep"
    span = ("--since", str(T0 - 3600), "--until", str(T0 + 10 * 86400))
    shown, stdout = _report_on_a_terminal(db, tmp_path, *span, "--out", str(out_dir))
    # the steps' names went to the terminal (stderr), not into what the command prints
    assert b"writing the report" in shown, shown[-2000:]
    assert b"writing the report" not in stdout and b"report.html" in stdout
    # a short range, or --json (its stdout is for a program): no bar
    shown, _ = _report_on_a_terminal(db, tmp_path, "--since", str(T0), "--until", str(T0 + 86400))
    assert b"attributing" not in shown
    shown, stdout = _report_on_a_terminal(db, tmp_path, *span, "--json")
    assert b"attributing" not in shown and json.loads(stdout)["taxonomy"]["runs"] == 60


def test_the_attribution_window_is_the_operators_to_set(tmp_path, capsys):
    # a job failed 20 minutes after its node's critical ECC finding was resolved, another 6
    # minutes before its node's finding opened: outside the default window (10 min before the end
    # to 5 after), inside a wider one
    path = tmp_path / "acc.sqlite"
    store = Store(path)
    ing = Ingest(store)
    with store.transaction() as d:
        for name, node in (("early", "n1"), ("late", "n2")):
            ing.job(d, job(name, [node], "started", T0, start_ts=T0), None)
            ing.job(d, job(name, [node], "failed", T0 + 3600, end_state="FAILED", start_ts=T0), None)
        ing.finding(d, finding("n1", "ecc", T0 + 1800), None)
        ing.finding(d, finding("n1", "ecc", T0 + 2400, first_seen=T0 + 1800, resolved=True), None)
        ing.finding(d, finding("n2", "ecc", T0 + 3600 + 360), None)
    store.close()
    span = ("--db", str(path), "--since", str(T0 - 60), "--until", str(T0 + 86400), "--json")

    def categories(*window: str) -> dict[str, int]:
        code, out, _ = run(capsys, *span, *window)
        assert code == 0
        return json.loads(out)["taxonomy"]["by_category"]

    assert categories() == {"user": 2}
    assert categories("--window-before", "1800") == {"hardware": 1, "user": 1}
    assert categories("--window-before", "1800", "--window-after", "600") == {"hardware": 2}
