"""One detect worker draining a telemetry topic through the real broker, compared across two
releases: the rate at which a `Worker` with the node stage works through a zstd topic of
1,024 nodes x --ticks samples that is already there, from its partitions' assignment to the last
record.

Each run is a process of its own. --python/--cwd run the B side with another interpreter and tree
(e.g. a worktree of the commit before, installed in a second venv): the member mode of this file is
run from that tree, so it measures that tree's `fleetwatch`. Runs alternate A B A B ... (this
machine's speed drifts) and the ratio is per pair. --profile DIR writes each run's cProfile, to
compare where the time goes function by function (profiling slows both sides alike).

    python -m benchmarks.worker_drain [--python OTHER --cwd OTHER_REPO] [--pairs 6] [--json]
"""

from __future__ import annotations

import argparse
import cProfile
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BOOTSTRAP = os.environ.get("FLEETWATCH_BOOTSTRAP", "127.0.0.1:19092")


def produce(bootstrap: str, ticks: int) -> tuple[str, int]:
    """A fresh zstd telemetry topic holding 1,024 nodes x ticks samples."""
    from benchmarks.detect_throughput import generate
    from fleetwatch import schemas
    from fleetwatch.bus.admin import ensure_topics
    from fleetwatch.bus.kafka import KafkaBus

    topic = f"bench.drain.{uuid.uuid4().hex[:8]}"
    ensure_topics(bootstrap, [topic])
    msgs = generate(1024, ticks, 1)
    producer = KafkaBus(bootstrap).producer(options={"compression.type": "zstd"})
    for m in msgs:
        producer.send(topic, key=m["node"].encode(), value=schemas.encode(m))
    if producer.flush(600):
        raise SystemExit(f"{topic}: not every message was acknowledged")
    producer.close()
    return topic, len(msgs)


def member(bootstrap: str, topic: str, total: int, profile: str | None) -> dict[str, float]:
    """Drain the topic with one Worker of this interpreter's fleetwatch (run from its tree)."""
    from fleetwatch import schemas
    from fleetwatch.pipeline import telemetry_decode
    from fleetwatch.pipeline.job_table import JobTable
    from fleetwatch.pipeline.node_stage import NodeTask
    from fleetwatch.pipeline.tasks import Stage
    from fleetwatch.pipeline.worker import Worker

    jobs = JobTable()
    kw: dict[str, Any] = {
        "name": "drain",
        "inputs": (topic,),
        "schemas": {topic: schemas.TELEMETRY},
        "new_task": lambda _p: NodeTask(jobs),
        "load_task": lambda _p, raw: NodeTask.from_bytes(raw, jobs),
        "warm_up": NodeTask.warm_up,
    }
    params = inspect.signature(Stage).parameters
    if "decoders" in params:  # since issue 24: one decoder per input topic
        kw["decoders"] = {topic: telemetry_decode.decode_telemetry}
    else:  # the release before it: a flag for the scanner
        kw["columnar_telemetry"] = True
    worker = Worker(bootstrap, f"bench-drain-{uuid.uuid4().hex[:6]}", [Stage(**kw)], snapshot_every_s=3600)
    done = 0
    while not worker.consumer.assignment():  # the join; what comes with it is counted, not timed
        done += worker.step(timeout_ms=50)
    prof = cProfile.Profile() if profile else None
    t0, c0 = time.perf_counter(), time.process_time()
    if prof:
        prof.enable()
    timed = done
    while done < total:
        done += worker.step()
    if prof:
        prof.disable()
        prof.dump_stats(profile)
    t1, c1 = time.perf_counter(), time.process_time()
    worker.close()
    n = done - timed
    return {"per_s": n / (t1 - t0), "cpu_us_per_msg": (c1 - c0) / n * 1e6, "msgs": n}


def _run(python: str, cwd: str, topic: str, total: int, profile: str | None) -> dict[str, float]:
    argv = [python, str(REPO / "benchmarks" / "worker_drain.py"), "--member", topic, str(total)]
    argv += ["--bootstrap", BOOTSTRAP] + (["--profile-file", profile] if profile else [])
    r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600, check=False)
    if r.returncode:
        raise SystemExit(f"{python} in {cwd} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", default=BOOTSTRAP)
    ap.add_argument("--ticks", type=int, default=80)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--python", default=None, help="the B side's interpreter (default: A's again)")
    ap.add_argument("--cwd", default=None, help="the B side's tree (default: this one)")
    ap.add_argument("--profile", default=None, help="write each run's cProfile into this folder")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--member", nargs=2, metavar=("TOPIC", "TOTAL"), help=argparse.SUPPRESS)
    ap.add_argument("--profile-file", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.member:
        sys.path.insert(0, os.getcwd())  # the tree the run was started in, not this file's
        print(json.dumps(member(args.bootstrap, args.member[0], int(args.member[1]), args.profile_file)))
        return 0
    from fleetwatch.bus.admin import Admin

    topic, total = produce(args.bootstrap, args.ticks)
    sides = {"A": (sys.executable, str(REPO)), "B": (args.python or sys.executable, args.cwd or str(REPO))}
    runs: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    try:
        for i in range(args.pairs):
            for side in ("A", "B") if i % 2 == 0 else ("B", "A"):  # who goes first alternates too
                prof = str(Path(args.profile) / f"{side}{i}.prof") if args.profile else None
                runs[side].append(_run(*sides[side], topic, total, prof))
    finally:
        with Admin(args.bootstrap) as admin:
            admin.delete_topics([topic])
    ratios = [a["per_s"] / b["per_s"] for a, b in zip(runs["A"], runs["B"], strict=True)]
    result = {
        "msgs": total,
        "A_per_s": [round(r["per_s"]) for r in runs["A"]],
        "B_per_s": [round(r["per_s"]) for r in runs["B"]],
        "A_cpu_us_per_msg": [round(r["cpu_us_per_msg"], 1) for r in runs["A"]],
        "B_cpu_us_per_msg": [round(r["cpu_us_per_msg"], 1) for r in runs["B"]],
        "ratio_per_pair": [round(x, 3) for x in ratios],
        "ratio_median": round(statistics.median(ratios), 3),
        "ratio_mean": round(statistics.fmean(ratios), 3),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
