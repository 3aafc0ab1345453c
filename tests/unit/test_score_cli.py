"""`fleetwatch score`: the real CLI in a subprocess on small generated CSVs."""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

N_ROWS = 3000
SPIKE_ROW = 2800
# ~650 values of history: a tail capped at 1 / (history + 1) could say at most 0.9985; the tail
# is extrapolated once the calibration holds ~500 values (10 beyond its top 2 %)
EARLY_SPIKE_ROW = 700


def score(args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetwatch.cli", "score", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def series_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(11)
    v = 50.0 + rng.standard_normal(N_ROWS)
    v[SPIKE_ROW] += 10.0
    v[EARLY_SPIKE_ROW] += 25.0
    path = tmp_path_factory.mktemp("score") / "series.csv"
    lines = ["timestamp,host,value"]
    for i, x in enumerate(v):
        cell = "" if i == 1500 else f"{x:.5f}"  # one missing value
        lines.append(f"{1_700_000_000 + 60 * i},gpu-node-01,{cell}")
    path.write_text("\n".join(lines) + "\n")
    return path


def parse(stdout: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(stdout)))


def test_scores_every_row_in_order(series_csv: Path) -> None:
    r = score(["--csv", str(series_csv), "--column", "value"])
    assert r.returncode == 0, r.stderr
    rows = parse(r.stdout)
    assert r.stdout.splitlines()[0] == "timestamp,value,anomaly_score"
    assert len(rows) == N_ROWS
    assert rows[0]["timestamp"] == "1700000000" and rows[-1]["timestamp"] == str(
        1_700_000_000 + 60 * (N_ROWS - 1)
    )
    scores = [float(x["anomaly_score"]) if x["anomaly_score"] else None for x in rows]
    assert all(s is None for s in scores[:20])  # warm-up
    assert rows[1500]["value"] == "" and scores[1500] is None  # missing value: empty score
    present = np.array([s for s in scores if s is not None])
    assert ((present >= 0) & (present <= 1)).all()
    assert scores[SPIKE_ROW] is not None and scores[SPIKE_ROW] >= 0.999
    assert scores[EARLY_SPIKE_ROW] is not None and scores[EARLY_SPIKE_ROW] >= 0.999
    # healthy points: the calibrated meaning, roughly (<= ~1 % above 0.99)
    healthy = np.array([s for i, s in enumerate(scores) if s is not None and i > 1000 and i != SPIKE_ROW])
    assert np.mean(healthy >= 0.999) < 0.005
    assert np.mean(healthy >= 0.99) < 0.03
    assert "rows/s" in r.stderr


def test_stdin_and_row_number_timestamps(series_csv: Path) -> None:
    text = "value\n" + "\n".join(line.split(",")[2] for line in series_csv.read_text().splitlines()[1:])
    r = score(["--csv", "-", "--column", "value"], stdin=text + "\n")
    assert r.returncode == 0, r.stderr
    rows = parse(r.stdout)
    assert [x["timestamp"] for x in rows[:3]] == ["0", "1", "2"] and len(rows) == N_ROWS
    assert float(rows[SPIKE_ROW]["anomaly_score"]) >= 0.999


@pytest.mark.parametrize(
    ("content", "column", "needle"),
    [
        ("timestamp,value\n1,2.0\n", "power", "column 'power' not in CSV header"),
        ("timestamp,value\n1,2.0\n2,abc\n", "value", "row 1: column 'value' is not numeric"),
        ("", "value", "empty input"),
        ("timestamp,value\n1,inf\n", "value", "not finite"),
        # finite, but its square is not: the covariance's inverse raised out of the compiled pass
        (
            "value\n" + "".join(f"{(-1) ** i * 1e300}\n" for i in range(100)),
            "value",
            "row 0: column 'value' is beyond ±1e+150",
        ),
    ],
)
def test_errors_are_one_line_exit_2(tmp_path: Path, content: str, column: str, needle: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(content)
    r = score(["--csv", str(path), "--column", column])
    assert r.returncode == 2
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and needle in err[0], r.stderr


def test_missing_file_exit_2(tmp_path: Path) -> None:
    r = score(["--csv", str(tmp_path / "nope.csv")])
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "no such file" in r.stderr


def test_the_cli_scores_as_the_pipelines_scorer_one_value_at_a_time(series_csv: Path) -> None:
    from fleetwatch.detectors.multivariate import MultivariateScorer

    r = score(["--csv", str(series_csv), "--column", "value"])
    assert r.returncode == 0, r.stderr
    cli = [float(x["anomaly_score"]) if x["anomaly_score"] else np.nan for x in parse(r.stdout)]
    values = [float(x["value"]) if x["value"] else np.nan for x in parse(r.stdout)]
    sc = MultivariateScorer(1)
    rows = sc.add_groups(np.zeros(1, dtype=np.int64))
    one_by_one = [sc.update(rows, np.array([[v]])).score[0] for v in values]
    np.testing.assert_allclose(cli, one_by_one, atol=1e-6, equal_nan=True)  # the CSV's 6 decimals
