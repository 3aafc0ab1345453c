"""Node-name churn: state, snapshot, series and cost of the node stage when names come and go
(issue 15, item 17).

Three cases over the same event time, each in a fresh subprocess (so its RSS is its own):
- steady: --alive names (1,000) reporting throughout;
- churn, forgetting: --names churned names (24,000), each reporting for --life-s (20 min) and never
  again, --alive of them at any time, with NodeTaskConfig.forget_after_s = --forget-after (1 h);
- churn, never forgetting: the same names with forget_after_s = inf (what the stage did before).
One NodeTask (pipeline/node_stage.py, the whole per-node stage) owns every name, one call of
NodeTask.process per sampling interval (--interval-s, 30 s; the silence detector's silent_after_s
is set to 10 intervals). The run lasts names / alive x life of event time (8 h), up to the
interval the last names start in, so that it ends with churn going on, not with a fleet emptying.
With forgetting, a task then holds the names reporting and those gone within forget_after_s:
about alive x (1 + forget_after / life) names (4x the steady case at the defaults).

Telemetry: one tick of the simulator's healthy scenario (8 GPUs, the IB ports and host fields of
a real agent's sample) as a columnar TelemetryBatch template; each name keeps one of its rows
while it lives, renamed, with its timestamps (spread over the interval, per name) and noise on
temperature, power and SM clock so that the statistical scorer works on changing values.
Building the batches is not timed.

Per case, at the end: the nodes the task holds; process RSS growth from before the first batch
(current RSS at the end, and the peak during the run); the memory of a task restored from its
snapshot (tracemalloc around NodeTask.from_bytes: the state itself, without the allocator's free
lists); len(NodeTask.to_bytes()) (the snapshot written to fleet.state.v1); the Prometheus samples
the task exports (a FleetStateCollector holding only it, as fleet_metrics.COLLECTOR reads it at a
scrape); open findings; CPU time per node-sample of NodeTask.process (one core, GC paused per
batch as pipeline/worker.py runs it), and the share of it spent forgetting (NodeTask.forget:
O(state) each time, run by the check every forget_every_s = 60 s, which is every other batch at
a 30 s interval but every 60th at the agents' 1 s). Ratios are against the steady case.

    python benchmarks/churn.py [--names 24000] [--alive 1000] [--life-s 1200] [--interval-s 30]
                               [--forget-after 3600] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import resource
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import numpy as np

CASES = ("steady", "churn, forgetting", "churn, never forgetting")
NOISY = ("temp_c", "power_w", "sm_clock_mhz")  # signals the statistical scorer reads


def rss_mb() -> float:
    """Current resident set size of this process (MB)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6  # KiB on Linux


def template(rows: int, seed: int) -> Any:
    """One healthy simulated tick of `rows` nodes as a columnar batch (names replaced later)."""
    from fleetwatch import topics
    from fleetwatch.collectors.sim import Simulation, load_scenario, packaged_path
    from fleetwatch.detectors.batch import TelemetryBatch

    overrides = {"nodes": rows, "duration_s": 1, "seed": seed}
    sim = Simulation(load_scenario(str(packaged_path("healthy.yaml")), overrides))
    msgs = [m for t, _k, m in sim.step() if t == topics.TELEMETRY]
    return TelemetryBatch.from_messages(msgs)


def schedule(args: argparse.Namespace, case: str) -> Iterator[tuple[float, list[str]]]:
    """(start of the interval, names reporting in it), interval by interval."""
    life = max(1, round(args.life_s / args.interval_s))  # samples per churned name
    per_tick = max(1, args.alive // life)  # names starting each interval: ~alive reporting at once
    # up to the interval the last names start in: then as many report as ever (the measurement is
    # of churn going on, not of a fleet emptying)
    ticks = math.ceil(args.names / per_tick)
    steady = [f"steady-{i:05d}" for i in range(args.alive)]
    for t in range(ticks):
        if case == "steady":
            yield t * args.interval_s, steady
        else:
            lo, hi = max(0, t - life + 1) * per_tick, min(args.names, (t + 1) * per_tick)
            yield t * args.interval_s, [f"churn-{i:05d}" for i in range(lo, hi)]


def batch_of(
    tmpl: Any, names: list[str], t: float, interval: float, seq: int, rng: np.random.Generator
) -> Any:
    """These names' samples in the interval from t: template rows, renamed and re-timed."""
    from fleetwatch.detectors.batch import GPU_COL

    # A name keeps its template row while it lives (its counters must not step back: a reset is a
    # finding), and names reporting at once have distinct rows (they are consecutive numbers).
    number = np.fromiter((int(n.rsplit("-", 1)[1]) for n in names), np.int64, len(names))
    slot = number % tmpl.size
    order = np.argsort(slot)
    names = [names[i] for i in order.tolist()]
    keep = np.zeros(tmpl.size, dtype=bool)
    keep[slot] = True
    b = tmpl.select(keep)
    # each name samples at its own offset in the interval (a fleet's agents are not in lockstep)
    ts = 1_800_000_000.0 + t + (number[order] % 97) / 97 * 0.9 * interval
    gpu = b.gpu.copy()
    for c in NOISY:
        gpu[:, :, GPU_COL[c]] += rng.normal(0.0, 0.5, gpu.shape[:2])
    return dataclasses.replace(
        b, node_names=names, ts=ts, seq=np.full(len(names), seq), received=ts.copy(), gpu=gpu
    )


def forget_timer(task: Any) -> dict[str, float]:
    """CPU time and calls of the task's forgetting (NodeTask.forget, run by its periodic check
    when there are nodes to forget): it compacts every table, so it costs O(state) each time."""
    totals = {"cpu": 0.0, "calls": 0}
    forget = task.forget

    def timed(gone: Any) -> Any:
        c0 = time.process_time()
        try:
            return forget(gone)
        finally:
            totals["cpu"] += time.process_time() - c0
            totals["calls"] += 1

    task.forget = timed
    return totals


def run_case(args: argparse.Namespace, case: str) -> dict[str, Any]:
    """One case in this process: feed the stage, then measure it."""
    from fleetwatch import topics
    from fleetwatch.detectors.silence import SilenceConfig
    from fleetwatch.pipeline import fleet_metrics
    from fleetwatch.pipeline.job_table import JobTable
    from fleetwatch.pipeline.node_stage import NodeTask, NodeTaskConfig
    from fleetwatch.runtime import gc_paused

    NodeTask.warm_up()
    rng = np.random.default_rng(args.seed)
    tmpl = template(args.alive, args.seed)
    forget = math.inf if case == "churn, never forgetting" else args.forget_after
    cfg = NodeTaskConfig(
        forget_after_s=forget,
        silence=SilenceConfig(silent_after_s=10 * args.interval_s),
        emit_features=False,
    )
    task = NodeTask(JobTable(), cfg)
    forgets = forget_timer(task)
    gc.collect()
    rss0 = rss_mb()
    cpu, samples, findings, forgotten = 0.0, 0, 0, 0
    for k, (t, names) in enumerate(schedule(args, case)):
        batch = batch_of(tmpl, names, t, args.interval_s, k, rng)
        with gc_paused():
            c0 = time.process_time()
            out = task.process(topics.TELEMETRY, batch)
            cpu += time.process_time() - c0
        samples += len(names)
        findings += sum(1 for topic, _k, m in out if topic == topics.FINDINGS)
        forgotten += sum(1 for topic, _k, m in out if topic == topics.NODES and m is None)
    gc.collect()
    rss1 = rss_mb()  # (both before the snapshot and restore below add their own)
    peak1 = max(peak_rss_mb(), rss1)  # (ru_maxrss can trail the current RSS by a page or so)
    collector = fleet_metrics.FleetStateCollector()
    collector.add_nodes(task)
    series = sum(len(family.samples) for family in collector.collect())
    raw = task.to_bytes()
    held = len(task.index)
    task.close()
    del task
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    restored = NodeTask.from_bytes(raw, JobTable(), cfg)
    state = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    open_findings = sum(len(b.open) for b in (restored.hardware.book, restored.silence.book,
                                              restored.stats.book, restored.lemon.book))  # fmt: skip
    restored.close()
    return {
        "case": case,
        "names": args.alive if case == "steady" else args.names,
        "nodes_held": held,
        "samples": samples,
        "us_per_sample": cpu / samples * 1e6,
        "forget_cpu_share": forgets["cpu"] / cpu,
        "forget_ms_each": forgets["cpu"] / max(1, forgets["calls"]) * 1e3,
        "rss_growth_mb": rss1 - rss0,
        "peak_rss_growth_mb": max(0.0, peak1 - rss0),  # 0: no new peak after the start
        "state_mb": state / 1e6,
        "snapshot_mb": len(raw) / 1e6,
        "series": series,
        "open_findings": open_findings,
        "findings": findings,
        "forgotten": forgotten,
    }


def child_options(args: argparse.Namespace) -> list[str]:
    """The options that make a child process run a case as this run does (--quick applied)."""
    opts = {
        "--names": args.names,
        "--alive": args.alive,
        "--life-s": args.life_s,
        "--interval-s": args.interval_s,
        "--forget-after": args.forget_after,
        "--seed": args.seed,
    }
    return [str(x) for kv in opts.items() for x in kv]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--names", type=int, default=24000, help="churned node names over the run")
    ap.add_argument("--alive", type=int, default=1000, help="names reporting at any time (and steady names)")
    ap.add_argument("--life-s", type=float, default=1200.0, help="event time a churned name reports for")
    ap.add_argument("--interval-s", type=float, default=30.0, help="sampling interval of every node")
    ap.add_argument(
        "--forget-after", type=float, default=3600.0, help="forget_after_s of the forgetting case"
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--quick", action="store_true", help="a tenth of the names and of alive, half the life (< 1 min)"
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # internal: one case, JSON out
    args = ap.parse_args()
    if args.quick:
        args.names, args.alive, args.life_s = args.names // 10, args.alive // 10, args.life_s / 2
    if args.case:
        print(json.dumps(run_case(args, args.case)))
        return 0

    t0 = time.perf_counter()
    results = []
    for case in CASES:
        argv = [sys.executable, __file__, "--case", case, *child_options(args)]
        c0 = time.perf_counter()
        done = subprocess.run(argv, check=True, capture_output=True, text=True)
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"  {case}: {time.perf_counter() - c0:.0f} s wall", file=sys.stderr)
    steady = results[0]
    keys = ("nodes_held", "rss_growth_mb", "state_mb", "snapshot_mb", "series", "us_per_sample")
    ratios = {r["case"]: {k: r[k] / steady[k] if steady[k] else math.nan for k in keys} for r in results}
    if args.json:
        print(json.dumps({"args": vars(args), "results": results, "ratio_to_steady": ratios}, indent=2))
        return 0
    span = steady["samples"] / args.alive * args.interval_s
    print(
        f"{args.names:,} churned names ({args.alive:,} reporting at a time, {args.life_s:g} s each) vs "
        f"{args.alive:,} steady; {span / 3600:.1f} h of event time, a sample every {args.interval_s:g} s; "
        f"forget_after_s {args.forget_after:g}; {time.perf_counter() - t0:.0f} s wall"
    )
    print(
        f"{'case':<24} {'names':>7} {'held':>7} {'RSS MB':>7} {'peak':>7} {'state MB':>9} {'snap MB':>8} "
        f"{'series':>8} {'open':>6} {'us/sample':>10} {'forget':>7}"
    )
    for r in results:
        print(
            f"{r['case']:<24} {r['names']:>7,} {r['nodes_held']:>7,} {r['rss_growth_mb']:>7.1f} "
            f"{r['peak_rss_growth_mb']:>7.1f} {r['state_mb']:>9.1f} {r['snapshot_mb']:>8.1f} "
            f"{r['series']:>8,} {r['open_findings']:>6,} {r['us_per_sample']:>10.1f} "
            f"{r['forget_cpu_share']:>7.0%}"
        )
    for case in CASES[1:]:
        q = ratios[case]
        print(
            f"{case} / steady: held {q['nodes_held']:.1f}x, RSS growth {q['rss_growth_mb']:.1f}x, state "
            f"{q['state_mb']:.1f}x, snapshot {q['snapshot_mb']:.1f}x, series {q['series']:.1f}x, "
            f"CPU/sample {q['us_per_sample']:.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
