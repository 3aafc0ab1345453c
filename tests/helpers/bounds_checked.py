"""Running a script under numba's bounds checking, for the compiled kernels' out-of-range tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.paths import REPO

# The bounds-checked builds' own numba cache (the checks are compiled in, so the project's cached
# builds must not serve them, nor these serve the project). It is kept between runs, under the
# git-ignored .fleetwatch/: numba recompiles a kernel file whose source changed, and otherwise
# loads it, so only the first run after a change pays the compile (telemetry_scan's: about 110 s
# on a 2-core machine, which alone would spend the unit tier's 2 minutes).
CACHE_DIR = Path(os.environ.get("FLEETWATCH_HOME", REPO / ".fleetwatch")) / "numba-boundscheck"


def run_bounds_checked(
    script: str, timeout_s: float, cache_dir: Path = CACHE_DIR
) -> subprocess.CompletedProcess[str]:
    """`script` in a fresh interpreter whose kernels compile with bounds checks (NUMBA_BOUNDSCHECK),
    into a cache of their own (`cache_dir`)."""
    env = dict(os.environ, NUMBA_BOUNDSCHECK="1", NUMBA_CACHE_DIR=str(cache_dir))
    code = [sys.executable, "-c", script]
    return subprocess.run(code, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)


def warm(timeout_s: float = 600) -> None:
    """Compile the bounds-checked scanner (and the multivariate pass) into their cache before the
    unit tier (scripts/test.sh): a
    build step, as the project's own kernels are compiled at install, so that a fresh clone's unit
    tier does not spend two minutes of its time compiling."""
    script = (
        "from fleetwatch import telemetry_scan; telemetry_scan.warm_up()\n"
        "import numpy as np\n"
        "from fleetwatch.detectors.multivariate import MultivariateScorer\n"
        "sc = MultivariateScorer(2); sc.update(sc.add_groups(np.zeros(1, dtype=np.int64)), np.ones((1, 2)))\n"
    )
    done = run_bounds_checked(script, timeout_s)
    if done.returncode != 0:
        raise SystemExit(f"compiling the bounds-checked kernels failed:\n{done.stderr}")
