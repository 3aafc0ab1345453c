"""The slurm-jobs publisher's host-list expansion checked against the real Slurm's own
`scontrol show hostnames` (services/slurm/slurm.sh); the parsing and ledger without services are
in tests/unit/test_slurm_jobs_parse.py."""

from __future__ import annotations

import subprocess

import pytest

from fleetwatch.collectors.slurm_jobs.model import expand_nodes
from tests.integration.services import USES_SLURM, Slurm

pytestmark = USES_SLURM


@pytest.mark.parametrize(
    "text",
    ["gpu-node-[01-04,07]", "login1,gpu-node-[1-3]", "r[1-2]n[01-02]", "gpu-node-[001-010]", "a-[08-11]"],
)
def test_host_lists_expand_as_slurm_expands_them(text: str, slurm: Slurm) -> None:
    slurms = subprocess.run(
        ["scontrol", "show", "hostnames", text], env=slurm.env, capture_output=True, text=True, check=True
    )
    assert list(expand_nodes(text, text)) == slurms.stdout.split()
