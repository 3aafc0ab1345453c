"""NVIDIA's Xid Catalog in the code: the generated table is what the checked-in data gives, and a
handful of codes carry the buckets NVIDIA publishes (detectors/data/README.md, "Pinned values")."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fleetwatch.detectors import xid_catalog
from fleetwatch.detectors.xid_nvidia import NVIDIA_XIDS
from tests.helpers.paths import REPO


def test_the_generated_table_is_what_the_data_gives() -> None:
    r = subprocess.run(
        [sys.executable, "scripts/gen_xid_catalog.py", "--check"], cwd=REPO, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(
    ("code", "mnemonic", "bucket"),
    [
        (13, "ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY", "RESTART_APP"),
        (31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "RESTART_APP"),
        (48, "ROBUST_CHANNEL_GPU_ECC_DBE", "WORKFLOW_XID_48"),
        (63, "INFOROM_DRAM_RETIREMENT_EVENT", "IGNORE"),
        (74, "NVLINK_ERROR", "WORKFLOW_NVLINK_ERR"),
        (79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM"),
        (95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "RESET_GPU"),
        (154, "GPU_RECOVERY_ACTION_CHANGED", "XID_154"),
    ],
)
def test_codes_carry_nvidias_published_bucket(code: int, mnemonic: str, bucket: str) -> None:
    assert NVIDIA_XIDS[code][0] == mnemonic and NVIDIA_XIDS[code][2] == bucket
    info = xid_catalog.lookup(code)
    assert (info.bucket, info.mnemonic) == (bucket, mnemonic)


def test_every_bucket_has_a_policy_and_the_policy_never_drains_for_the_application() -> None:
    buckets = {b for _m, _d, b, _i in NVIDIA_XIDS.values()}
    assert buckets - {""} <= set(xid_catalog.BUCKET_POLICY), buckets - set(xid_catalog.BUCKET_POLICY)
    for bucket in ("RESTART_APP", "IGNORE", "WORKFLOW_XID_45", "XID_154"):
        assert xid_catalog.BUCKET_POLICY[bucket][2] in ("none", "restart_app")
    for info in xid_catalog.CATALOG.values():
        assert info.action in xid_catalog.ACTION_TEXT and info.name and info.description


def test_nvidias_multi_event_workflows_judge_a_code_by_the_rest_of_its_burst() -> None:
    """The Resolution Buckets sheet: XID 48 alone asks for a GPU reset, with 63 or 64 for a drain and
    reset; XID 45 alone is a Fabric Manager restart to look at, beside other codes it defers to them."""
    dbe, cleanup = xid_catalog.lookup(48), xid_catalog.lookup(45)
    solo = xid_catalog.in_workflow(dbe, frozenset({48}))
    assert (solo.severity, solo.action) == ("critical", "reset_gpu")
    for remap in (63, 64):
        both = xid_catalog.in_workflow(dbe, frozenset({48, remap, 13}))
        assert (both.severity, both.action) == ("critical", "drain_node")
    alone = xid_catalog.in_workflow(cleanup, frozenset({45}))
    assert (alone.severity, alone.action) == ("warning", "investigate") and "Fabric Manager" in alone.name
    assert xid_catalog.in_workflow(cleanup, frozenset({45, 13})) == cleanup  # info: 13 decides
    other = xid_catalog.lookup(79)
    assert xid_catalog.in_workflow(other, frozenset({79, 48})) is other
