"""What a real node shows beyond NVML, end to end (issue 25) on the real broker and Alertmanager:

1. Real NVIDIA driver lines (tests/fixtures/kernel_log) read by the agent's kernel source, and the
   host fields of a hung required mount, in telemetry/1 samples through the broker into a detect
   worker: the XID both NVML and the kernel log report is one XID, the fatal SXid a critical
   nvswitch finding, the hung mount a critical mount finding naming the mount.
2. Findings of the new kinds into `fleetwatch act` as a process: each alerted under its own
   alertname in Alertmanager; the critical nvswitch and mount findings drain their nodes, the
   hung-tasks and kernel-log warnings do not."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleetwatch import schemas, topics
from fleetwatch.collectors.kernel_log.source import KernelLogSource
from tests.helpers.fake_kmsg import RingKmsg
from tests.helpers.findings import finding
from tests.helpers.messages import gpu, sample
from tests.integration.act_rig import ActRig
from tests.integration.services import TopicTail
from tests.integration.workers import Detect, produce

XID_119 = "NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for RPC"
SXID_FATAL = [  # one event in three lines (nvswitch_sxid.txt)
    "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 62 LTSSM Fault Up",
    "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Severity 1 Engine instance 62 Sub-engine instance 00",
    "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Data {0x10000000, 0x10000000, 0x00000000}",
]
HUNG = {
    "mounts_missing": 0,
    "mounts_readonly": 0,
    "mounts_unwritable": 0,
    "mounts_failed": 0,
    "mounts_hung": 1,
}


def test_kernel_log_lines_and_a_hung_mount_through_the_broker_into_detect(
    kafka_bootstrap: str, detect: tuple[Detect, str], tmp_path: Path
) -> None:
    d, prefix = detect
    node, mounted = f"{prefix}k0", f"{prefix}m0"
    boot = tmp_path / "boot_id"
    boot.write_text("0cec5dfe-715f-4b50-8a6a-7591dd3ffb2e\n")
    ring = RingKmsg()
    source = KernelLogSource(device=ring.open, boot_id=boot, gpus=lambda: {"0000:9b:00.0": 3})
    now = time.time() - 30

    def kernel(*lines: str) -> dict[str, Any]:
        for line in lines:
            ring.log(line)
        part = source.sample()
        part.pop("_cursor", None)
        return part

    records = [
        (node, sample(node, now, 1, [gpu(3)], **kernel())),
        (node, sample(node, now + 1, 2, [gpu(3, xids=[119])], **kernel(XID_119))),  # both sources
        (node, sample(node, now + 2, 3, [gpu(3)], **kernel(*SXID_FATAL))),
    ]
    checks = {"mounts": [{"path": "/lustre", "problem": "hung", "fstype": "lustre", "took_s": 11.0}]}
    records += [
        (mounted, sample(mounted, now + k, k + 1, [gpu(0)], host=HUNG, checks=checks)) for k in range(3)
    ]
    tail = TopicTail(kafka_bootstrap, topics.FINDINGS)
    produce(kafka_bootstrap, topics.TELEMETRY, records)

    def mine(recs: list[Any]) -> list[dict[str, Any]]:
        return [schemas.decode(r.value) for r in recs if r.key in (node.encode(), mounted.encode())]

    def complete(fs: list[dict[str, Any]]) -> bool:
        return {"xid", "nvswitch", "mount"} <= {f["kind"] for f in fs}

    got = mine(tail.collect(lambda rs: complete(mine(rs)), 60))
    tail.close()
    assert d.thread.is_alive(), "the worker died"
    xid = [f for f in got if f["kind"] == "xid"]
    assert len({f["id"] for f in xid}) == 1 and xid[-1]["gpu"] == 3
    assert xid[-1]["evidence"]["total"] == 1 and xid[-1]["evidence"]["first_seen_by"] == {"nvml": 1}
    [sx] = [f for f in got if f["kind"] == "nvswitch"]
    assert sx["severity"] == "critical" and sx["evidence"]["code"] == 20034 and sx["node"] == node
    [mnt] = [f for f in got if f["kind"] == "mount"]
    assert mnt["severity"] == "critical" and mnt["node"] == mounted and "/lustre" in mnt["summary"]


def test_new_kinds_are_alerted_by_name_and_only_the_critical_ones_drain(
    rig: ActRig, topic_tail: Callable[[str], TopicTail]
) -> None:
    tag = uuid.uuid4().hex[:6]
    nodes = [f"e2e-{tag}-{i}" for i in range(4)]
    rig.census(*nodes)
    drains = topic_tail(rig.drains)
    now = time.time()
    rig.send(
        finding(
            nodes[0], "nvswitch", "critical", "sxid", ts=now - 60, gpu=None, code=20034, action="drain_node"
        ),
        finding(nodes[1], "mount", "critical", "mount_hung", ts=now - 50, gpu=None, count=1),
        finding(nodes[2], "hung_tasks", "warning", "d_state", ts=now - 40, gpu=None, procs_d_state=12),
        finding(nodes[3], "kernel_log", "warning", "records_missed", ts=now - 30, gpu=None, missed=5000),
    )
    rig.act("--budget-min-nodes", "4")
    want = {
        (nodes[0], "FleetwatchNvswitch"),
        (nodes[1], "FleetwatchMount"),
        (nodes[2], "FleetwatchHungTasks"),
        (nodes[3], "FleetwatchKernelLog"),
    }

    def pairs(alerts: list[dict[str, Any]]) -> set[tuple[str, str]]:
        return {(a["labels"].get("node", ""), a["labels"]["alertname"]) for a in alerts}

    alerts = rig.am.wait_for(lambda a: want <= pairs(a), timeout_s=60, cluster=rig.cluster)
    assert want <= pairs(alerts), (pairs(alerts), rig.logs())
    got = drains.collect(lambda rs: len(rs) >= 2, timeout_s=60)
    assert {r.key.decode() for r in got} == {nodes[0], nodes[1]}, rig.logs()
    assert drains.collect(lambda rs: False, timeout_s=3) == []  # the warnings drain nothing
    reasons = {m["node"]: m["reason"] for m in drains.messages(got)}
    assert reasons[nodes[0]] == "fleetwatch: NVSwitch SXid 20034", reasons
    assert reasons[nodes[1]] == "fleetwatch: required mount failed (mount_hung)", reasons
