"""Honest evaluation of the online statistical detector on the real ASD data (benchmarks/anomaly_eval.py).

ASD (../shared/data/README.md): machines omi-N, 19 metrics at 5-minute intervals, min-max scaled to
two decimals (resolution 0.01), `omi-N_train.csv` and `omi-N_test.csv` (with `label`).

    python -m benchmarks.asd_eval [--data DIR] [--machines 1,2,...] [--json]
"""

from __future__ import annotations

import sys
from pathlib import Path

from benchmarks.anomaly_eval import Dataset, main

ASD = Dataset(
    name="ASD",
    prefix="omi-",
    default_dir=Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "asd",
    default_machines="1,2,3,4,5,6",
    resolution=0.01,
    interval_s=300.0,
)

if __name__ == "__main__":
    sys.exit(main(ASD, doc=__doc__ or ""))
