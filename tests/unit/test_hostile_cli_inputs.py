"""Hostile files and arguments given to the commands that read them without a broker (`xids`,
`score`, `config --check`, `eval --scenario`, `report --db`): each gets one clear line and status 2,
or its right answer, never a traceback, a hang or a write to a file that is not ours. Found by an
adversarial probe of these commands; each case here failed before its fix."""

from __future__ import annotations

import csv
import io
import sqlite3
import time
from pathlib import Path

import pytest

from fleetwatch.cli import main

Capture = pytest.CaptureFixture[str]


def run(capsys: Capture, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse's own refusals
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_kernel_log_flags_out_of_range_are_argument_errors(capsys: Capture, tmp_path: Path) -> None:
    log = tmp_path / "k.log"
    log.write_text("Mar  5 10:11:12 host kernel: NVRM: Xid (PCI:0000:9b:00): 79, pid=1, name=x, fell\n")
    for argv, said in (
        (("--year", "0"), "must be a year"),  # every syslog line was silently "no kernel log line"
        (("--year", "9" * 20), "must be a year"),  # an OverflowError traceback
        (("--gpus", "\u00b2=0000:9b:00.0"), "INDEX"),  # "²".isdigit(): blamed on the address
        (("--gpus", f"{'9' * 30}=0000:9b:00.0"), "INDEX"),  # an index past 64 bits
    ):
        code, _out, err = run(capsys, "xids", str(log), *argv)
        assert code == 2 and said in err and "Traceback" not in err, (argv, err)
    code, _out, err = run(capsys, "xids", str(tmp_path))  # a directory
    assert code == 2 and "cannot read" in err


def test_nan_and_ports_out_of_range_are_refused_on_the_command_line_and_in_the_file(
    capsys: Capture, tmp_path: Path
) -> None:
    code, _out, err = run(capsys, "detect", "--max-clock-ahead", "nan", "--help")
    assert code == 2 and "must be >= 0" in err  # a NaN limit: one clock check refused all, one none
    code, _out, err = run(capsys, "detect", "--metrics-port", "99999", "--help")
    assert code == 2 and "TCP port" in err
    for body in ("[detect]\nmax_clock_ahead = nan\n", "[detect]\nmetrics_port = 70000\n"):
        conf = tmp_path / "c.toml"
        conf.write_text(body)
        code, out, err = run(capsys, "config", "--check", str(conf))
        assert code == 2 and "config error" in err and "ok" not in out, (body, out, err)


def test_a_config_nested_hundreds_deep_is_a_config_error(capsys: Capture, tmp_path: Path) -> None:
    conf = tmp_path / "deep.toml"
    conf.write_text("[act]\ncluster = " + "[" * 500 + "]" * 500 + "\n")
    code, _out, err = run(capsys, "config", "--check", str(conf))
    assert code == 2 and "nested too deeply" in err and "Traceback" not in err


def test_scenario_bombs_are_refused_at_once(capsys: Capture, tmp_path: Path) -> None:
    # nine references a level, nine levels: 387 million strings if rendered out
    levels = ["&a [" + ", ".join(['"lol"'] * 9) + "]"]
    for name, below in zip("bcdefghi", "abcdefgh", strict=True):
        levels.append(f"&{name} [" + ", ".join([f"*{below}"] * 9) + "]")
    bomb = tmp_path / "bomb.yaml"
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 5000 + "]" * 5000)
    for field in ("description", "name", "seed"):
        bomb.write_text(f"{field}: [{', '.join(levels)}]\n")  # the field's value holds every level
        t0 = time.monotonic()
        code, _out, err = run(capsys, "eval", "--scenario", str(bomb))
        assert code == 2 and f"{field} must be" in err, err
        assert time.monotonic() - t0 < 30, "the structure was rendered out"
    code, _out, err = run(capsys, "eval", "--scenario", str(deep))
    assert code == 2 and "nested too deeply" in err
    code, _out, err = run(capsys, "eval", "--scenario", str(tmp_path))
    assert code == 2 and "not a regular file" in err


def test_report_writes_nothing_into_a_file_that_is_not_a_store(capsys: Capture, tmp_path: Path) -> None:
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE t (x)")
    later = tmp_path / "later.sqlite"  # a meta table as ours, of another version (or program)
    with sqlite3.connect(later) as db:
        db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
        db.execute("INSERT INTO meta VALUES ('schema_version', '7')")
    before = {p: p.read_bytes() for p in (other, later)}
    for path, said in (
        (empty, "not an accounting store"),
        (other, "not an accounting store"),
        (later, "schema 7"),
    ):
        code, _out, err = run(capsys, "report", "--db", str(path))
        assert code == 2 and said in err, err
    assert empty.read_bytes() == b"" and all(p.read_bytes() == b for p, b in before.items())
    assert not (tmp_path / "later.sqlite-wal").exists()  # not switched to WAL either


def test_score_refuses_an_oversized_field_and_quotes_what_it_echoes(capsys: Capture, tmp_path: Path) -> None:
    big = tmp_path / "big.csv"
    big.write_text("timestamp,value\n1," + "1" * 200_000 + "\n")
    code, _out, err = run(capsys, "score", "--csv", str(big))
    assert code == 2 and "field larger than field limit" in err
    quoted = tmp_path / "q.csv"
    quoted.write_text('timestamp,value\n"2024-01-01, 10:00",1\n"a\nb",2\n')
    code, out, _err = run(capsys, "score", "--csv", str(quoted))
    rows = list(csv.reader(io.StringIO(out)))
    assert code == 0 and [r[:2] for r in rows] == [
        ["timestamp", "value"],
        ["2024-01-01, 10:00", "1"],
        ["a\nb", "2"],
    ]


def test_a_simulated_run_past_a_year_is_refused(capsys: Capture) -> None:
    code, _out, err = run(capsys, "eval", "--duration", "1e308")  # ran until killed
    assert code == 2 and "duration_s must be <=" in err


def test_score_takes_no_digit_grouping_and_names_the_column_a_short_row_lacks(
    capsys: Capture, tmp_path: Path
) -> None:
    grouped = tmp_path / "g.csv"
    grouped.write_text("timestamp,value\n1,1_0\n")  # float() reads 10
    code, _out, err = run(capsys, "score", "--csv", str(grouped))
    assert code == 2 and "not numeric: '1_0'" in err
    short = tmp_path / "s.csv"
    short.write_text("value,ts\n1\n")
    code, _out, err = run(capsys, "score", "--csv", str(short), "--timestamp", "ts")
    assert code == 2 and "column 'ts' is field 2" in err


def test_a_byte_order_mark_is_no_part_of_the_first_kernel_log_line(capsys: Capture, tmp_path: Path) -> None:
    log = tmp_path / "bom.log"
    log.write_bytes(b"\xef\xbb\xbf[ 1843.308145] NVRM: Xid (PCI:0000:9b:00): 79, pid=1, name=x, fell\n")
    code, out, _err = run(capsys, "xids", str(log))
    assert code == 0 and '"since_boot_s":1843.308145' in out, out


def test_numbers_are_plain_and_a_yaml_boolean_key_is_an_unknown_field(
    capsys: Capture, tmp_path: Path
) -> None:
    for value in ("9_108", "\u0669\u0661\u0660\u0668"):  # int() reads digit grouping and Arabic-Indic digits
        code, _out, err = run(capsys, "detect", "--metrics-port", value, "--help")
        assert code == 2 and "not a plain number" in err, (value, err)
    scenario = tmp_path / "yes.yaml"
    scenario.write_text("yes: 1\n")  # YAML 1.1: the key is True (sorting it beside strings raised TypeError)
    code, _out, err = run(capsys, "eval", "--scenario", str(scenario))
    assert code == 2 and "unknown field(s) ['True']" in err, err
