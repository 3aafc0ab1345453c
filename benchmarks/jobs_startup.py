"""Worker start-up against a year of job history (issue 16, part 3): fleet.jobs.v1 is compacted by
job and the job publisher tombstones each job once its end is older than topics.JOB_HISTORY_S, so
the topic a starting worker reads holds about one window of jobs, not every job ever run.

Two histories, each on its own topic of a fresh private broker (port --broker-port, emptied at
start, stopped at the end):
- large: --large jobs (1,000,000, a year of a busy cluster, ~2,700 a day). Those older than the
  window (all but the last large x 7/365, ~19,200) are tombstoned, as the publisher would.
- small: --small jobs (1,000, a young cluster, all within the window: nothing tombstoned).
Each job is written as the publisher writes it: a `started` and a `finished` (every tenth
`failed`) job/1 record, key = job id, on 1-64 of 1,024 nodes, ts = now (so the worker's clock
check against the broker's LogAppendTime passes); then, in time order, a tombstone (key = job,
value null) for each job older than the window, written when the job a window younger ends.
The bus's producer batches the writes (linger 50 ms, acks=1, no idempotence).

The topics carry the compaction settings of fleet.jobs.v1 (cleanup.policy=compact, LogAppendTime)
plus topic-level settings that make the cleaner run within a minute instead of hours:
segment.ms 10 s, 16 MB segments, min.cleanable.dirty.ratio 0.01, delete.retention.ms 1 s (how
long a tombstone outlives the records it deletes; 24 h in production), max.compaction.lag.ms 10 s.
Compaction is held back (min.compaction.lag.ms = 1 h) until writing ends, so the "before" size is
the whole history; then released. The active segment is never cleaned, so the benchmark appends
a tombstone of job 0 (no job: Slurm's ids start at 1) to every partition each segment.ms to roll
it, until the topic is what a production one holds: its record bytes on disk (.log files) within
1.3x of what the retained records need, and at most a day's tombstones (a seventh of the window's
jobs: production keeps a tombstone for delete.retention.ms, 24 h), counted by reading the topic;
or until --compaction-timeout passes (exit 1, saying so). A tombstone is kept through the cleaning
pass that removes its job's records and dropped by a later one, so this takes two passes.

Then, in a fresh subprocess each (so its RSS is its own), alternating small and large, --repeat
times after one discarded warm-up run of each kind:
- follower: `JobTableFollower` from process start to caught_up (interpreter start and imports
  included), and its own read time (start() to caught_up);
- worker: what `fleetwatch detect` does before its first sample (pipeline/detect.run: broker check,
  ensure_topics, the job table followed to caught_up, the Worker with both stages and their warm-up
  of the compiled kernels, group join in a fresh group) to its first processed telemetry sample
  (a few are on the private broker's telemetry topic), from process start.
Peak RSS (VmHWM) of each. The subprocess points topics.JOBS at the benchmark's topic before it
imports the pipeline (every reader takes the name from there at run time).

Ratios large / small of the medians; exit 1 when the worker's start-up (from process start to its
first sample) with the large history is more than 2x the small one's (issue 16's target). The
follower's figures are printed beside it: its read is proportional to the jobs the topic keeps
(one window's, 19x more in the large history than in the small one), not to the history.

With --uncompacted, also the large history as the topic held it before issue 16 (every record,
nothing compacted or tombstoned) and one follower start-up on it, for comparison.

    python benchmarks/jobs_startup.py [--large 1000000] [--small 1000] [--repeat 3] [--uncompacted]
                                      [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: the repo's packages
    sys.path.insert(0, str(REPO))

NODES = [f"gpu-node-{i:04d}" for i in range(1, 1025)]
SIZES = [1] * 12 + [2] * 3 + [4] * 2 + [8] * 2 + [64]  # nodes per job, cycled: mean 5.3
FAIL_EVERY = 10
PARTITIONS = 4
YEAR_S = 365 * 86400.0
SEGMENT_MS = 10_000
TARGET_RATIO = 2.0

BENCH_CONFIGS = {
    "segment.ms": str(SEGMENT_MS),
    "segment.bytes": str(16 << 20),
    "min.cleanable.dirty.ratio": "0.01",
    "delete.retention.ms": "1000",
    "min.compaction.lag.ms": "3600000",  # held until the history is written (see release)
}
RELEASE = {"min.compaction.lag.ms": "0", "max.compaction.lag.ms": str(SEGMENT_MS)}


def log(msg: str) -> None:
    print(f"[jobs_startup] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ the private broker


@contextlib.contextmanager
def private_broker(port: int, keep: bool) -> Iterator[tuple[str, Path]]:
    """A fresh broker of our own on `port` (emptied first), stopped on the way out: the history
    written here (hundreds of MB) never reaches the shared broker other runs use."""
    env = {
        **os.environ,
        "KAFKA_PORT": str(port),
        "KAFKA_CONTROLLER_PORT": str(port + 1),
        "KAFKA_HEAP": os.environ.get("KAFKA_HEAP", "768m"),
    }
    home = Path(os.environ.get("FLEETWATCH_HOME", REPO / ".fleetwatch"))
    data = home / f"kafka-{port}"
    script = str(REPO / "services/kafka/kafka.sh")
    subprocess.run(["bash", script, "stop"], env=env, capture_output=True, timeout=120)
    shutil.rmtree(data, ignore_errors=True)
    r = subprocess.run(["bash", script, "start"], env=env, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"kafka.sh start on port {port} failed: {r.stderr.strip()[-500:]}")
    try:
        yield f"127.0.0.1:{port}", data / "logs"
    finally:
        if not keep:
            subprocess.run(["bash", script, "stop"], env=env, capture_output=True, timeout=120)
            shutil.rmtree(data, ignore_errors=True)


def log_bytes(logs: Path, topic: str) -> int:
    """The topic's record bytes on disk: its partitions' .log segment files (not the indexes,
    which are preallocated, nor segments the cleaner has replaced and not yet deleted)."""
    return sum(f.stat().st_size for d in logs.glob(f"{topic}-*") for f in d.glob("*.log"))


# ------------------------------------------------------------------ writing a history


def job_nodes(i: int) -> list[str]:
    size = SIZES[i % len(SIZES)]
    start = (i * 37) % len(NODES)
    return [NODES[(start + k) % len(NODES)] for k in range(size)]


def write_history(
    bootstrap: str, topic: str, n_jobs: int, n_old: int, configs: dict[str, str] | None = None
) -> dict[str, Any]:
    """Every job's started and ended record, and a tombstone for each of the n_old oldest, in the
    order the publisher writes them, to a new topic with `configs` (default: fleet.jobs.v1's and
    BENCH_CONFIGS). Returns counts and the bytes the retained records need."""
    import orjson

    from fleetwatch import schemas, topics
    from fleetwatch.bus.admin import Admin, topic_configs
    from fleetwatch.bus.kafka import KafkaBus

    with Admin(bootstrap) as admin:
        admin.create_topics(
            [topic], PARTITIONS, 1, {topic: configs or {**topic_configs(topics.JOBS), **BENCH_CONFIGS}}
        )
    # the fastest writer (one broker acknowledgement, no idempotence): the history is set-up, not measured
    producer = KafkaBus(bootstrap).producer(linger_ms=50, idempotent=False, options={"acks": 1})
    window = n_jobs - n_old  # the youngest jobs: within JOB_HISTORY_S, kept
    keys = [f"{i + 1}".encode() for i in range(n_jobs)]  # Slurm's numeric job ids
    kept_bytes = records = tombstones = 0
    t0 = time.perf_counter()
    checked = 0
    for i in range(n_jobs):
        job, nodes, now = keys[i].decode(), job_nodes(i), time.time()
        end = "failed" if i % FAIL_EVERY == FAIL_EVERY - 1 else "finished"
        for state in ("started", end):
            value = orjson.dumps({"schema": "job/1", "job": job, "nodes": nodes, "state": state, "ts": now})
            if checked < 64:  # valid as the worker and the job table decode it
                schemas.decode(value, schemas.JOB, key=keys[i], ref_ts=now, clock=schemas.DEFAULT_CLOCK)
                checked += 1
            producer.send(topic, key=keys[i], value=value)
            records += 1
        if i >= n_old:
            kept_bytes += len(keys[i]) + len(value) + 12  # + a record's varints and attributes
        old = i - window  # the job a window older than this one: its end has left the window
        if 0 <= old < n_old:
            producer.send(topic, key=keys[old], value=None)
            tombstones += 1
        if i and i % 200_000 == 0:
            log(f"{topic}: {i:,} jobs written ({i / (time.perf_counter() - t0):,.0f} jobs/s)")
    failed = producer.flush(600)
    producer.close()
    if failed:
        raise SystemExit(f"{len(failed)} records of the history of {topic} were not acknowledged")
    return {
        "jobs": n_jobs,
        "tombstoned": n_old,
        "kept": window,
        "records": records,
        "tombstones": tombstones,
        "kept_bytes_est": kept_bytes,
        "write_s": round(time.perf_counter() - t0, 1),
    }


def compact(
    bootstrap: str, logs: Path, topic: str, kept: int, kept_bytes: int, timeout_s: float
) -> dict[str, Any]:
    """Release compaction and roll the active segments until the cleaner has made the topic what a
    production topic holds: the retained records (their bytes on disk within 1.3x of what they
    need) and no more tombstones than a day's (delete.retention.ms' default, 24 h: a seventh of the
    window's jobs). Returns its size before and after, and what a reader gets from it then."""
    from fleetwatch.bus.admin import Admin
    from fleetwatch.bus.kafka import KafkaBus

    before = log_bytes(logs, topic)
    with Admin(bootstrap) as admin:
        admin.alter_configs(topic, dict(RELEASE))
    target = int(1.3 * kept_bytes) + PARTITIONS * 16 * 1024  # batch headers, the fillers
    max_tombstones = max(64, kept // 7)
    producer = KafkaBus(bootstrap).producer(idempotent=False, options={"acks": 1})
    t0 = shown = next_roll = time.monotonic()
    size, after = before, None
    try:
        while True:
            if time.monotonic() >= next_roll:
                if size <= target:  # small enough: count what a reader would get, once per roll
                    after = count(bootstrap, topic)
                    if after["tombstones"] <= max_tombstones:
                        break
                # a tombstone of job 0 (Slurm's ids start at 1: no job) closes every partition's
                # active segment, which the cleaner never touches, once segment.ms has passed
                for p in range(PARTITIONS):
                    producer.send(topic, key=b"0", value=None, partition=p)
                producer.flush(30)
                next_roll = time.monotonic() + SEGMENT_MS / 1000 + 1
            if time.monotonic() - t0 > timeout_s:
                raise SystemExit(
                    f"compaction of {topic} did not finish within {timeout_s:.0f} s: its records "
                    f"take {size:,} bytes on disk (were {before:,}; the retained ones need about "
                    f"{kept_bytes:,}), {after or 'not counted yet'} (at most {max_tombstones} "
                    "tombstones wanted). Is the broker's log cleaner running (log.cleaner.enable)? "
                    f"See {logs.parent / 'server.log'}."
                )
            if time.monotonic() - shown >= 15:
                shown = time.monotonic()
                log(f"{topic}: {size:,} bytes on disk, compacting to about {target:,}")
            time.sleep(1.0)
            size = log_bytes(logs, topic)
    finally:
        producer.close()
    return {
        "bytes_before": before,
        "bytes_after": size,
        "compaction_s": round(time.monotonic() - t0, 1),
        "after": after,
    }


def count(bootstrap: str, topic: str) -> dict[str, int]:
    """What a reader from the beginning gets now: records with a value, and tombstones."""
    from fleetwatch.bus import TopicPart
    from fleetwatch.bus.kafka import KafkaBus

    reader = KafkaBus(bootstrap).reader()
    try:
        tps = [TopicPart(topic, p) for p in range(PARTITIONS)]
        reader.assign(tps, "beginning")
        end = reader.end_offsets(tps)
        values = stones = 0
        while any(reader.position(tp) < end[tp] for tp in tps):
            for r in reader.poll(0.5):
                if r.value is None:
                    stones += 1
                else:
                    values += 1
        return {"values": values, "tombstones": stones}
    finally:
        reader.close()


def telemetry(bootstrap: str) -> None:
    """A few valid samples on the private broker's telemetry topic: the worker's first input."""
    import orjson

    from fleetwatch import topics
    from fleetwatch.bus.admin import ensure_topics
    from fleetwatch.bus.kafka import KafkaBus

    ensure_topics(bootstrap)
    producer = KafkaBus(bootstrap).producer()
    for node in NODES[:8]:
        gpus = [{"index": g, "util": 90.0, "temp_c": 60.0, "xids": []} for g in range(8)]
        msg = {"schema": "telemetry/1", "node": node, "ts": time.time(), "seq": 1, "gpus": gpus}
        producer.send(topics.TELEMETRY, key=node.encode(), value=orjson.dumps(msg))
    producer.flush(30)
    producer.close()


# ------------------------------------------------------------------ one start-up, in a fresh process


def peak_rss_mb() -> float:
    """This process's peak resident set size (VmHWM). Not ru_maxrss: Linux carries that across
    exec from the parent, whose peak (writing the history) it would report instead."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def child(args: argparse.Namespace) -> None:
    """One start-up; prints one JSON line. t0 is the parent's clock just before it started us."""
    from fleetwatch import topics

    topics.JOBS = args.topic  # before the pipeline is imported: every reader takes it from here
    from fleetwatch import schemas
    from fleetwatch.bus import Record
    from fleetwatch.bus.admin import ensure_topics, wait_for_broker
    from fleetwatch.bus.kafka import KafkaBus
    from fleetwatch.pipeline.job_table import JobTable, JobTableFollower

    class Counting(JobTableFollower):
        values = stones = 0

        def apply_record(self, record: Record, now: float) -> None:
            if record.value is None:
                self.stones += 1
            else:
                self.values += 1
            super().apply_record(record, now)

    out: dict[str, Any] = {"mode": args.child, "topic": args.topic}
    if args.child == "worker":  # as pipeline/detect.run, up to the worker's loop
        wait_for_broker(args.bootstrap)
        ensure_topics(args.bootstrap)
    table = JobTable()
    follower = Counting(table, KafkaBus(args.bootstrap), schemas.DEFAULT_CLOCK)
    t_follow = time.perf_counter()
    follower.start()
    if not follower.caught_up.wait(600):
        raise SystemExit("the job table follower did not catch up within 600 s")
    out["follower_read_s"] = time.perf_counter() - t_follow
    out["caught_up_s"] = time.time() - args.t0
    out["applied"] = {"values": follower.values, "tombstones": follower.stones}
    out["table"] = {"running": len(table._job_nodes), "failed": len(table.failed_jobs)}
    if args.child == "worker":
        from fleetwatch.pipeline import worker as worker_mod
        from fleetwatch.pipeline.detect import stages

        group = f"jobs-startup-{uuid.uuid4().hex[:8]}"
        w = worker_mod.Worker(
            args.bootstrap, group, stages(table), snapshot_every_s=3600, start_at="earliest"
        )
        from prometheus_client import REGISTRY

        consumed = {"group": group, "topic": topics.TELEMETRY}
        deadline = time.monotonic() + 120
        while not REGISTRY.get_sample_value("fleetwatch_worker_messages_total", consumed):
            if time.monotonic() > deadline:
                raise SystemExit("the worker processed no telemetry within 120 s")
            w.step()
        out["first_sample_s"] = time.time() - args.t0
        w.close()
    follower.stop()
    out["peak_rss_mb"] = peak_rss_mb()
    print(json.dumps(out), flush=True)


def start_once(bootstrap: str, mode: str, topic: str) -> dict[str, Any]:
    t0 = time.time()
    r = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            mode,
            "--topic",
            topic,
            "--bootstrap",
            bootstrap,
            "--t0",
            repr(t0),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if r.returncode != 0:
        raise SystemExit(f"{mode} start-up on {topic} failed: {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def uncompacted(bootstrap: str, logs: Path, n_jobs: int) -> dict[str, Any]:
    """The large history as the jobs topic held it before issue 16 (every record of every job,
    cleanup.policy=delete with a retention longer than the history), and one follower start-up on
    it. Its records' ts are all recent, so the table keeps up to MAX_FAILED of the failures (on a
    real topic, only the last JOB_HISTORY_S's): its RSS says little, its time what it says."""
    topic = f"bench.jobs.{n_jobs}.uncompacted"
    log(f"uncompacted: writing {n_jobs:,} jobs to {topic}")
    cfg = {"message.timestamp.type": "LogAppendTime", "retention.ms": "-1", "segment.bytes": str(16 << 20)}
    h = write_history(bootstrap, topic, n_jobs, 0, cfg)
    h["bytes"] = log_bytes(logs, topic)
    h["follower"] = start_once(bootstrap, "follower", topic)
    log(f"uncompacted: {json.dumps(h)}")
    return h


# ------------------------------------------------------------------ main


def median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--large", type=int, default=1_000_000, help="jobs in the large history")
    ap.add_argument("--small", type=int, default=1_000, help="jobs in the small history (all kept)")
    ap.add_argument("--repeat", type=int, default=3, help="timed start-ups of each kind and history")
    ap.add_argument("--broker-port", type=int, default=19492, help="port of the private broker (and +1)")
    ap.add_argument("--compaction-timeout", type=float, default=300.0)
    ap.add_argument("--keep-broker", action="store_true", help="leave the private broker running")
    ap.add_argument(
        "--uncompacted",
        action="store_true",
        help="also time one follower start-up on the large history as before issue 16 (nothing compacted)",
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", choices=("follower", "worker"), help=argparse.SUPPRESS)
    ap.add_argument("--topic", help=argparse.SUPPRESS)
    ap.add_argument("--bootstrap", help=argparse.SUPPRESS)
    ap.add_argument("--t0", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0

    from fleetwatch import topics

    window = topics.JOB_HISTORY_S / YEAR_S
    histories = {
        "small": (f"bench.jobs.{args.small}", args.small, 0),
        "large": (f"bench.jobs.{args.large}", args.large, args.large - round(args.large * window)),
    }
    report: dict[str, Any] = {"histories": {}, "runs": {}}
    with private_broker(args.broker_port, args.keep_broker) as (bootstrap, logs):
        telemetry(bootstrap)
        for name, (topic, n_jobs, n_old) in histories.items():
            log(f"{name}: writing {n_jobs:,} jobs ({n_old:,} tombstoned) to {topic}")
            h = write_history(bootstrap, topic, n_jobs, n_old)
            log(f"{name}: {h['records'] + h['tombstones']:,} records in {h['write_s']} s; compacting")
            h |= compact(bootstrap, logs, topic, h["kept"], h["kept_bytes_est"], args.compaction_timeout)
            log(
                f"{name}: {h['bytes_before']:,} -> {h['bytes_after']:,} bytes in {h['compaction_s']} s; "
                f"left {h['after']['values']:,} records, {h['after']['tombstones']:,} tombstones"
            )
            report["histories"][name] = h
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {
            m: {"small": [], "large": []} for m in ("follower", "worker")
        }
        for mode in ("follower", "worker"):
            for i in range(args.repeat + 1):  # the first round warms caches and is dropped
                for name in ("small", "large") if i % 2 == 0 else ("large", "small"):
                    r = start_once(bootstrap, mode, histories[name][0])
                    log(f"{mode} {name}{' (warm-up)' if i == 0 else ''}: {json.dumps(r)}")
                    if i:
                        runs[mode][name].append(r)
        report["runs"] = runs
        if args.uncompacted:
            report["uncompacted"] = uncompacted(bootstrap, logs, args.large)

    summary: dict[str, Any] = {}
    failed = []
    for mode, key in (("follower", "caught_up_s"), ("worker", "first_sample_s")):
        s, lg = runs[mode]["small"], runs[mode]["large"]
        row = {
            "small_s": median(s, key),
            "large_s": median(lg, key),
            "small_rss_mb": median(s, "peak_rss_mb"),
            "large_rss_mb": median(lg, "peak_rss_mb"),
            "small_read_s": median(s, "follower_read_s"),
            "large_read_s": median(lg, "follower_read_s"),
        }
        row["ratio"] = row["large_s"] / row["small_s"]
        row["rss_ratio"] = row["large_rss_mb"] / row["small_rss_mb"]
        summary[mode] = row
        if mode == "worker" and row["ratio"] > TARGET_RATIO:
            failed.append(f"worker start-up {row['ratio']:.2f}x")
    report["summary"] = summary
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for name, h in report["histories"].items():
            print(
                f"{name:>5} history: {h['jobs']:>9,} jobs, {h['tombstoned']:>7,} tombstoned; "
                f"{h['records']:,} records + {h['tombstones']:,} tombstones written in {h['write_s']} s; "
                f"on disk {h['bytes_before'] / 1e6:,.1f} MB -> {h['bytes_after'] / 1e6:,.2f} MB after "
                f"compaction ({h['compaction_s']} s); left {h['after']['values']:,} records, "
                f"{h['after']['tombstones']:,} tombstones"
            )
        print(f"\nmedian of {args.repeat} start-ups each (fresh process; from process start):")
        print(f"{'':<10} {'small s':>8} {'large s':>8} {'ratio':>6} {'read small':>11} {'read large':>11} "
              f"{'RSS small':>10} {'RSS large':>10} {'ratio':>6}")  # fmt: skip
        for mode, row in summary.items():
            what = "follower" if mode == "follower" else "worker"
            print(
                f"{what:<10} {row['small_s']:>8.2f} {row['large_s']:>8.2f} {row['ratio']:>5.2f}x "
                f"{row['small_read_s']:>10.3f}s {row['large_read_s']:>10.3f}s "
                f"{row['small_rss_mb']:>8.0f}MB {row['large_rss_mb']:>8.0f}MB {row['rss_ratio']:>5.2f}x"
            )
        print("(follower: to caught_up; worker: to its first processed sample; read: the follower's own")
        print(" read of the topic, start() to caught_up)")
        u = report.get("uncompacted")
        if u:
            f = u["follower"]
            print(
                f"\nbefore issue 16 (not compacted, no tombstones): {u['records']:,} records, "
                f"{u['bytes'] / 1e6:,.1f} MB on disk; follower caught up {f['caught_up_s']:.1f} s from "
                f"process start (read {f['follower_read_s']:.1f} s), peak RSS {f['peak_rss_mb']:.0f} MB"
            )
    if failed:
        print(f"TARGET MISSED (large within {TARGET_RATIO}x of small): {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
