"""What the offline commands do when their input fails part way (a failing disk, a network file
system gone: EIO) or their reader stops reading (`| head`): a one-line error and status 2 with the
output until then standing, and a quiet status 141, never a traceback."""

from __future__ import annotations

import errno
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetwatch import cli
from tests.helpers.paths import REPO


class FailingText:
    """A text file whose read fails (EIO) after its first lines."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def __iter__(self) -> Iterator[str]:
        yield from self.lines
        raise OSError(errno.EIO, "Input/output error")

    def close(self) -> None:
        pass


def test_score_reports_a_read_error_part_way_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = ["timestamp,value\n", *(f"{i},{i % 7}\n" for i in range(5))]
    monkeypatch.setattr("fleetwatch.text_input.open_text", lambda *_a, **_k: FailingText(rows))
    assert cli.main(["score", "--csv", "data.csv", "--column", "value"]) == 2
    out, err = capsys.readouterr()
    assert err.strip().splitlines() == ["fleetwatch score: cannot read data.csv: Input/output error"]
    # the stream until the error: every row read before it, scored (warming up: no score yet)
    assert out.splitlines() == ["timestamp,value,anomaly_score", *(f"{i},{i % 7}," for i in range(5))]


@pytest.mark.parametrize(
    ("bad", "needle"),
    [("abc", "row 5: column 'value' is not numeric"), ("9" * 200_000, "not a readable CSV")],
)
def test_score_writes_every_row_before_the_first_it_cannot_take(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str, needle: str
) -> None:
    """The rows before a bad one are scored and written, however far into a chunk of rows it is: the
    output is a stream and the rows before the error stand (contract); the status says the rest
    does not."""
    data = tmp_path / "data.csv"
    data.write_bytes(
        ("timestamp,value\n" + "".join(f"{i},{i % 7}\n" for i in range(5)) + f"5,{bad}\n6,1\n").encode()
    )
    assert cli.main(["score", "--csv", str(data), "--column", "value"]) == 2
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and needle in err, err
    assert out.splitlines() == ["timestamp,value,anomaly_score", *(f"{i},{i % 7}," for i in range(5))]


def test_xids_reports_a_read_error_part_way_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = ["[ 12.5] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"]
    monkeypatch.setattr("fleetwatch.text_input.open_text", lambda *_a, **_k: FailingText(lines))
    assert cli.main(["xids", "-"]) == 2
    _out, err = capsys.readouterr()
    assert err.strip().splitlines() == ["fleetwatch xids: cannot read stdin: Input/output error"]


def test_output_cut_off_by_its_reader_ends_quietly(tmp_path: Path) -> None:
    """`fleetwatch score ... | head -1`: the reader closes the pipe after a line while the command
    still writes (more than a pipe's 64 KiB buffer)."""
    data = tmp_path / "s.csv"
    data.write_text("timestamp,value\n" + "".join(f"{i},{(i * 37) % 101}\n" for i in range(20_000)))
    argv = [sys.executable, "-m", "fleetwatch.cli", "score", "--csv", str(data), "--column", "value"]
    p = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    assert p.stdout.readline() == b"timestamp,value,anomaly_score\n"
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(60) == 141, err
    assert "Traceback" not in err and "Broken pipe" not in err, err
