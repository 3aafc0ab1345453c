"""Run the node agent's sources on a real GPU machine and the detect path on what they read.

For a machine with NVIDIA GPUs and no Kafka (the device machines some sessions are lent): the
NVML, host and network sources sample through the agent's own code (collectors/agent.py, real
pynvml), every sample goes through the detect worker's decoder (the compiled scanner first, then
the message decoders, exactly as pipeline/worker.py calls them) and the per-node stage, and the
script writes what it saw under OUT (default ./gpu-check):

- samples.jsonl    the telemetry/1 messages as the agent would send them
- report.json      per field: how many GPUs reported it, min/max; sources' errors; which decoder
                   took each sample; findings; the kernel log's NVIDIA lines (if readable)
- nvidia-smi.txt   `nvidia-smi -q` for comparison with what NVML gave the collector
- kmsg.txt         the NVRM / Xid lines of the kernel log, as real examples for tests

    python3 scripts/gpu_check.py [--samples 10] [--interval 1] [--out DIR]

Exit status 0 when every sample was valid and taken by the scanner, else 1 (the report says why).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleetwatch import schemas, telemetry_scan, topics
from fleetwatch.collectors.agent import Agent, SourceRunner
from fleetwatch.collectors.sources import make_source
from fleetwatch.collectors.spool import Spool
from fleetwatch.pipeline.job_table import JobTable
from fleetwatch.pipeline.node_stage import NodeTask
from fleetwatch.pipeline.telemetry_decode import decode_telemetry
from fleetwatch.record_block import RecordBlock

NVIDIA_LINE = re.compile(r"NVRM|Xid|SXid|nvidia", re.IGNORECASE)


class NoForwarder:
    """The agent's forwarder when there is no broker: samples stay in the spool."""

    def start(self) -> None: ...

    def close(self, drain_timeout_s: float = 0) -> None: ...

    def drain(self, timeout_s: float) -> bool:
        return True


def kernel_log() -> tuple[str, list[str]]:
    """(where it was read from, its NVIDIA lines): /dev/kmsg without blocking, else dmesg."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        kmsg_error = f"/dev/kmsg: {e.strerror}"
    else:
        lines = []
        try:
            while True:
                try:
                    lines.append(os.read(fd, 8192).decode("utf-8", "replace").rstrip("\n"))
                except BlockingIOError:
                    break
                except OSError:  # EPIPE: a record was overwritten while reading; go on
                    continue
        finally:
            os.close(fd)
        return "/dev/kmsg", [x for x in lines if NVIDIA_LINE.search(x)]
    r = subprocess.run(["dmesg"], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        return f"{kmsg_error}; dmesg: {r.stderr.strip()[:200]}", []
    return "dmesg", [x for x in r.stdout.splitlines() if NVIDIA_LINE.search(x)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=10)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--out", default="gpu-check")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    node = re.sub(r"[^A-Za-z0-9._:-]", "-", socket.gethostname().split(".")[0]) or "gpu-node"

    runners = [SourceRunner(name, lambda name=name: make_source(name)) for name in ("nvml", "host", "net")]
    spool = Spool(Path(tempfile.mkdtemp()) / "spool.sqlite", max_bytes=64 << 20)
    agent = Agent(node=node, runners=runners, spool=spool, forwarder=NoForwarder(), interval_s=args.interval)
    t0 = time.perf_counter()
    msgs = []
    for _ in range(args.samples):
        msgs.append(agent.tick())
        time.sleep(args.interval)
    sample_s = (time.perf_counter() - t0) / args.samples - args.interval
    raws = [schemas.encode(m) for m in msgs]
    (out / "samples.jsonl").write_bytes(b"\n".join(raws) + b"\n")

    # The worker's path: records with the node as key, timestamped now by "the broker".
    now = time.time()
    block = RecordBlock.from_values(
        raws, keys=[node.encode()] * len(raws), append_ms=[int(now * 1000)] * len(raws)
    )
    t1 = time.perf_counter()
    scanned = telemetry_scan.scan(raws).taken.tolist()
    batch, bad = decode_telemetry(block, now=now, clock=schemas.DEFAULT_CLOCK)
    task = NodeTask(JobTable())
    outputs = task.process(topics.TELEMETRY, batch) if len(batch) else []
    detect_s = time.perf_counter() - t1

    fields: dict[str, list[float]] = {}
    for m in msgs:
        for g in m["gpus"]:
            for k, v in g.items():
                if isinstance(v, int | float) and not isinstance(v, bool):
                    fields.setdefault(k, []).append(float(v))
    where, nvidia_lines = kernel_log()
    (out / "kmsg.txt").write_text("\n".join(nvidia_lines) + "\n")
    try:
        smi = subprocess.run(["nvidia-smi", "-q"], capture_output=True, text=True, check=False)
        (out / "nvidia-smi.txt").write_text(smi.stdout or smi.stderr)
    except OSError as e:
        (out / "nvidia-smi.txt").write_text(f"nvidia-smi: {e}\n")
    report: dict[str, Any] = {
        "node": node,
        "gpus": len(msgs[-1]["gpus"]) if msgs else 0,
        "agent_seconds_per_sample": round(max(sample_s, 0.0), 4),
        "source_errors": dict(
            Counter(f"{k}: {v}" for m in msgs for k, v in m["agent"]["source_errors"].items())
        ),
        "fields": {
            k: {"gpus_x_samples": len(v), "min": min(v), "max": max(v)} for k, v in sorted(fields.items())
        },
        "keys_outside_the_contract": sorted(
            {k for m in msgs for g in m["gpus"] for k in g} - {"index", "lost", *schemas.GPU_FIELDS}
        ),
        "taken_by_scanner": f"{len(scanned)} of {len(raws)}",
        "refused": [(i, e.reason, e.detail) for i, e in bad],
        "detect_seconds_incl_compile": round(detect_s, 2),
        "outputs": dict(Counter(t for t, _k, _m in outputs)),
        "findings": [m for t, _k, m in outputs if t == topics.FINDINGS],
        "kernel_log": {"read_from": where, "nvidia_lines": len(nvidia_lines), "first": nvidia_lines[:20]},
    }
    (out / "report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "fields"}, indent=2))
    for r in runners:
        r.close()
    ok = bool(msgs) and not bad and len(scanned) == len(raws)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
