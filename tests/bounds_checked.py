"""Running a script under numba's bounds checking, for the compiled kernels' out-of-range tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_bounds_checked(script: str, cache_dir: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """`script` in a fresh interpreter whose kernels compile with bounds checks (NUMBA_BOUNDSCHECK),
    into a cache of their own (`cache_dir`: the checks are compiled in, so the project's cached
    builds must not serve them)."""
    env = dict(os.environ, NUMBA_BOUNDSCHECK="1", NUMBA_CACHE_DIR=str(cache_dir))
    code = [sys.executable, "-c", script]
    return subprocess.run(code, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
