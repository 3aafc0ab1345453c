"""Compares benchmarks/vus.py with TSB-AD's own VUS-PR on random labelled scores, and writes the
cases with TSB-AD's values for tests/unit/test_vus.py (tests/fixtures/vus_pr/README.md).

Runs only where TSB-AD is installed (a scratch environment: `pip install --no-deps TSB-AD==1.5`):

    python benchmarks/vus_check_tsb_ad.py SEED [OUT.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a file from the scratch env

from benchmarks.vus import vus_pr


def cases(seed: int, count: int = 10) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """Random labels (ranges at both ends in some), scores with ties in half, windows 0..59."""
    rng = np.random.default_rng(seed)
    out = []
    for c in range(count):
        n = int(rng.integers(100, 700))
        y = np.zeros(n, dtype=int)
        for _ in range(int(rng.integers(1, 8))):
            a = int(rng.integers(0, n - 5))
            y[a : a + int(rng.integers(1, 60))] = 1
        if c % 3 == 0:
            y[:3] = 1
        if c % 4 == 0:
            y[-2:] = 1
        score = rng.normal(size=n) + 2.0 * y * rng.random()
        score = np.round(score, 1 if c % 2 else 4)
        out.append((y, score, int(rng.integers(0, 60))))
    return out


def main(argv: list[str]) -> int:
    from TSB_AD.evaluation.basic_metrics import generate_curve

    seed = int(argv[0]) if argv else 7
    rows = []
    for y, score, w in cases(seed):
        ref = float(generate_curve(y, score, w, "opt", 250)[-1])
        ours = vus_pr(y, score, w)
        print(f"n={len(y)} window={w} tsb-ad={ref:.10f} ours={ours:.10f} agree={abs(ref - ours) < 1e-9}")
        rows.append(
            {"n": len(y), "window": w, "labels": y.tolist(), "score": score.tolist(), "tsb_ad_vus_pr": ref}
        )
    if len(argv) > 1:
        source = (
            "TSB-AD 1.5 (PyPI, --no-deps): "
            "TSB_AD.evaluation.basic_metrics.generate_curve(labels, score, window, 'opt', 250)[-1]"
        )
        Path(argv[1]).write_text(json.dumps({"source": source, "cases": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
