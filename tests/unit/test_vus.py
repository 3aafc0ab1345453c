"""benchmarks/vus.py against TSB-AD's own VUS-PR (values it computed, tests/fixtures/vus_pr/), and
the properties the definition implies."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.vus import period, ranges, vus_pr

CASES = json.loads((Path(__file__).parents[1] / "fixtures" / "vus_pr" / "tsb_ad_cases.json").read_text())[
    "cases"
]


@pytest.mark.parametrize("case", CASES, ids=[f"n{c['n']}-w{c['window']}" for c in CASES])
def test_agrees_with_tsb_ad(case: dict) -> None:
    got = vus_pr(np.array(case["labels"]), np.array(case["score"]), case["window"])
    assert got == pytest.approx(case["tsb_ad_vus_pr"], abs=1e-9)


def test_the_cases_cover_ties_edges_and_a_zero_window() -> None:
    assert any(c["labels"][0] == 1 for c in CASES) and any(c["labels"][-1] == 1 for c in CASES)
    assert any(len(set(c["score"])) < c["n"] for c in CASES)
    assert len({c["window"] for c in CASES}) > 5


def test_a_perfect_score_beats_a_random_one_and_reaches_one_without_buffer() -> None:
    rng = np.random.default_rng(0)
    y = np.zeros(1000, dtype=int)
    y[100:120] = y[500:505] = 1
    assert vus_pr(y, y + 0.0, 0) == pytest.approx(1.0)
    random = vus_pr(y, rng.random(1000), 20)
    assert vus_pr(y, y + 0.01 * rng.random(1000), 20) > 0.8 > 0.2 > random


def test_no_label_no_figure_and_bad_input_refused() -> None:
    assert np.isnan(vus_pr(np.zeros(10), np.arange(10.0), 3))
    with pytest.raises(ValueError):
        vus_pr(np.zeros(10), np.arange(9.0), 3)
    with pytest.raises(ValueError):
        vus_pr(np.ones(3), np.array([1.0, np.nan, 0.0]), 3)


def test_ranges_and_period() -> None:
    assert ranges(np.array([1, 1, 0, 1, 0, 0, 1])).tolist() == [[0, 1], [3, 3], [6, 6]]
    t = np.arange(5000)
    assert period(np.sin(2 * np.pi * t / 48)) == 48
    assert period(np.zeros(100)) == 125  # no autocorrelation to read: TSB-AD's default
