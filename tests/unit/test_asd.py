"""The online detector on real labelled server telemetry (ASD, ../shared/data/asd).

Machines omi-1 and omi-2 (the first two, not picked by result) are streamed train -> test online
and flagged at the fixed calibrated threshold 0.999 (chosen without the labels). The floors are
relative to a random-flagging baseline at the same flag rate, computed here, plus modest
absolute floors that the measured figures (benchmarks/README.md) clear by about 2x.
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.asd_eval import event_prf, load_machine, online_scores, point_prf, segments
from tests.helpers.paths import ASD_DIR

MACHINES = (1, 2)
THRESHOLD = 0.999


def test_asd_data_is_present() -> None:
    for m in MACHINES:
        for split in ("train", "test"):
            path = ASD_DIR / f"omi-{m}_{split}.csv"
            assert path.is_file(), f"ASD data missing: {path} (see ../shared/data/README.md)"


def test_event_metrics_by_hand() -> None:
    y = np.array([0, 1, 1, 0, 0, 1, 1, 1, 0, 0], dtype=np.int64)
    flag = np.array([0, 0, 1, 0, 1, 0, 0, 0, 0, 1], dtype=bool)
    assert segments(y == 1) == [(1, 3), (5, 8)]
    p, r, f, detected, false = event_prf(y, flag)
    assert (detected, false) == (1, 2)  # event 1 hit; flags at 4 and 9 are two false events
    assert p == pytest.approx(1 / 3) and r == pytest.approx(1 / 2) and f == pytest.approx(0.4)
    assert point_prf(y, flag) == pytest.approx((1 / 3, 1 / 5, 0.25))


def random_baseline(y: np.ndarray, rate: float, draws: int = 200) -> tuple[float, float, float]:
    """Mean event precision/recall and point precision of flagging each point with prob `rate`."""
    rng = np.random.default_rng(0)
    ev_p, ev_r, pt_p = [], [], []
    for _ in range(draws):
        flag = rng.random(len(y)) < rate
        p, r, *_ = event_prf(y, flag)
        ev_p.append(p)
        ev_r.append(r)
        pt_p.append(point_prf(y, flag)[0])
    return float(np.mean(ev_p)), float(np.mean(ev_r)), float(np.mean(pt_p))


def test_online_detector_beats_random_flagging_on_asd() -> None:
    ys, flags = [], []
    for m in MACHINES:
        train, test, y = load_machine(ASD_DIR, m)  # raises FileNotFoundError if absent: no skip
        _, s_test = online_scores(train, test, methods=("fisher",))["fisher"]
        assert np.isnan(s_test).sum() == 0  # warmed up on train: every test point is scored
        assert ((s_test >= 0) & (s_test <= 1)).all()
        ys.append(y)
        flags.append(s_test >= THRESHOLD)
    y, flag = np.concatenate(ys), np.concatenate(flags)
    # per machine counts (concatenating could merge segments across the boundary)
    counts = [event_prf(a, b) for a, b in zip(ys, flags, strict=True)]
    n_events = sum(len(segments(a == 1)) for a in ys)
    detected = sum(c[3] for c in counts)
    false = sum(c[4] for c in counts)
    ev_p = detected / (detected + false) if detected + false else 0.0
    ev_r = detected / n_events
    pt_p = point_prf(y, flag)[0]

    rand_p, rand_r, rand_pt = random_baseline(y, rate=max(float(flag.mean()), 1e-4))
    summary = (
        f"events {detected}/{n_events} detected, {false} false; "
        f"evP {ev_p:.3f} evR {ev_r:.3f} ptP {pt_p:.3f}; "
        f"random at the same rate: evP {rand_p:.3f} evR {rand_r:.3f} ptP {rand_pt:.3f}"
    )
    assert flag.mean() < 0.01, summary  # calibrated: 0.999 flags ~0.1 %, not a flood
    assert ev_r >= 0.08 and ev_r >= 2 * rand_r, summary
    assert ev_p >= 0.3 and ev_p >= 3 * rand_p, summary
    assert pt_p >= 5 * y.mean(), summary  # flagged points are anomalous far above the base rate
