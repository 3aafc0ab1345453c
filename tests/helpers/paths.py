"""Where things are, for tests at any depth under tests/."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"  # data files: captured H200 output, Slurm answers
ASD_DIR = REPO.parent / "shared" / "data" / "asd"
SMD_DIR = REPO.parent / "shared" / "data" / "smd"
