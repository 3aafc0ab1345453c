"""Message builders shared by the tests of both tiers: a full telemetry/1 sample and one good
message of each schema, hypothesis-mutated telemetry, the Python validator's verdict, and the
small raw samples the hostile-input tests send."""

from __future__ import annotations

import copy
from typing import Any

import orjson
from hypothesis import strategies as st

from fleetwatch import schemas
from fleetwatch.schemas import MessageError
from tests.helpers.batches import ib_port


def telemetry(**over: Any) -> dict[str, Any]:
    m: dict[str, Any] = {
        "schema": "telemetry/1",
        "node": "gpu-node-0001",
        "ts": 1_764_000_000.5,
        "seq": 7,
        "gpus": [
            {
                "index": i,
                "uuid": f"GPU-{i}",
                "util": 97.0,
                "temp_c": 61.0,
                "power_w": 650.5,
                "ecc_sbe_volatile": 0,
                "throttle_reasons": 0,
                "xids": [],
            }
            for i in range(8)
        ],
        "host": {
            "cpu_util": 35.0,
            "mem_used_frac": 0.4,
            "load1": 12.5,
            "disk_used_frac": 0.3,
            "procs_d_state": 0,
        },
        "net": {
            "ib": [ib_port(tx_bytes=10, rx_bytes=20)],
            "eth": [{"iface": "eth0", "rx_bytes": 1, "tx_bytes": 2}],
        },
        "agent": {"version": "0.3.0", "instance": "3f2a9c0d11e84b7a"},  # who numbered seq
    }
    m.update(over)
    return m


# a kernel section as the agent's kernel source writes it (collectors/kernel_log/source.py)
KERNEL_SECTION: dict[str, Any] = {
    "boot": "3c1f7b5e-0d7a-4c55-9a43-5f7a8e1c2b90",
    "events": [
        {
            "kind": "xid",
            "code": 149,
            "pci": "0000:9b:00.0",
            "gpu": 3,
            "severity": "fatal",
            "text": "NVRM: Xid (PCI:0000:9b:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 14 (0x0215c5c6)",
            "since_boot_s": 171168.4,
            "seq": 3968,
            "count": 2,
            "unit": "NETIR_LINK_EVT",
            "link": 14,
        },
        {"kind": "aer", "pci": "0000:03:04.0", "port": "0000:00:1b.2", "count": 1, "errors": ["RxErr"]},
    ],
    "records": 12,
    "unknown": 1,
}

# the host counts and the `checks` section of a node whose configured mounts and block devices
# fail, as the host source sends them (collectors/mounts.py, collectors/blockdevs.py)
NODE_CHECK_COUNTS: dict[str, Any] = {
    "mounts_missing": 1,
    "mounts_readonly": 0,
    "mounts_unwritable": 1,
    "mounts_failed": 0,
    "mounts_hung": 1,
    "mounts_slowest_s": 0.02,
    "blockdevs_missing": 1,
    "blockdevs_readonly": 0,
    "inodes_used_frac": 0.41,
}
CHECKS: dict[str, Any] = {
    "mounts": [
        {"path": "/lustre", "problem": "hung", "fstype": "lustre", "took_s": 31.5},
        {"path": "/home", "problem": "unwritable", "fstype": "nfs4", "error": "EACCES"},
        {"path": "/data sets/ü", "problem": "missing"},
    ],
    "blockdevs": [{"name": "nvme1n1", "problem": "missing"}, {"name": "sda", "problem": "readonly"}],
}

GOOD = {
    "telemetry/1": telemetry(),
    "job/1": {
        "schema": "job/1",
        "job": "job-17",
        "nodes": ["gpu-node-0001", "gpu-node-0002"],
        "state": "running",
        "ts": 1.0e9,
    },
    "step/1": {
        "schema": "step/1",
        "job": "job-17",
        "node": "gpu-node-0001",
        "rank": 3,
        "step": 100,
        "step_time_s": 1.25,
        "wait_time_s": 0.05,
        "ts": 1.0e9,
    },
    "truth/1": {
        "schema": "truth/1",
        "node": "gpu-node-0001",
        "gpu": 2,
        "fault": "xid79",
        "onset_ts": 1.0e9,
        "end_ts": None,
    },
    "nodefeatures/1": {
        "schema": "nodefeatures/1",
        "node": "gpu-node-0001",
        "job": "job-17",
        "ts": 1.0e9,
        "seq": 4,
        "util": 97.5,
        "gpus_lost": 0,
    },
    # what the stages write (detect, detect's census, act, the Slurm adapter); shapes only, the
    # signatures are of the right form but sign nothing
    "finding/1": {
        "schema": "finding/1",
        "id": "0123456789abcdef0123456789abcdef",
        "node": "gpu-node-0001",
        "gpu": 2,
        "kind": "xid",
        "severity": "critical",
        "score": 0.95,
        "summary": "XID 79: GPU fell off the bus",
        "evidence": {"rule": "xid_fatal", "xid": 79},
        "first_seen": 1.0e9,
        "ts": 1.0e9 + 5,
        "resolved": False,
        "sig": "ab" * 32,
    },
    "node/1": {
        "schema": "node/1",
        "node": "gpu-node-0001",
        "first_seen": 1.0e9,
        "last_seen": 1.0e9 + 60,
        "steady_since": 1.0e9 + 10,
        "seen_at": 1.0e9 + 60,
        "sig": "cd" * 32,
    },
    "drain/1": {
        "schema": "drain/1",
        "request_id": "fedcba9876543210fedcba9876543210",
        "node": "gpu-node-0001",
        "action": "drain",
        "reason": "fleetwatch: XID 79 on GPU 2",
        "severity": "critical",
        "findings": ["0123456789abcdef0123456789abcdef"],
        "issued_at": 1.0e9 + 6,
        "signature": "ef" * 32,
    },
    "drain_result/1": {
        "schema": "drain_result/1",
        "request_id": "fedcba9876543210fedcba9876543210",
        "node": "gpu-node-0001",
        "action": "drain",
        "outcome": "executed",
        "detail": "scontrol update done",
        "ts": 1.0e9 + 7,
        "request_signature": "ef" * 32,
        "signature": "01" * 32,
    },
    "control/1": {
        "schema": "control/1",
        "control": "drain_pause",
        "paused": True,
        "reason": "storage maintenance on the scratch filesystem",
        "by": "oncall@ops-1",
        "issued_at": 1.0e9 + 8,
        "until": 1.0e9 + 8 + 7200,
        "signature": "23" * 32,
    },
    "slurm_node/1": {
        "schema": "slurm_node/1",
        "node": "gpu-node-0001",
        "state": "idle",
        "reason": "",
        "features": ["a100", "ib"],
        "maintenance": True,
        "ours": False,
        "ts": 1.0e9 + 9,
        "signature": "45" * 32,
    },
}


def python_accepts(m: Any) -> bool:
    try:
        schemas.validate(m, schemas.TELEMETRY)
        return True
    except MessageError:
        return False


def _containers(m: dict[str, Any]) -> list[dict[str, Any]]:
    """The dicts of a (possibly already mutated) telemetry message that a mutation may touch."""
    out = [m]
    for k in ("host", "agent", "kernel"):
        if isinstance(m.get(k), dict):
            out.append(m[k])
    kernel = m.get("kernel")
    if isinstance(kernel, dict) and isinstance(kernel.get("events"), list):
        out += [e for e in kernel["events"] if isinstance(e, dict)]
    if isinstance(m.get("gpus"), list):
        out += [g for g in m["gpus"] if isinstance(g, dict)]
    net = m.get("net")
    if isinstance(net, dict):
        out.append(net)
        for k in ("ib", "eth"):
            if isinstance(net.get(k), list):
                out += [p for p in net[k] if isinstance(p, dict)]
    return out


def mutated_telemetry(
    data: st.DataObject,
    values: st.SearchStrategy[Any],
    changes: tuple[int, int] = (1, 3),
    extra_keys: tuple[str, ...] = ("extra_field",),
) -> dict[str, Any]:
    """telemetry() with an agent, then between changes[0] and changes[1] edits, each to one of its
    containers: one of its keys (or of `extra_keys`) removed, or set to a value drawn from `values`."""
    m = copy.deepcopy(telemetry())
    m["agent"] = {"version": "0.1", "source_errors": {}}
    m["kernel"] = copy.deepcopy(KERNEL_SECTION)
    for _ in range(data.draw(st.integers(*changes))):
        target = data.draw(st.sampled_from(_containers(m)))
        key = data.draw(st.sampled_from([*sorted(target), *extra_keys]))
        if data.draw(st.booleans()):
            target.pop(key, None)
        else:
            target[key] = data.draw(values)
    return m


def gpu(i: int, **kw: Any) -> dict[str, Any]:
    g = {"index": i, "util": 50.0, "temp_c": 60.0, "ecc_dbe_volatile": 0, "ecc_dbe_aggregate": 0, "xids": []}
    return {**g, **kw}


def sample(node: str, ts: float, seq: int, gpus: list[dict[str, Any]] | None = None, **kw: Any) -> bytes:
    return orjson.dumps(
        {"schema": "telemetry/1", "node": node, "ts": ts, "seq": seq, "gpus": gpus or [gpu(0)], **kw}
    )


# Any JSON value, small: what a hostile writer may put in any field of a signed record
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=50),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=4),
    max_leaves=12,
)
