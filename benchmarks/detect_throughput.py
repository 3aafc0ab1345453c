"""Detector throughput in node-samples per second on one core, against a naive baseline
measured in the same run, and end to end through the real local Kafka broker.

A node-sample is one telemetry/1 message of 8 GPUs. The messages come from the simulator
(scale.yaml: background faults at published rates) and are generated before timing starts.

- fleetwatch: the per-node stage (pipeline/node_stage.py: batch decode into numpy, hardware
  rules, silence, lemon, node features) on batches of --batch messages.
- from raw bytes: the same stage fed from the encoded messages, decoded as the worker decodes
  them (pipeline/telemetry_decode.py: the compiled scanner straight into columns) against the
  previous path (msgspec into structs, then columns), both in the same run.
- baseline: the naive design, per sample and per metric, one river anomaly model per
  (node, GPU, metric) with score_one + learn_one (river.anomaly.StandardAbsoluteDeviation).
- kafka (with --kafka): the same messages produced to a fresh topic; the raw consume rate of 1
  and of n plain kafka-python consumers (processes splitting the partitions; before and after
  the workers), then for each --workers count n a consumer group of n detect Worker processes
  (decode + validate + detect + produce findings + commit) over the same messages. Both are timed
  while all n members work (for a group, from its last rebalance), up to the first member that
  runs out of messages. Prints each group's rate over the mean raw rate of n consumers (like for
  like) and of one, and the machine's idle CPU share in each timed span.

    python benchmarks/detect_throughput.py [--nodes 1024] [--ticks 80] [--batch 1000] [--kafka]
"""

from __future__ import annotations

import argparse
import bisect
import json
import multiprocessing
import os
import sys
import threading
import time
import uuid
from typing import Any

from fleetwatch import topics
from fleetwatch.collectors.sim import Simulation, load_scenario, packaged_path
from fleetwatch.runtime import gc_paused

# run as a script: benchmarks.kafka_clients (the kafka-python baseline's settings) is importable
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def generate(nodes: int, ticks: int, seed: int) -> list[dict[str, Any]]:
    overrides = {"nodes": nodes, "duration_s": ticks, "seed": seed}
    sim = Simulation(load_scenario(str(packaged_path("scale.yaml")), overrides))
    return [m for msgs in sim.ticks() for t, _k, m in msgs if t == topics.TELEMETRY]


def bench_fleetwatch(msgs: list[dict[str, Any]], batch: int) -> float:
    from fleetwatch.detectors.batch import TelemetryBatch
    from fleetwatch.pipeline.job_table import JobTable
    from fleetwatch.pipeline.node_stage import NodeTask

    NodeTask.warm_up()
    task = NodeTask(JobTable())
    t0 = time.process_time()
    with gc_paused():  # as pipeline/worker.py runs each batch
        for i in range(0, len(msgs), batch):
            task.process(topics.TELEMETRY, TelemetryBatch.from_messages(msgs[i : i + batch]))
    return len(msgs) / (time.process_time() - t0)


def bench_decode_and_stage(raws: list[bytes], batch: int, columnar: bool) -> float:
    """Raw telemetry/1 bytes -> findings, as the worker runs it minus Kafka: decoded by the
    compiled scanner straight into columns (columnar) or by msgspec into structs, then the
    per-node stage. Node-samples per second of CPU time."""
    import contextlib

    from fleetwatch.pipeline import telemetry_decode
    from fleetwatch.pipeline.job_table import JobTable
    from fleetwatch.pipeline.node_stage import NodeTask

    NodeTask.warm_up()
    task = NodeTask(JobTable())
    # the broker's time for every record (RecordBlock.reference_times): after every simulated
    # sample, as in a live worker. (It was 0.0, the epoch: each sample then stood 56 years ahead of
    # its broker time, a clock jump, and the clock detector's findings cost two thirds of the time.)
    now = time.time()
    t0 = time.process_time()
    decoders = contextlib.nullcontext() if columnar else telemetry_decode.message_decoders_only()
    with gc_paused(), decoders:
        for i in range(0, len(raws), batch):
            msgs, _bad = telemetry_decode.decode_telemetry(raws[i : i + batch], now=now, clock=None)
            task.process(topics.TELEMETRY, msgs)
    return len(raws) / (time.process_time() - t0)


def bench_baseline(msgs: list[dict[str, Any]], nodes: int) -> float:
    """Steady state: the models of `nodes` nodes are built on their first sample (not timed),
    then their remaining samples are timed. Per-sample cost does not depend on the node count."""
    from river import anomaly

    from fleetwatch.detectors.batch import GPU_NUMERIC

    keep = sorted({m["node"] for m in msgs})[:nodes]
    mine = [m for m in msgs if m["node"] in set(keep)]
    models: dict[tuple[str, int, str], Any] = {}
    with gc_paused():  # the same advantage as the worker's
        _naive(mine[: len(keep)], models, anomaly, GPU_NUMERIC)  # warm-up: one sample per node
        t0 = time.process_time()
        _naive(mine[len(keep) :], models, anomaly, GPU_NUMERIC)
        dt = time.process_time() - t0
    return (len(mine) - len(keep)) / dt


def _naive(
    msgs: list[dict[str, Any]], models: dict[tuple[str, int, str], Any], anomaly: Any, fields: Any
) -> None:
    for m in msgs:
        node = m["node"]
        for g in m["gpus"]:
            for f in fields:
                v = g.get(f)
                if v is None:
                    continue
                key = (node, g["index"], f)
                model = models.get(key)
                if model is None:
                    model = models[key] = anomaly.StandardAbsoluteDeviation()
                y = float(v)
                model.score_one(None, y)
                model.learn_one(None, y)


_Sample = tuple[float, int, int, int]  # (time, idle + iowait ticks, all ticks, broker ticks)


class CpuUse:
    """Samples the machine's CPU counters (/proc/stat), and the local broker's own (its
    /proc/<pid>/stat, where the broker runs on this machine), every 50 ms in a thread, so that CPU
    use can be read over any span timed by the child processes (time.perf_counter is
    CLOCK_MONOTONIC, one clock for every process). An idle share near 0 means the run was bound by
    this machine's cores: broker, clients and workers all share them; the CPU time per message,
    the whole machine's and the broker's, says where it went."""

    def __init__(self, broker_pid: int | None) -> None:
        self.samples: list[_Sample] = []
        self.broker_pid = broker_pid
        self._hz = os.sysconf("SC_CLK_TCK")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _read(self) -> tuple[int, int, int]:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
        broker = 0
        if self.broker_pid is not None:
            try:
                with open(f"/proc/{self.broker_pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                broker = int(fields[11]) + int(fields[12])  # utime + stime (fields 14, 15)
            except OSError:
                self.broker_pid = None
        # user nice system idle iowait irq softirq steal
        return ticks[3] + ticks[4], sum(ticks[:8]), broker

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.perf_counter(), *self._read()))
            self._stop.wait(0.05)

    def __enter__(self) -> CpuUse:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _span(self, t0: float, t1: float) -> tuple[_Sample, _Sample] | None:
        """The samples nearest inside [t0, t1], None if the span holds fewer than two."""
        times = [t for t, *_rest in self.samples]
        a, b = bisect.bisect_left(times, t0), bisect.bisect_right(times, t1) - 1
        if b <= a or self.samples[b][2] <= self.samples[a][2]:
            return None
        return self.samples[a], self.samples[b]

    def over(self, t0: float, t1: float, records: int) -> dict[str, float]:
        """Over [t0, t1], in which `records` were read: the idle share of all CPUs, and the CPU
        time per record in microseconds of the whole machine (busy) and of the broker (NaN where
        the span is too short or the broker is not local)."""
        span = self._span(t0, t1)
        if span is None or records <= 0:
            return {"idle": float("nan"), "machine_us": float("nan"), "broker_us": float("nan")}
        (ta, ia, na, ba), (tb, ib, nb, bb) = span
        idle = (ib - ia) / (nb - na)
        cpus = os.cpu_count() or 1
        # the sampled span is within [t0, t1]: scale its records to it
        k = records * (tb - ta) / (t1 - t0)
        busy = (1 - idle) * cpus * (tb - ta)
        broker = (bb - ba) / self._hz if self.broker_pid is not None else float("nan")
        return {"idle": idle, "machine_us": busy / k * 1e6, "broker_us": broker / k * 1e6}


def local_broker_pid(bootstrap: str) -> int | None:
    """The pid of the broker services/kafka/kafka.sh started for this bootstrap's port, if it
    runs on this machine (its command line names its data directory, kafka-<port>)."""
    port = bootstrap.split(",")[0].rsplit(":", 1)[-1]
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ")
        except OSError:
            continue
        if b"kafka.Kafka" in cmd and f"kafka-{port}/".encode() in cmd:
            return int(entry)
    return None


def bench_kafka(
    msgs: list[dict[str, Any]], bootstrap: str, workers: list[int], compression: str = "none"
) -> dict[str, float]:
    from fleetwatch import schemas
    from fleetwatch.bus.admin import Admin, ensure_topics
    from fleetwatch.bus.kafka import KafkaBus

    run = uuid.uuid4().hex[:8]
    topic = f"bench.telemetry.{run}"
    ensure_topics(bootstrap, [topic])
    producer = KafkaBus(bootstrap).producer(options={"compression.type": compression})
    for m in msgs:
        producer.send(topic, key=m["node"].encode(), value=schemas.encode(m))
    failed = producer.flush(600)
    producer.close()
    if failed:
        raise SystemExit(f"{len(failed)} of {len(msgs)} messages to {topic} were not acknowledged")

    # The raw rates are measured before and after the workers: this shared machine's speed drifts,
    # and each ratio is taken against the mean of the two. A group of n workers is compared with n
    # raw consumers reading the same partitions in parallel (like for like), and with one.
    counts = sorted({1, *workers})
    try:
        with CpuUse(local_broker_pid(bootstrap)) as cpu:
            before = {n: _raw_rate(bootstrap, topic, n, cpu) for n in counts}
            group = f"bench-{run}"
            rates = {n: _group_rate(bootstrap, topic, len(msgs), n, f"{group}-{n}w", cpu) for n in workers}
            after = {n: _raw_rate(bootstrap, topic, n, cpu) for n in counts}
    finally:  # ~400 MB a run: left behind, runs fill the broker's disk
        with Admin(bootstrap) as admin:
            admin.delete_topics([topic])
    raw = {n: (before[n][0] + after[n][0]) / 2 for n in counts}
    result = {"raw_consume_before_per_s": before[1][0], "raw_consume_after_per_s": after[1][0]}
    for n in counts:
        if n > 1:
            result[f"raw_{n}_consumers_per_s"] = raw[n]
        for what in ("idle", "machine_us", "broker_us"):
            result[f"raw_{n}_consumers_cpu_{what}"] = (before[n][1][what] + after[n][1][what]) / 2
    for n, (rate, use) in rates.items():
        result[f"workers_{n}_per_s"] = rate
        result[f"workers_{n}_ratio"] = rate / raw[n]
        result[f"workers_{n}_ratio_to_1_consumer"] = rate / raw[1]
        for what in ("idle", "machine_us", "broker_us"):
            result[f"workers_{n}_cpu_{what}"] = use[what]
    return result


def _while_all_work(members: list[list[tuple[float, int]]], start: float) -> tuple[float, int, float, float]:
    """Records per second of a group of members over the span in which every one of them is
    working: from the time all have begun (after `start`, each member's first records) to the
    first member's last record. A member that ran out of work early (its partitions held fewer
    messages, or others had read part of them before the group settled) would otherwise leave the
    rest working alone and be counted as slowness. And a member's first records come ~0.8 s after
    `start` on librdkafka, which restarts fetching that long after the partitions the members
    held paused while the group formed are resumed: a wait of this benchmark's making (the
    worker never pauses), so it is left out too.
    Returns (rate, records in the span, span start, span end)."""
    start = max(min((t for t, n in steps if t > start and n), default=start) for steps in members)
    end = min(steps[-1][0] for steps in members)
    k = sum(n for steps in members for t, n in steps if start < t <= end)
    return (k / (end - start) if end > start else float("nan")), k, start, end


def _partitions(bootstrap: str, topic: str) -> list[int]:
    from fleetwatch.bus.kafka import KafkaBus

    return list(range(KafkaBus(bootstrap).partition_count(topic)))


def _raw_rate(bootstrap: str, topic: str, n: int, cpu: CpuUse) -> tuple[float, dict[str, float]]:
    """n plain kafka-python consumers (processes), each assigned every n-th partition, reading the
    topic once: records per second while all of them read (_while_all_work), and the CPU use over
    that span (CpuUse.over)."""

    parts = _partitions(bootstrap, topic)
    ctx = multiprocessing.get_context("fork")
    reports = ctx.Queue()
    procs = [ctx.Process(target=_raw_proc, args=(bootstrap, topic, parts[i::n], reports)) for i in range(n)]
    for p in procs:
        p.start()
    got = [reports.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    rate, k, t0, t1 = _while_all_work([steps for _start, steps in got], max(start for start, _ in got))
    return rate, cpu.over(t0, t1, k)


def _raw_proc(bootstrap: str, topic: str, parts: list[int], reports: Any) -> None:
    # kafka-python: the baseline the workers were first compared with (benchmarks/README.md), kept
    # so the figures stay comparable; a dev dependency, used nowhere else
    from kafka import KafkaConsumer, TopicPartition

    from benchmarks.kafka_clients import kafka_python_config

    consumer = KafkaConsumer(**kafka_python_config(bootstrap), enable_auto_commit=False)
    tps = [TopicPartition(topic, p) for p in parts]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    total = sum(consumer.end_offsets(tps).values())
    k = 0
    steps: list[tuple[float, int]] = []
    start = time.perf_counter()
    while k < total:
        got = sum(len(batch) for batch in consumer.poll(timeout_ms=500, max_records=2000).values())
        if got:
            k += got
            steps.append((time.perf_counter(), got))
    reports.put((start, steps))
    consumer.close()


def _group_rate(
    bootstrap: str, topic: str, total: int, n: int, group: str, cpu: CpuUse
) -> tuple[float, dict[str, float]]:
    """Messages per second of `n` detect Worker processes in one consumer group, from the group's
    last rebalance (every member owns its partitions) while every member works (_while_all_work),
    and the CPU use over that span (CpuUse.over)."""
    ctx = multiprocessing.get_context("fork")
    done = ctx.Value("q", 0)
    started = ctx.Value("q", 0)  # workers subscribed and ready to join
    owned = ctx.Array("q", n)  # partitions each member owns while the group forms
    changed = ctx.Value("d", time.perf_counter())  # when a member's share last changed
    polled = ctx.Array("d", n)  # when each member last came back from a poll
    go = ctx.Value("d", 0.0)  # when all members start reading
    parts = len(_partitions(bootstrap, topic))
    reports = ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker_proc,
            args=(
                bootstrap,
                topic,
                total,
                group,
                (i, n, parts),
                started,
                (owned, changed, polled, go),
                done,
                reports,
            ),
        )
        for i in range(n)
    ]
    for p in procs:
        p.start()
    got = [reports.get(timeout=900) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    if not all(r["steps"] for r in got):
        raise RuntimeError(f"a member of the group of {n} processed nothing: run it again")
    rate, k, t0, t1 = _while_all_work([r["steps"] for r in got], max(r["settled"] for r in got))
    if k < total / 2:  # the group was not settled after all (see _worker_proc): a late rebalance
        raise RuntimeError(
            f"the group of {n} worked together on {k} of {total} messages only; "
            "this run does not measure the group: run it again"
        )
    return rate, cpu.over(t0, t1, k)


def _worker_proc(
    bootstrap: str,
    topic: str,
    total: int,
    group: str,
    member: tuple[int, int, int],
    started: Any,
    forming: tuple[Any, Any, Any, Any],
    done: Any,
    reports: Any,
) -> None:
    from fleetwatch import schemas
    from fleetwatch.pipeline import telemetry_decode
    from fleetwatch.pipeline.job_table import JobTable
    from fleetwatch.pipeline.node_stage import NodeTask
    from fleetwatch.pipeline.tasks import Stage
    from fleetwatch.pipeline.worker import Worker

    me, n, parts = member
    jobs = JobTable()
    stage = Stage(
        name=group,
        inputs=(topic,),
        schemas={topic: schemas.TELEMETRY},
        new_task=lambda _p: NodeTask(jobs),
        load_task=lambda _p, raw: NodeTask.from_bytes(raw, jobs),
        decoders={topic: telemetry_decode.decode_telemetry},
        warm_up=NodeTask.warm_up,
    )
    worker = Worker(bootstrap, group, [stage], snapshot_every_s=3600)
    if os.environ.get("FLEETWATCH_BENCH_DECODER") == "msgspec":
        # the worker as it runs while the scanner is still compiling: the message decoders only
        with telemetry_decode.message_decoders_only():
            _run_member(worker, me, n, parts, forming, started, done, total, reports)
    else:
        _run_member(worker, me, n, parts, forming, started, done, total, reports)


def _run_member(
    worker: Any,
    me: int,
    n: int,
    parts: int,
    forming: Any,
    started: Any,
    done: Any,
    total: int,
    reports: Any,
) -> None:
    """One member's run: join, wait until the group has formed, then read until `total` are done."""
    owned, changed, polled, go = forming
    with started.get_lock():
        started.value += 1
    while started.value < n:
        time.sleep(0.01)
    # The group forms with fetching paused: the first member to join owns every partition until
    # the others' join reaches it (up to a heartbeat, 3 s, later), and reading then would leave
    # the late members little to do. A start time is set for all once every partition has an
    # owner, every member owns some, no share changed for a second, and every member is back
    # from its last poll (a member inside a rebalance reports a stale share).
    while True:
        worker.consumer.pause(sorted(worker.consumer.assignment()))
        k = worker.step(timeout_ms=50)  # joins and heartbeats; records fetched before the pause are processed
        if k:
            with done.get_lock():
                done.value += k
        mine, now = len(worker.consumer.assignment()), time.perf_counter()
        with owned.get_lock():
            if owned[me] != mine:
                owned[me], changed.value = mine, now
            polled[me] = now
            counts, quiet, lag = list(owned), now - changed.value, now - min(polled)
            if not go.value and sum(counts) == parts and min(counts) > 0 and quiet > 1.0 and lag < 0.2:
                go.value = now + 0.2  # every member sees it within one 50 ms poll
        if go.value and time.perf_counter() >= go.value:
            break
    worker.consumer.resume(sorted(worker.consumer.assignment()))
    steps: list[tuple[float, int]] = []
    settled = time.perf_counter()
    deadline = settled + 600
    while done.value < total and time.perf_counter() < deadline:
        k = worker.step()
        if k:
            steps.append((time.perf_counter(), k))
            with done.get_lock():
                done.value += k
    reports.put({"settled": settled, "steps": steps})
    worker.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--ticks", type=int, default=80)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--baseline-nodes", type=int, default=64, help="nodes the slow baseline is timed on")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kafka", action="store_true", help="also measure end to end through the local broker")
    ap.add_argument(
        "--workers", default="1,2", help="detect worker process counts to measure, one group each (e.g. 1,2)"
    )
    ap.add_argument("--bootstrap", default=os.environ.get("FLEETWATCH_BOOTSTRAP", "127.0.0.1:19092"))
    ap.add_argument(
        "--compression",
        default="none",
        help="producer codecs of the benchmark topic, one Kafka measurement each (e.g. none,zstd)",
    )
    ap.add_argument(
        "--decoder",
        choices=("scanner", "msgspec"),
        default="scanner",
        help="the workers' telemetry decoder (msgspec: as while the scanner is compiling)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    os.environ["FLEETWATCH_BENCH_DECODER"] = args.decoder  # read by the worker processes

    msgs = generate(args.nodes, args.ticks, args.seed)
    fw = bench_fleetwatch(msgs, args.batch)
    base = bench_baseline(msgs, args.baseline_nodes)
    from fleetwatch import schemas

    raws = [schemas.encode(m) for m in msgs]
    from_bytes = {c: bench_decode_and_stage(raws, args.batch, c) for c in (True, False)}
    result: dict[str, Any] = {
        "node_samples": len(msgs),
        "fleetwatch_per_core_per_s": round(fw),
        "naive_river_per_core_per_s": round(base),
        "speedup": round(fw / base, 1),
        "from_bytes_scanner_per_core_per_s": round(from_bytes[True]),
        "from_bytes_msgspec_per_core_per_s": round(from_bytes[False]),
        "scanner_speedup": round(from_bytes[True] / from_bytes[False], 2),
    }
    if args.kafka:
        counts = [int(w) for w in args.workers.split(",")]
        for i, codec in enumerate(args.compression.split(",")):
            # the first codec's figures under "kafka" (as before), the others under kafka_<codec>
            result["kafka" if i == 0 else f"kafka_{codec}"] = {
                k: round(v, 3) for k, v in bench_kafka(msgs, args.bootstrap, counts, codec).items()
            }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        shape = f"{args.nodes} nodes x {args.ticks} ticks"
        print(f"{len(msgs)} node-samples of 8 GPUs ({shape}), batch {args.batch}")
        print(f"  fleetwatch node stage : {fw:>10,.0f} node-samples/s per core (CPU time)")
        print(f"  naive per-metric river: {base:>10,.0f} node-samples/s per core (CPU time)")
        print(f"  ratio                 : {fw / base:>10.1f}x")
        print(
            f"  from raw bytes (decode + node stage), CPU time per core: scanner {from_bytes[True]:,.0f}/s, "
            f"msgspec structs {from_bytes[False]:,.0f}/s, ratio {from_bytes[True] / from_bytes[False]:.2f}x"
        )
        if args.kafka:
            k = result["kafka"]
            print(
                f"  kafka raw consume     : {k['raw_consume_before_per_s']:>10,.0f} msgs/s before, "
                f"{k['raw_consume_after_per_s']:,.0f} after"
            )
            for key, v in k.items():
                if key.startswith("raw_") and key.endswith("_consumers_per_s"):
                    print(
                        f"  kafka raw consume, {key.split('_')[1]} consumers: {v:>8,.0f} msgs/s "
                        "(mean of before and after)"
                    )
            for key, v in k.items():
                if key.endswith("_per_s") and key.startswith("workers_"):
                    w = key.split("_")[1]
                    print(
                        f"  detect, {w} worker process(es): {v:>10,.0f} msgs/s  ratio to {w} raw consumer(s) "
                        f"{k[f'workers_{w}_ratio']:.2f} (to one: {k[f'workers_{w}_ratio_to_1_consumer']:.2f})"
                    )
            who = {"raw": "raw consumer(s)", "workers": "worker(s)"}
            print(
                f"  while timed ({os.cpu_count()} CPUs): CPU idle; CPU time per message, machine and broker"
            )
            for key, v in k.items():
                if key.endswith("_cpu_idle"):
                    stem = key.removesuffix("_idle")
                    print(
                        f"    {key.split('_')[1]} {who[key.split('_')[0]]:<16} idle {v:>4.0%}  "
                        f"machine {k[stem + '_machine_us']:>5.1f} us, "
                        f"broker {k[stem + '_broker_us']:>5.1f} us"
                    )
            plain = result["kafka"]
            for codec in args.compression.split(",")[1:]:
                c = result[f"kafka_{codec}"]
                print(f"  on a {codec} topic:")
                for key, v in c.items():
                    if key.endswith("_per_s") and key.startswith("workers_"):
                        w = key.split("_")[1]
                        print(
                            f"    detect, {w} worker process(es): {v:>10,.0f} msgs/s, "
                            f"{v / plain[key]:.2f} of the first topic's; ratio to {w} raw consumer(s) "
                            f"on this topic {c[f'workers_{w}_ratio']:.2f}"
                        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
