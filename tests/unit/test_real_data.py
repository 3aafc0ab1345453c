"""The pipeline's statistical detector on real labelled server telemetry (ASD and SMD,
../shared/data), through the benchmarks' own code (benchmarks/anomaly_eval.py).

The first two machines of each set (not picked by result) are streamed train -> test online and
flagged at the fixed calibrated threshold 0.999 (chosen without the labels). The floors are
relative to flagging at random at the same rate, computed here, plus the calibration's own
promise (about 0.1 % of normal points); the measured figures are in benchmarks/README.md.
"""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from benchmarks.anomaly_eval import Dataset, delays, event_prf, load, online_p, point_prf, segments, top_k
from benchmarks.asd_eval import ASD
from benchmarks.smd_eval import SMD
from tests.helpers.paths import ASD_DIR, SMD_DIR

THRESHOLD = 0.999
CASES = ((ASD, ASD_DIR, ("1", "2")), (SMD, SMD_DIR, ("1-2", "1-3")))


def test_event_metrics_by_hand() -> None:
    y = np.array([0, 1, 1, 0, 0, 1, 1, 1, 0, 0], dtype=np.int64)
    flag = np.array([0, 0, 1, 0, 1, 0, 0, 0, 0, 1], dtype=bool)
    assert segments(y == 1) == [(1, 3), (5, 8)]
    p, r, f, detected, false = event_prf(y, flag)
    assert (detected, false) == (1, 2)  # event 1 hit; flags at 4 and 9 are two false events
    assert p == pytest.approx(1 / 3) and r == pytest.approx(1 / 2) and f == pytest.approx(0.4)
    assert point_prf(y, flag) == pytest.approx((1 / 3, 1 / 5, 0.25))
    assert delays(y, flag) == [1]  # event 1 flagged one sample after its start; event 2 never


def test_equal_budget_flags_exactly_that_many() -> None:
    s = np.array([0.5, np.nan, 3.0, 3.0, 1.0])
    assert top_k(s, 2).tolist() == [False, False, True, True, False]
    assert top_k(s, 0).sum() == 0 and top_k(s, 5).sum() == 5


def test_a_missing_or_malformed_file_fails_loudly(tmp_path) -> None:
    ds = Dataset("X", "m-", tmp_path, "1", 0.01, 60.0)
    with pytest.raises(FileNotFoundError, match=r"m-1_train\.csv"):
        load(ds, tmp_path, "1")
    (tmp_path / "m-1_train.csv").write_text("a,b\n1,2\n3,4\n")
    with gzip.open(tmp_path / "m-1_test.csv.gz", "wt") as f:
        f.write("a,b,label\n1,2,0\n3,4,2\n")
    with pytest.raises(ValueError, match="labels must be 0 or 1"):
        load(ds, tmp_path, "1")


def random_baseline(y: np.ndarray, rate: float, draws: int = 200) -> tuple[float, float]:
    """Mean event precision and recall of flagging each point with probability `rate`."""
    rng = np.random.default_rng(0)
    ps, rs = [], []
    for _ in range(draws):
        p, r, *_ = event_prf(y, rng.random(len(y)) < rate)
        ps.append(p)
        rs.append(r)
    return float(np.mean(ps)), float(np.mean(rs))


@pytest.mark.parametrize(("ds", "data", "machines"), CASES, ids=[c[0].name for c in CASES])
def test_the_pipelines_detector_finds_real_events_at_its_calibrated_rate(ds: Dataset, data, machines) -> None:
    detected = false = events = normal_flags = normals = 0
    rand_p, rand_r = [], []
    for m in machines:
        train, test, y = load(ds, data, m)  # raises FileNotFoundError if absent: no skip
        _, p = online_p(train, test, ds.resolution, ds.params)
        assert not np.isnan(p).any()  # warmed up on train: every test point is scored
        assert ((p >= 0) & (p <= 1)).all()
        flag = p <= 1 - THRESHOLD
        _, _, _, det, fal = event_prf(y, flag)
        detected, false, events = detected + det, false + fal, events + len(segments(y == 1))
        normal_flags, normals = normal_flags + int(flag[y == 0].sum()), normals + int((y == 0).sum())
        rp, rr = random_baseline(y, max(float(flag.mean()), 1e-4))
        rand_p.append(rp)
        rand_r.append(rr)
    ev_p, ev_r = detected / max(detected + false, 1), detected / events
    summary = f"{detected}/{events} events, {false} false, normal points flagged {normal_flags}/{normals}"
    assert normal_flags / normals <= 0.002, summary  # calibrated: ~0.1 % at most, not a flood
    assert ev_r >= 0.1 and ev_r >= 3 * np.mean(rand_r), summary
    assert ev_p >= 0.3 and ev_p >= 3 * np.mean(rand_p), summary


@pytest.mark.parametrize(
    ("module", "data", "machine"),
    [("asd_eval", ASD_DIR, "3"), ("smd_eval", SMD_DIR, "1-5")],
    ids=["ASD", "SMD"],
)
def test_the_benchmark_commands_print_the_promised_json(module: str, data, machine: str) -> None:
    """`python -m benchmarks.asd_eval|smd_eval --data DIR --machines LIST --json`: `rows` and `mean`,
    each row with the fields the issue names, the pipeline's rows marked, every baseline at a
    fixed threshold and at the pipeline's alarm budget."""
    import json
    import subprocess
    import sys

    from tests.helpers.paths import REPO

    done = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", "--data", str(data), "--machines", machine, "--json"],
        capture_output=True, text=True, timeout=240, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert set(doc) >= {"rows", "mean"}
    need = {"machine", "detector", "threshold", "ev_f1", "ev_p", "ev_r", "pipeline", "budget", "vus_pr",
            "normal_flagged", "delay_median", "false_events", "detected", "events"}  # fmt: skip
    assert all(need <= set(r) for r in doc["rows"] + doc["mean"])
    pipeline = [r for r in doc["rows"] if r["pipeline"]]
    assert {r["threshold"] for r in pipeline} == {"0.999", "0.99"} and {r["detector"] for r in pipeline} == {
        "multivariate"
    }
    flagged = round(
        next(r["flagged"] for r in pipeline if r["threshold"] == "0.999") * len_test(data, machine)
    )
    baselines = {r["detector"] for r in doc["rows"] if not r["pipeline"]}
    assert baselines == {
        "robust-z(train)",
        "robust-z(trailing)",
        "tippett(train)",
        "pca(train)",
        "half-space-trees",
    }
    for det in baselines:
        equal = [r for r in doc["rows"] if r["detector"] == det and r["budget"] == "equal"]
        assert len(equal) == 1 and round(equal[0]["flagged"] * len_test(data, machine)) == flagged
        assert [r["budget"] for r in doc["rows"] if r["detector"] == det].count("fixed") == 1


def len_test(data, machine: str) -> int:
    ds = ASD if data == ASD_DIR else SMD
    return len(load(ds, data, machine)[2])
