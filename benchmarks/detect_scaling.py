"""Detector cost per node-sample and state size per GPU as the cluster grows (issue 6, item 4).

For each cluster size (64, 256, 1,024, 4,096, 16,384 nodes of 8 GPUs by default) one NodeTask
(pipeline/node_stage.py, the whole per-node stage) owns every node, as one detect worker owning
every partition would. It is warmed up on the first tick (every node's state is created there),
then NodeTask.process is timed on the remaining ticks in batches of --batch messages, with the
cyclic GC paused per batch as pipeline/worker.py runs it; CPU time of one core. The ratio is
against the smallest size measured in the same run (target: flat, 1.0).

Telemetry: the simulator core (scale.yaml, background faults at published rates x300); it is
generated outside the timed region, and all sizes see the same kind of telemetry:

- sizes <= --base-nodes (1,024): --base-nodes nodes x (--ticks + 1) ticks are simulated once and
  split into disjoint node subsets of that size, each subset one fresh NodeTask (one trial); the
  figure is the mean over trials. Every small size thus processes the same number of
  node-samples, instead of being timed on one or two batches.
- larger sizes: simulated at that size, one tick at a time between timed batches (~0.4 s per
  tick at 16,384 nodes; holding every tick of 16k nodes in memory would take GBs). With
  --replicate instead, the base cluster is copied size/base times with the node names suffixed
  (-r01, ...): faster, but replicas carry identical values.

State: len(NodeTask.to_bytes()) (the snapshot written to fleet.state.v1) per GPU; the memory a
task restored from that snapshot holds (tracemalloc around NodeTask.from_bytes, which counts
Python objects and numpy buffers alike) per GPU; and the numpy arrays of the statistical detector
(the largest per-series state) per GPU. Target: below 2 KiB per GPU, i.e. linear in nodes.

    python benchmarks/detect_scaling.py [--max-nodes 16384] [--ticks 30] [--batch 1000] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import tracemalloc
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from fleetwatch import topics
from fleetwatch.collectors.sim import Simulation, load_scenario, packaged_path
from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.runtime import gc_paused

GPUS = 8
SIZES = (64, 256, 1024, 4096, 16384)


@dataclass
class SizeResult:
    nodes: int
    trials: int
    timed_samples: int
    us_per_sample: float
    ratio: float
    snapshot_b_per_gpu: float
    restored_b_per_gpu: float
    stats_numpy_b_per_gpu: float


def generate(nodes: int, ticks: int, seed: int) -> Iterator[list[dict[str, Any]]]:
    """Telemetry of `nodes` nodes, one list per tick (every node, name order), lazily."""
    overrides = {"nodes": nodes, "gpus_per_node": GPUS, "duration_s": ticks, "seed": seed}
    sim = Simulation(load_scenario(str(packaged_path("scale.yaml")), overrides))
    for msgs in sim.ticks():
        yield sorted((m for t, _k, m in msgs if t == topics.TELEMETRY), key=lambda m: m["node"])


def replicate(ticks: Iterable[list[dict[str, Any]]], copies: int) -> Iterator[list[dict[str, Any]]]:
    """`copies` renamed copies of every node. Shallow: the detectors only read the sub-dicts."""
    for tick in ticks:
        yield [{**m, "node": f"{m['node']}-r{r:02d}"} for r in range(copies) for m in tick]


def _timed(task: Any, ticks: Iterable[list[dict[str, Any]]], batch: int) -> tuple[float, int]:
    """CPU seconds of task.process over the ticks in batches of `batch`, and the samples timed.

    Messages are cut into batches across tick boundaries, as a worker's poll does when it keeps
    up with a large fleet; only process() is timed, with the GC paused per batch like the worker
    (producing the next tick, simulated or copied, happens between batches, untimed).
    """
    cpu, n, pending = 0.0, 0, []

    def run(chunk: list[dict[str, Any]]) -> None:
        nonlocal cpu, n
        with gc_paused():
            t0 = time.process_time()
            task.process(topics.TELEMETRY, TelemetryBatch.from_messages(chunk))
            cpu += time.process_time() - t0
        n += len(chunk)

    for tick in ticks:
        pending += tick
        while len(pending) >= batch:
            chunk, pending = pending[:batch], pending[batch:]
            run(chunk)
    if pending:
        run(pending)
    return cpu, n


def _state_sizes(task: Any, gpus: int) -> tuple[float, float, float]:
    from fleetwatch.pipeline.job_table import JobTable
    from fleetwatch.pipeline.node_stage import NodeTask

    raw = task.to_bytes()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    restored = NodeTask.from_bytes(raw, JobTable())
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    restored.close()
    st = task.stats
    # Series arrays + calibration histograms (RobustScorer.nbytes) and GpuStats' own per-series arrays;
    # capacity grows by doubling, so this counts allocated, not only used, slots.
    per_gpu = st.run.nbytes + st.run_signal.nbytes
    stats_np = st.scorer.nbytes() + per_gpu + st.last_score.nbytes + st.last_value.nbytes
    return len(raw) / gpus, held / gpus, stats_np / gpus


def bench_task(ticks: Iterator[list[dict[str, Any]]], batch: int) -> tuple[Any, float, int]:
    """A fresh NodeTask warmed up on the first tick (every node's state is created there), then
    timed on the rest; returns the task, CPU seconds and samples timed."""
    from fleetwatch.pipeline.job_table import JobTable
    from fleetwatch.pipeline.node_stage import NodeTask

    task = NodeTask(JobTable())
    with gc_paused():
        task.process(topics.TELEMETRY, TelemetryBatch.from_messages(next(ticks)))
    cpu, n = _timed(task, ticks, batch)
    return task, cpu, n


def bench_size(nodes: int, args: argparse.Namespace, base: list[list[dict[str, Any]]]) -> dict[str, Any]:
    if nodes <= args.base_nodes:
        names = [m["node"] for m in base[0]]
        streams = []
        for i in range(0, len(names) - nodes + 1, nodes):
            mine = set(names[i : i + nodes])
            streams.append(iter([[m for m in tick if m["node"] in mine] for tick in base]))
    elif args.replicate:
        streams = [replicate(iter(base), nodes // args.base_nodes)]
    else:
        streams = [generate(nodes, args.ticks + 1, args.seed)]
    cpu, samples, sizes = 0.0, 0, (0.0, 0.0, 0.0)
    for k, stream in enumerate(streams):
        task, c, n = bench_task(stream, args.batch)
        cpu, samples = cpu + c, samples + n
        if k == 0:  # one trial's state is representative (same size, same kind of telemetry)
            sizes = _state_sizes(task, nodes * GPUS)
        task.close()  # unregister from the metrics collector, so the task can be freed
        del task
        gc.collect()
    return {
        "nodes": nodes,
        "trials": len(streams),
        "timed_samples": samples,
        "us_per_sample": cpu / samples * 1e6,
        "snapshot_b_per_gpu": sizes[0],
        "restored_b_per_gpu": sizes[1],
        "stats_numpy_b_per_gpu": sizes[2],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-nodes", type=int, default=SIZES[-1], help="largest cluster size measured")
    ap.add_argument("--base-nodes", type=int, default=1024, help="nodes actually simulated")
    ap.add_argument("--ticks", type=int, default=30, help="timed ticks per size (plus one warm-up tick)")
    ap.add_argument("--batch", type=int, default=1000, help="messages per NodeTask.process call")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--replicate", action="store_true", help="build sizes above the base from renamed copies")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sizes = [s for s in SIZES if s <= args.max_nodes]
    if not sizes:
        ap.error(f"--max-nodes must be at least {SIZES[0]}")
    if any(s < args.base_nodes and args.base_nodes % s for s in sizes) or (
        args.replicate and any(s > args.base_nodes and s % args.base_nodes for s in sizes)
    ):
        ap.error(
            "--base-nodes must be a multiple of the smaller sizes (and divide the larger with --replicate)"
        )

    t0 = time.perf_counter()
    base = list(generate(args.base_nodes, args.ticks + 1, args.seed))
    gen_s = time.perf_counter() - t0

    results: list[SizeResult] = []
    for s in sizes:
        t0 = time.perf_counter()
        r = bench_size(s, args, base)
        ref = results[0].us_per_sample if results else r["us_per_sample"]
        results.append(SizeResult(ratio=r["us_per_sample"] / ref, **r))
        print(f"  {s:,} nodes measured ({time.perf_counter() - t0:.0f} s wall)", file=sys.stderr)

    if args.json:
        print(json.dumps({"generate_s": round(gen_s, 1), "sizes": [asdict(r) for r in results]}, indent=2))
        return 0
    how = "copies of the base" if args.replicate else "simulated at size"
    print(
        f"scale.yaml, {args.ticks} timed ticks + 1 warm-up; {args.base_nodes} base nodes simulated in "
        f"{gen_s:.1f} s; larger sizes {how}; batch {args.batch}; CPU time of one core, GC paused per batch"
    )
    print(
        f"{'nodes':>7} {'trials':>6} {'samples':>8} {'us/sample':>10} {'ratio':>6} "
        f"{'snapshot B/GPU':>15} {'restored B/GPU':>15} {'stats np B/GPU':>15}"
    )
    for r in results:
        print(
            f"{r.nodes:>7,} {r.trials:>6} {r.timed_samples:>8,} {r.us_per_sample:>10.1f} {r.ratio:>6.2f} "
            f"{r.snapshot_b_per_gpu:>15,.0f} {r.restored_b_per_gpu:>15,.0f} {r.stats_numpy_b_per_gpu:>15,.0f}"
        )
    print(
        f"ratio: us/sample against {results[0].nodes} nodes in this run (target: flat); "
        "state target: < 2,048 B/GPU at every size"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
