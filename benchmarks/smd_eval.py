"""Honest evaluation of the online statistical detector on the real SMD data (benchmarks/anomaly_eval.py).

SMD (../shared/data/README.md): machines machine-1-N, 38 metrics at 1-minute intervals, min-max
scaled, `machine-1-N_train.csv[.gz]` and `machine-1-N_test.csv[.gz]` (with `label`). The values
are published to 0.01 or finer; 0.01 is taken as the least scale that matters, as for ASD.

    python -m benchmarks.smd_eval [--data DIR] [--machines 1-2,1-3,...] [--json]
"""

from __future__ import annotations

import sys
from pathlib import Path

from benchmarks.anomaly_eval import Dataset, main

SMD = Dataset(
    name="SMD",
    prefix="machine-",
    default_dir=Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "smd",
    default_machines="1-2,1-3,1-4,1-5,1-6,1-7,1-8",
    resolution=0.01,
    interval_s=60.0,
)

if __name__ == "__main__":
    sys.exit(main(SMD, doc=__doc__ or ""))
