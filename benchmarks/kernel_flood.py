"""The kernel source under a flood: 100,000 kernel log records at once (a driver in an error loop
prints the same XID over and over, with other lines between), read by the agent's `kernel` source
(collectors/kernel_log/source.py) as the agent calls it, one sample a tick.

Measured in one run:
- the source's rate (records/s) and the time of each sample() (a sample reads at most 20,000
  records, so the tick cadence of the agent holds if a sample takes less than the interval);
- the baseline: the same records read from the same device with only a substring test per record
  (the least any reader does), so `ratio` is the parser's and coalescing's cost over reading;
- peak memory (tracemalloc, in a pass of its own) while the source works through the flood, against
  the records' size;
- what came out: events, with the repeats folded into counts (their sum is the flood).

The device is tests/helpers/fake_kmsg.py's ring buffer, which answers read() as /dev/kmsg does: a
real kernel log cannot be filled with 100,000 records at will without flooding the host's.

    python -m benchmarks.kernel_flood [--records 100000] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from fleetwatch.collectors.kernel_log.source import KernelLogSource
from tests.helpers.fake_kmsg import RingKmsg

# real lines (tests/fixtures/kernel_log/nvrm_xid.txt, pcie_aer.txt): the loop's XID and what a
# busy kernel prints between
FLOOD = "NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for RPC"
BETWEEN = (
    "pcieport 0000:00:02.0: AER: Corrected error received: id=0010",
    "pcieport 0000:00:02.0: PCIe Bus Error: severity=Corrected, type=Data Link Layer, "
    "id=0010(Transmitter ID)",
    "IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready",
)


def _ring(records: int) -> RingKmsg:
    ring = RingKmsg(capacity=records + 10)
    for i in range(records):
        ring.log(BETWEEN[i % 3] if i % 10 == 9 else FLOOD)
    return ring


def _baseline(records: int) -> float:
    """Seconds to read every record with one substring test each."""
    reader = _ring(records).open()
    t0 = time.perf_counter()
    hits = 0
    while True:
        try:
            raw = reader.read()
        except BlockingIOError:
            break
        hits += b"NVRM: Xid" in raw
    return time.perf_counter() - t0


def _source_run(records: int, boot: Path, traced: bool) -> dict[str, Any]:
    """The source through the flood, timed (traced=False) or with its memory traced (which slows
    Python several times: its times are not the source's)."""
    ring = _ring(records)
    src = KernelLogSource(device=ring.open, boot_id=boot, gpus=lambda: {"0000:9b:00.0": 3})
    samples: list[float] = []
    events = xid_count = 0
    if traced:
        tracemalloc.start()
    t0 = time.perf_counter()
    while True:
        s0 = time.perf_counter()
        section = src.sample().get("kernel", {"events": [], "records": 0})  # quiet: no section
        samples.append(time.perf_counter() - s0)
        events += len(section["events"])
        xid_count += sum(e["count"] for e in section["events"] if e.get("code") == 119)
        if section["records"] == 0:
            break
    total = time.perf_counter() - t0
    peak = 0
    if traced:
        _current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    src.close()
    return {
        "seconds": total,
        "samples": len(samples) - 1,
        "sample_s_max": max(samples),
        "sample_s_median": statistics.median(samples[:-1]),
        "events_out": events,
        "xid_119_counted": xid_count,
        "peak_mib": peak / 2**20,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each side, alternating; best of each")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        boot = Path(tmp) / "boot_id"
        boot.write_text("0cec5dfe-715f-4b50-8a6a-7591dd3ffb2e\n")
        base, runs = [], []
        for _ in range(args.repeat):
            base.append(_baseline(args.records))
            runs.append(_source_run(args.records, boot, traced=False))
        traced = _source_run(args.records, boot, traced=True)
    best = min(runs, key=lambda r: r["seconds"])
    flood_xids = sum(1 for i in range(args.records) if i % 10 != 9)
    ring_mib = sum(len(t) for _s, t in _ring(args.records).records) / 2**20
    result = {
        "records": args.records,
        "source_records_per_s": round(args.records / best["seconds"]),
        "baseline_records_per_s": round(args.records / min(base)),
        "ratio_source_to_baseline_time": round(best["seconds"] / min(base), 1),
        "samples": best["samples"],
        "sample_s_median": round(best["sample_s_median"], 3),
        "sample_s_max": round(best["sample_s_max"], 3),
        "events_out": best["events_out"],
        "xid_119_in_flood": flood_xids,
        "xid_119_counted": best["xid_119_counted"],
        "peak_mib": round(traced["peak_mib"], 1),
        "records_mib": round(ring_mib, 1),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")
    return 0 if result["xid_119_counted"] == flood_xids else 1


if __name__ == "__main__":
    sys.exit(main())
