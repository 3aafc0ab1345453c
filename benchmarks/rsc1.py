"""The paper reproduced on the simulator: an RSC-1-like cluster through the real pipeline.

Weeks of an RSC-1-like cluster (collectors/sim/workload.py: about 2,000 nodes of 8 GPUs, the
paper's job-size constraints, infrastructure failures at r_f by component, [ours] where the paper
gives no number) run without wall-clock waits through the real pieces: a private Kafka broker, a
`fleetwatch detect` worker, and `fleetwatch account`. Nothing is handed to the accounting stage
but what the pipeline makes of it:

- the jobs as `fleetwatch slurm-jobs` publishes them (`job/1` with start, end, Slurm's end state,
  GPUs per node), and the training jobs' step reports with their checkpoint marks;
- each infrastructure failure as telemetry from its node: the simulator's fault of that component
  (an InfiniBand link down, a hung Lustre mount, a double-bit ECC error, a fatal PCIe error, an
  NVSwitch fatal error, a GSP timeout) run on that node from two minutes before the fault to
  four minutes after, at the fault's time, then the node repaired (its state before the fault)
  for eight minutes, so that the findings clear; `detect` turns it into findings. A node that stopped
  answering (NODE_FAIL) sends nothing;
- two small nodes per detect partition reporting every five minutes, so that each partition's
  event-time clock moves: a failed node that reports no more is forgotten after 30 minutes of it,
  and its findings resolve (the repair).

Then the accounting stage's report over the period; the simulator's true r_f and per-size MTTF
(1 / (nodes x r_f)) beside the measured ones with their 95% intervals.

    python -m benchmarks.rsc1 [--nodes 2000 --days 28] [--json] [--lemon-fraction 0.012]

With --lemon-fraction the cluster has lemon nodes (failing --lemon-multiplier times as often);
the report's lemon section, and the large jobs' failure share before and after the lemons' drains
(the lemons drained and repaired at mid-period, as an operator acting on the report would).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from benchmarks.fault_latency import private_broker
from fleetwatch import schemas, topics
from fleetwatch.alerts import drain_result
from fleetwatch.bus.kafka import KafkaBus
from fleetwatch.bus.partitioner import partition_for
from fleetwatch.collectors.sim import Simulation, rates
from fleetwatch.collectors.sim.scenario import parse_scenario
from fleetwatch.collectors.sim.workload import Workload, WorkloadConfig, draw, node_name
from fleetwatch.pipeline.reliability import report
from fleetwatch.pipeline.reliability.store import Store

REPO = Path(__file__).resolve().parent.parent
# the simulator's fault that shows each component's failure on its node
FAULT_OF = {
    "ib_link": "ib_link_down",
    "filesystem_mount": "mount_hung",
    "gpu_memory": "xid48",
    "pcie": "pcie_aer_fatal",
    "nvlink": "nvswitch_fatal",
    "driver": "xid119",
}
PRE_S, POST_S, INTERVAL_S = 120.0, 240.0, 10.0
REPAIRED_S = 480.0  # then the node repaired (its pre-fault state): long enough for findings to clear
CLOCK_EVERY_S = 300.0
PARTITIONS = 4
DETECT_CONFIG = """\
# benchmarks/rsc1.py: weeks of history sent at once; only failing nodes (and one clock node per
# partition) report, so silence means nothing here and a node that stops reporting is repaired
[detect]
no_skew_check = true
snapshot_every = 3600.0
[detect.node]
forget_after_s = 1800.0
[detect.node.silence]
silent_after_s = 1.0e12
"""


def fault_telemetry(kind: str, node: str, fault_ts: float, seed: int) -> list[dict[str, Any]]:
    """The simulator's telemetry of one node with `kind` at `fault_ts` (PRE_S before, POST_S after)."""
    sc = parse_scenario(
        {
            "name": "rsc1-fault",
            "seed": seed,
            "nodes": 1,
            "interval_s": INTERVAL_S,
            "duration_s": PRE_S + POST_S,
            "background": {"enabled": False},
            "faults": [{"kind": kind, "node": 1, "onset_s": PRE_S, "duration_s": 60}],
        }
    )
    out = []
    for topic, _key, m in Simulation(sc, epoch=fault_ts - PRE_S).run():
        if topic == topics.TELEMETRY:
            out.append({**m, "node": node})
    # the repair: the node as it was before the fault (fresh GPU, links up, mounts back), its
    # agent numbering on; a double-bit ECC count, which the simulator keeps, is reset
    before = out[: int(PRE_S / INTERVAL_S)]
    last = out[-1]
    for k in range(int(REPAIRED_S / INTERVAL_S)):
        m = before[k % len(before)]
        out.append({**m, "ts": last["ts"] + (k + 1) * INTERVAL_S, "seq": last["seq"] + k + 1})
    return out


def clock_nodes(per_partition: int = 2) -> list[str]:
    """Node names, `per_partition` on each detect partition (the key's murmur2 partition, as the
    producers send): a partition's clock needs two nodes (detectors/silence.py, reference_time)."""
    names: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    i = 0
    while any(len(v) < per_partition for v in names.values()):
        name = f"clock-{i:03d}"
        bucket = names[partition_for(name.encode(), PARTITIONS)]
        if len(bucket) < per_partition:
            bucket.append(name)
        i += 1
    return [n for p in sorted(names) for n in names[p]]


def history(w: Workload) -> list[tuple[float, str, bytes, bytes]]:
    """(time, topic, key, value) of everything the cluster sends, in time order."""
    out = [(ts, topics.JOBS, job.encode(), orjson.dumps(m)) for ts, job, m in w.job_messages()]
    for i in np.flatnonzero(np.isfinite(w.first_step) & (w.gpus >= 64)):  # large training jobs report steps
        job, end, rank0 = f"j{int(w.job[i])}", float(w.end[i]), node_name(int(w.first_node[i]))
        first = float(w.first_step[i])
        marks = [(first, 1, {})]
        if np.isfinite(w.ckpt_ts[i]):
            ck = float(w.ckpt_ts[i])
            marks.append((ck + 1, 2, {"checkpoint_step": 1, "checkpoint_ts": ck, "checkpoint_write_s": 60.0}))
        if end - 1 > marks[-1][0]:
            marks.append((end - 1, 3, {}))
        for ts, n, extra in marks:
            m = {"schema": schemas.STEP, "job": job, "node": rank0, "rank": 0, "step": n,
                 "step_time_s": 1.0, "ts": ts, **extra}  # fmt: skip
            out.append((ts, topics.STEPS, job.encode(), orjson.dumps(m)))
    for i in range(len(w.fault_node)):  # every node fault, whether a job was on the node or not
        comp = str(w.fault_component[i])
        if comp not in FAULT_OF:
            continue  # NODE_FAIL: the node just stopped answering
        node = node_name(int(w.fault_node[i]))
        for m in fault_telemetry(FAULT_OF[comp], node, float(w.fault_time[i]), seed=i):
            out.append((m["ts"], topics.TELEMETRY, node.encode(), orjson.dumps(m)))
    healthy = fault_telemetry("ib_link_down", "x", w.cfg.start, seed=0)[0]  # a sample before its fault
    for c in clock_nodes():
        for ts in np.arange(w.cfg.start, w.cfg.start + w.cfg.days * 86400, CLOCK_EVERY_S):
            out.append(
                (
                    float(ts),
                    topics.TELEMETRY,
                    c.encode(),
                    orjson.dumps({**healthy, "node": c, "ts": float(ts)}),
                )
            )
    out.sort(key=lambda r: r[0])
    return out


def drained_results(drained: dict[int, float], key: bytes) -> list[tuple[float, str, bytes, bytes]]:
    """The Slurm adapter's answers for the lemons drained (an operator acting on a report)."""
    out = []
    for n, ts in drained.items():
        r = drain_result.make_result(
            request_id=f"{n:032x}", node=node_name(n), action="drain", outcome="executed",
            detail="drained: lemon (benchmark)", ts=ts, request_signature="0" * 64, key=key,
        )  # fmt: skip
        out.append((ts, topics.DRAIN_RESULTS, r["node"].encode(), orjson.dumps(r)))
    return out


def produce(bootstrap: str, msgs: list[tuple[float, str, bytes, bytes]]) -> None:
    p = KafkaBus(bootstrap).producer(linger_ms=50)
    try:
        for i, (_ts, topic, key, value) in enumerate(msgs):
            p.send(topic, key=key, value=value)
            if i % 50_000 == 0:
                p.poll(0)
        failed = p.flush(120)
        if failed:
            raise SystemExit(f"{len(failed)} records were not acknowledged")
    finally:
        p.close(10)


def warm_up(bootstrap: str) -> None:
    """A fresh broker takes a few seconds to load its coordinators; an idempotent producer that
    gets its id meanwhile can fail fatally later (out-of-order sequence). Wait until a probe
    record to every topic is acknowledged."""
    deadline = time.monotonic() + 60
    while True:
        p = KafkaBus(bootstrap).producer(linger_ms=0)
        try:
            for t in topics.ALL:
                p.send(t, key=b"rsc1-probe", value=None if t in topics.COMPACTED else b"")
            if not p.flush(10):
                break
        finally:
            p.close(5)
        if time.monotonic() > deadline:
            raise SystemExit("the private broker did not accept records within 60 s")
        time.sleep(1.0)
    time.sleep(3.0)


class Detect:
    """The `fleetwatch detect` worker, restarted as its supervisor (systemd) would if it exits.
    A fresh broker can fail an idempotent producer fatally (an out-of-order first sequence on a
    new partition, KAFKA-15591, fixed after Kafka 4.1); the worker exits and its restart resumes
    from its commits, which is what the pipeline is built for."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path, max_restarts: int = 3) -> None:
        self.argv, self.env, self.log, self.max_restarts = argv, env, log, max_restarts
        self.restarts = 0
        self.proc = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        with open(self.log, "ab") as out:
            return subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT)

    def check(self) -> None:
        if self.proc.poll() is None:
            return
        if self.restarts >= self.max_restarts:
            raise SystemExit(
                f"fleetwatch detect exited {self.proc.returncode}: {self.log.read_text()[-2000:]}"
            )
        self.restarts += 1
        self.proc = self._start()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(60)


def wait_consumed(bootstrap: str, group: str, names: list[str], timeout_s: float, detect: Detect) -> None:
    """Until the group's committed offsets reach the end of every input topic."""
    from fleetwatch.bus import TopicPart
    from fleetwatch.bus.admin import Admin

    reader = KafkaBus(bootstrap).reader()
    try:
        tps = [TopicPart(t, p) for t in names for p in reader.partitions(t)]
        ends = reader.end_offsets(tps)
    finally:
        reader.close()
    deadline = time.monotonic() + timeout_s
    with Admin(bootstrap) as admin:
        while True:
            detect.check()
            try:
                done = admin.group_offsets(group, tps)
            except Exception as e:  # the group coordinator of a fresh broker still loading: ask again
                if "LOAD_IN_PROGRESS" not in str(e) and "NOT_COORDINATOR" not in str(e):
                    raise
                time.sleep(1.0)
                continue
            if all(done.get(tp, 0) >= ends[tp] for tp in tps if ends[tp] > 0):
                return
            if time.monotonic() > deadline:
                behind = {f"{tp.topic}:{tp.partition}": ends[tp] - done.get(tp, 0) for tp in tps}
                raise SystemExit(f"detect did not consume its inputs in {timeout_s:.0f} s: {behind}")
            time.sleep(1.0)


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    t0 = time.monotonic()
    now = time.time()
    cfg = WorkloadConfig(nodes=args.nodes, days=args.days, seed=args.seed, r_f=args.r_f,
                         lemon_fraction=args.lemon_fraction, lemon_multiplier=args.lemon_multiplier,
                         start=now - (args.days + 1) * 86400)  # fmt: skip
    if args.lemon_fraction > 0:  # an operator drains the lemons at mid-period; they fail no more
        cfg = replace(cfg, lemons_fixed_at=cfg.start + cfg.days * 86400 / 2)
    w = draw(cfg)
    drained = {int(n): cfg.lemons_fixed_at for n in w.lemons}
    census_key, drain_key = os.urandom(32).hex(), os.urandom(32).hex()
    msgs = history(w) + drained_results(drained, drain_key.encode())
    msgs.sort(key=lambda r: r[0])
    env = {**os.environ, "FLEETWATCH_CENSUS_KEY": census_key, "FLEETWATCH_DRAIN_KEY": drain_key}
    (work / "detect.toml").write_text(DETECT_CONFIG)
    with private_broker(args.broker_port) as bootstrap:
        from fleetwatch.bus.admin import ensure_topics

        ensure_topics(bootstrap, partitions=PARTITIONS)
        warm_up(bootstrap)
        produce(bootstrap, msgs)
        produced_s = time.monotonic() - t0
        group = f"rsc1-detect-{os.urandom(4).hex()}"  # never a member left by an earlier run
        detect = Detect(
            [sys.executable, "-m", "fleetwatch.cli", "detect", "--bootstrap", bootstrap, "--group", group,
             "--config", str(work / "detect.toml"), "--metrics-port", "0"],
            env, work / "detect.log",
        )  # fmt: skip
        try:
            wait_consumed(
                bootstrap, group, [topics.TELEMETRY, topics.JOBS, topics.STEPS], args.timeout, detect
            )
        finally:
            detect.stop()
        detect_s = time.monotonic() - t0 - produced_s
        db = work / "accounting.sqlite"
        with open(work / "account.log", "wb") as log:
            r = subprocess.run(
                [sys.executable, "-m", "fleetwatch.cli", "account", "--bootstrap", bootstrap, "--db", str(db),
                 "--idle-exit", "5", "--nodes-topic", "rsc1.no-census"],
                env=env, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout,
            )  # fmt: skip
        if r.returncode != 0:
            raise SystemExit(
                f"fleetwatch account exited {r.returncode}: {(work / 'account.log').read_text()[-2000:]}"
            )
    store = Store(db)
    try:
        figs = report.build(store, cfg.start, cfg.start + cfg.days * 86400 + 86400)
    finally:
        store.close()
    return compare(w, figs, {"produce_s": produced_s, "detect_s": detect_s, "wall_s": time.monotonic() - t0,
                             "messages": len(msgs), "detect_restarts": detect.restarts})  # fmt: skip


def compare(w: Workload, figs: dict[str, Any], timing: dict[str, Any]) -> dict[str, Any]:
    rf = figs["r_f_per_1000_node_days"]
    rows = []
    for row in figs["mttf_by_gpus"]:
        rows.append(
            {
                "gpus": row["gpus"],
                "jobs": row["jobs"],
                "failures": row["failures"],
                "true_h": round(24 * 1000 / (row["mean_nodes"] * w.true_r_f), 3),
                "measured_h": row["mttf_h"],
                "ci_low_h": row["ci_low_h"],
                "ci_high_h": row["ci_high_h"],
            }
        )
    out = {
        "nodes": w.cfg.nodes,
        "days": w.cfg.days,
        "runs": len(w),
        "r_f": {
            "true": round(w.true_r_f, 4),
            "measured": rf["total"],
            "ci_low": rf["ci_low"],
            "ci_high": rf["ci_high"],
            "failures": rf["failures"],
            "node_days": rf["node_days"],
        },
        "mttf_by_gpus": rows,
        "taxonomy": figs["taxonomy"]["by_category"],
        "by_component": {
            "true": _true_components(w),
            "measured": figs["taxonomy"]["infra_failures_by_component"],
        },
        "lemons": {
            "true": [node_name(int(n)) for n in w.lemons],
            "found": [x["node"] for x in figs["lemons"]["lemons"]],
            "before_after": figs["lemons"]["before_after"],
        },
        **{k: round(v, 1) if isinstance(v, float) else v for k, v in timing.items()},
    }
    return out


# the paper's own MTTF figures (Kokolis et al., HPCA 2025; docs/reliability-definitions.md, 3):
# measured at 8 and 1,024 GPUs, projected at 16,384 from RSC-1's r_f
PAPER_MTTF_H = {8: 47.7 * 24, 1024: 7.9}
PAPER_PROJECTED_H = {16384: 1.8}


def plot(out: dict[str, Any], path: Path) -> None:
    """MTTF against job size: measured (with the 95% intervals) and true on the simulator, the
    paper's points beside them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in out["mttf_by_gpus"] if r["measured_h"] is not None]
    g = np.array([r["gpus"] for r in rows], dtype=float)
    m = np.array([r["measured_h"] for r in rows])
    lo = np.array([r["ci_low_h"] for r in rows])
    hi = np.array([r["ci_high_h"] if r["ci_high_h"] is not None else r["measured_h"] for r in rows])
    fig, ax = plt.subplots(figsize=(8, 5))
    grid = np.geomspace(1, 16384, 60)
    rf = out["r_f"]["true"]
    ax.plot(grid, 24 * 1000 / (np.maximum(grid / 8, 1) * rf), "-", color="grey",
            label=f"simulator's truth: 1 / (nodes x r_f), r_f = {rf:g}")  # fmt: skip
    ax.errorbar(
        g, m, yerr=[m - lo, hi - m], fmt="o", capsize=3, label="measured through the pipeline (95% CI)"
    )
    ax.plot(list(PAPER_MTTF_H), list(PAPER_MTTF_H.values()), "s", color="C3", label="paper, measured (RSC-1)")
    ax.plot(list(PAPER_PROJECTED_H), list(PAPER_PROJECTED_H.values()), "D", color="C3", mfc="none",
            label="paper, projected at 16,384 GPUs")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("job size (GPUs)")
    ax.set_ylabel("job MTTF (hours)")
    ax.set_title(f"RSC-1-like cluster, {out['nodes']} nodes, {out['days']:g} days (benchmarks/rsc1.py)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)


def _true_components(w: Workload) -> dict[str, int]:
    comps, counts = np.unique(w.component[w.component != None].astype(str), return_counts=True)  # noqa: E711
    return {str(c): int(n) for c, n in zip(comps, counts, strict=True)}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--days", type=float, default=28.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--r-f", type=float, default=6.5, help="true failures per 1000 node-days (RSC-1: 6.5)")
    ap.add_argument("--lemon-fraction", type=float, default=0.0)
    ap.add_argument("--lemon-multiplier", type=float, default=rates.LEMON_RATE_MULTIPLIER)
    ap.add_argument("--broker-port", type=int, default=19692)
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep", default=None, help="keep the logs and the store in this directory")
    ap.add_argument("--plot", default=None, help="write the MTTF-by-size plot here (SVG or PNG)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
        out = run(args, Path(args.keep))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            out = run(args, Path(tmp))
    if args.plot:
        plot(out, Path(args.plot))
    if args.json:
        print(json.dumps(out))
    else:
        print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
