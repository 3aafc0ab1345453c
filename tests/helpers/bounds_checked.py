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
# of one core; scripts/test.sh runs these tests, marker `bounds_checked`, niced beside the
# integration tier rather than in the unit tier's time).
CACHE_DIR = Path(os.environ.get("FLEETWATCH_HOME", REPO / ".fleetwatch")) / "numba-boundscheck"


def run_bounds_checked(
    script: str, timeout_s: float, cache_dir: Path = CACHE_DIR
) -> subprocess.CompletedProcess[str]:
    """`script` in a fresh interpreter whose kernels compile with bounds checks (NUMBA_BOUNDSCHECK),
    into a cache of their own (`cache_dir`)."""
    env = dict(os.environ, NUMBA_BOUNDSCHECK="1", NUMBA_CACHE_DIR=str(cache_dir))
    code = [sys.executable, "-c", script]
    return subprocess.run(code, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
