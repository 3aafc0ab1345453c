"""The node checks judged (detectors/node_checks.py): each check fires with its kind, severity and
the names on-call needs, stays silent on what is ordinary (a GPU's idle link, a few processes in D
state for a moment), waits its sustained time, and gives the same findings whatever the batching
and across a snapshot.

Mounts come from the agent's own host source on a fake /proc holding real mountinfo lines (as in
tests/unit/test_collector_host_checks.py); every sample goes through the worker's decoder as bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from fleetwatch import schemas
from fleetwatch.alerts.policy import drain_reason
from fleetwatch.collectors.host import HostSource
from fleetwatch.detectors.node_checks import NodeChecks, NodeChecksConfig
from fleetwatch.pipeline.telemetry_decode import decode_telemetry
from tests.fakes import write_tree
from tests.helpers.admission import observe, restored_index
from tests.helpers.batches import gpu_entry, ib_port, telemetry

NODE = "gpu-node-11"
T0 = 1_760_000_000.0
ROOT = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard"
EXT4_REMOUNTED_RO = "776 625 259:3 / {path} rw,relatime - ext4 /dev/nvme2n1 ro,data=ordered"
LUSTRE = (
    "312 29 0:61 / {path} rw,relatime shared:170 - lustre 172.20.230.12@o2ib:172.20.230.13@o2ib:/cstor2/lncc "
    "rw,checksum,flock,nouser_xattr,lruresize,lazystatfs,nouser_fid2path,verbose,noencrypt"
)
HOST = {"cpu_util": 20.0, "mem_used_frac": 0.4, "load1": 3.0, "disk_used_frac": 0.5, "procs_d_state": 0}
H100 = {"pcie_link_gen": 5, "pcie_link_gen_max": 5, "pcie_link_width": 16, "pcie_link_width_max": 16}
CX7 = dict(H100)  # ConnectX-7: PCIe Gen5 x16 too


def sample(
    ts: float, *, host: dict[str, Any] | None = None, gpus: Any = None, ib: Any = None, **extra: Any
) -> bytes:
    gpus = gpus if gpus is not None else [gpu_entry(i, **H100) for i in range(8)]
    ib = ib if ib is not None else [ib_port(f"mlx5_{d}", 1, **CX7) for d in range(8)]
    m = telemetry(NODE, ts, gpus, seq=int(ts - T0), ib=ib, host={**HOST, **(host or {})})
    m.update(extra)
    return orjson.dumps(schemas.validate(m, schemas.TELEMETRY))


def detect(samples: list[bytes], det: NodeChecks | None = None, batch: int = 1) -> list[dict[str, Any]]:
    det = det or NodeChecks()
    out: list[dict[str, Any]] = []
    for i in range(0, len(samples), batch):
        decoded, bad = decode_telemetry(samples[i : i + batch], now=T0 + 10**6, clock=None)
        assert bad == []
        out += observe(det, det.index, decoded)
    for f in out:
        schemas.validate(f, schemas.FINDING)
    return out


def opened(findings: list[dict[str, Any]], kind: str, rule: str) -> list[dict[str, Any]]:
    return [f for f in findings if (f["kind"], f["evidence"]["rule"]) == (kind, rule) and not f["resolved"]]


def rules(findings: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(f["kind"], f["evidence"]["rule"], f["severity"]) for f in findings if not f["resolved"]}


# ---------------------------------------------------------------- mounts and block devices


def test_mounts_the_agent_finds_missing_or_read_only_are_critical_and_named(tmp_path: Path) -> None:
    scratch, ckpt = tmp_path / "scratch", tmp_path / "checkpoints"
    scratch.mkdir()
    ckpt.mkdir()
    proc = write_tree(
        tmp_path / "proc",
        {
            "self/mountinfo": "\n".join(
                [ROOT, LUSTRE.format(path=scratch), EXT4_REMOUNTED_RO.format(path=ckpt)]
            )
        },
    )
    src = HostSource(
        proc_root=str(proc), disk_path=str(tmp_path), mounts=[str(scratch), str(ckpt), "/lustre"]
    )
    part = src.sample()
    host = {**part["host"], "disk_used_frac": 0.5}
    findings = detect([sample(T0, host=host, checks=part["checks"])])
    missing = opened(findings, "mount", "mount_missing")
    assert len(missing) == 1 and missing[0]["severity"] == "critical"
    assert "/lustre" in missing[0]["summary"] and missing[0]["evidence"]["mounts"] == [
        {"path": "/lustre", "problem": "missing"}
    ]
    ro = opened(findings, "mount", "mount_readonly")
    assert (
        ro
        and str(ckpt) in ro[0]["summary"]
        and drain_reason(ro[0]) == "required mount failed (mount_readonly)"
    )
    assert not opened(findings, "mount", "mount_hung")


def test_a_hung_mount_and_a_read_only_disk_are_critical_and_resolve_when_they_answer() -> None:
    hung = {"mounts_hung": 1, "mounts_missing": 0}
    checks = {"mounts": [{"path": "/lustre", "problem": "hung", "fstype": "lustre", "took_s": 12.5}],
              "blockdevs": [{"name": "nvme0n1", "problem": "readonly"}]}  # fmt: skip
    bad = [sample(T0 + k, host={**hung, "blockdevs_readonly": 1}, checks=checks) for k in range(3)]
    good = [sample(T0 + k, host={"mounts_hung": 0, "blockdevs_readonly": 0}) for k in range(3, 400)]
    findings = detect(bad + good, batch=50)
    assert ("mount", "mount_hung", "critical") in rules(findings)
    assert ("block_device", "blockdev_readonly", "critical") in rules(findings)
    [hung_f] = opened(findings, "mount", "mount_hung")
    assert hung_f["evidence"]["mounts"][0]["took_s"] == 12.5 and "/lustre" in hung_f["summary"]
    resolved = {(f["kind"], f["evidence"]["rule"]) for f in findings if f["resolved"]}
    assert {("mount", "mount_hung"), ("block_device", "blockdev_readonly")} <= resolved


def test_a_disk_filling_warns_then_is_critical_and_inodes_count_as_space() -> None:
    findings = detect(
        [sample(T0, host={"disk_used_frac": 0.9}), sample(T0 + 1, host={"disk_used_frac": 0.96}),
         sample(T0 + 2, host={"disk_used_frac": 0.995}), sample(T0 + 3, host={"inodes_used_frac": 0.97})]
    )  # fmt: skip
    severities = [f["severity"] for f in findings if f["evidence"]["rule"] == "disk_full"]
    assert severities == ["warning", "critical"]
    assert drain_reason(opened(findings, "disk", "disk_full")[-1]) == "root filesystem full (disk_full)"
    assert ("disk", "inodes_full", "warning") in rules(findings)


# ---------------------------------------------------------------- sustained: D state, PCIe links


def test_d_state_processes_are_hung_tasks_only_when_they_stay() -> None:
    cfg = NodeChecksConfig(sustained_s=60.0)
    blip = [sample(T0 + k, host={"procs_d_state": 9 if k < 50 else 0}) for k in range(120)]
    assert detect(blip, NodeChecks(cfg), batch=7) == []
    few = [sample(T0 + k, host={"procs_d_state": 4}) for k in range(120)]
    assert detect(few, NodeChecks(cfg), batch=7) == []
    stuck = [sample(T0 + k, host={"procs_d_state": 12}) for k in range(120)]
    findings = detect(stuck, NodeChecks(cfg), batch=7)
    [f] = opened(findings, "hung_tasks", "d_state")
    assert f["ts"] - T0 == 60 and f["severity"] == "warning" and drain_reason(f) is None


def test_a_busy_gpus_narrow_link_is_critical_and_an_idle_ones_slow_link_is_ordinary() -> None:
    cfg = NodeChecksConfig(sustained_s=30.0)
    idle = [gpu_entry(i, util=0.0, **{**H100, "pcie_link_gen": 1}) for i in range(8)]
    assert detect([sample(T0 + k, gpus=idle) for k in range(60)], NodeChecks(cfg), batch=9) == []
    narrow = [gpu_entry(i, **{**H100, "pcie_link_width": 8 if i == 3 else 16}) for i in range(8)]
    findings = detect([sample(T0 + k, gpus=narrow) for k in range(60)], NodeChecks(cfg), batch=9)
    [f] = opened(findings, "pcie_link", "gpu_link_width")
    assert f["severity"] == "critical" and f["evidence"]["links"] == {"GPU3": "x8 of x16"}
    assert f["ts"] - T0 == 30 and drain_reason(f) == "PCIe link downtrained (gpu_link_width)"
    slow = [gpu_entry(i, **{**H100, "pcie_link_gen": 4 if i == 6 else 5}) for i in range(8)]
    f = opened(
        detect([sample(T0 + k, gpus=slow) for k in range(60)], NodeChecks(cfg)), "pcie_link", "gpu_link_gen"
    )
    assert f[0]["severity"] == "warning" and f[0]["evidence"]["links"] == {"GPU6": "Gen4 of Gen5"}


def test_an_hcas_narrow_link_is_critical_after_its_sustained_time() -> None:
    cfg = NodeChecksConfig(sustained_s=30.0)
    ports = [ib_port(f"mlx5_{d}", 1, **{**CX7, "pcie_link_width": 8 if d == 2 else 16}) for d in range(8)]
    findings = detect([sample(T0 + k, ib=ports) for k in range(40)], NodeChecks(cfg), batch=4)
    [f] = opened(findings, "pcie_link", "hca_link_width")
    assert f["evidence"]["links"] == {"mlx5_2": "x8 of x16"} and f["ts"] - T0 == 30


# ---------------------------------------------------------------- device counts


def test_an_hca_the_node_used_to_list_is_missing_and_a_configured_count_judges_gpus() -> None:
    eight = [ib_port(f"mlx5_{d}", 1, **CX7) for d in range(8)]
    findings = detect([sample(T0, ib=eight), sample(T0 + 1, ib=eight[:7])])
    [f] = opened(findings, "device_count", "hca_count")
    assert (f["evidence"]["hcas"], f["evidence"]["expected"], f["severity"]) == (7, 8, "critical")
    seven_gpus = [gpu_entry(i, **H100) for i in range(8) if i != 5]
    assert detect([sample(T0, gpus=seven_gpus)]) == []  # not configured: the lost-GPU rule's job
    f = opened(detect([sample(T0, gpus=seven_gpus)], NodeChecks(NodeChecksConfig(expected_gpus=8))),
               "device_count", "gpu_count")  # fmt: skip
    assert f[0]["evidence"]["missing"] == [5] and drain_reason(f[0]) == "device missing (gpu_count)"
    # a sample that lists no port or no GPU is a collector that failed, not missing hardware
    assert detect([sample(T0, ib=eight), sample(T0 + 1, ib=[])]) == []


def test_the_most_hcas_is_known_sample_by_sample_whatever_the_batching() -> None:
    """A card that comes back later does not make the earlier samples short of it."""
    seven = [ib_port(f"mlx5_{d}", 1, **CX7) for d in range(7)]
    eight = [*seven, ib_port("mlx5_7", 1, **CX7)]
    stream = [sample(T0, ib=seven), sample(T0 + 1, ib=eight), sample(T0 + 2, ib=seven)]
    for batch in (1, 3):
        [f] = opened(detect(stream, batch=batch), "device_count", "hca_count")
        assert f["ts"] == T0 + 2


# ---------------------------------------------------------------- batching, snapshots, hostile values


@pytest.mark.parametrize("batch", [1, 7, 1000])
def test_same_findings_whatever_the_batching_and_across_a_snapshot(batch: int) -> None:
    cfg = NodeChecksConfig(sustained_s=20.0)
    narrow = [gpu_entry(i, **{**H100, "pcie_link_width": 4 if i == 1 else 16}) for i in range(8)]
    stream = [
        sample(T0 + k, host={"procs_d_state": 7 if 10 <= k < 80 else 0}, gpus=narrow if k >= 30 else None)
        for k in range(400)
    ]
    whole = detect(stream, NodeChecks(cfg), batch=1000)
    assert {"hung_tasks", "pcie_link"} <= {f["kind"] for f in whole}
    assert detect(stream, NodeChecks(cfg), batch=batch) == whole
    det = NodeChecks(cfg)
    first = detect(stream[:40], det, batch=batch)
    again = NodeChecks.from_state(orjson.loads(orjson.dumps(det.to_state())), cfg, restored_index(det.index))
    assert first + detect(stream[40:], again, batch=batch) == whole


def test_absent_fields_and_extreme_values_neither_crash_nor_fool_it() -> None:
    bare = [{"index": i} for i in range(8)]  # lost GPUs: no metric at all
    extreme = {"procs_d_state": 2**64 - 1, "mounts_hung": 2**64 - 1, "disk_used_frac": 1.0}
    findings = detect([sample(T0, gpus=bare, ib=[ib_port("mlx5_0", 1)]), sample(T0 + 1, host=extreme)])
    assert {f["kind"] for f in findings} == {"mount", "disk"}
    [hung] = opened(findings, "mount", "mount_hung")
    assert hung["evidence"]["count"] == 2**53 and "mounts" not in hung["evidence"]  # float64's exact range
