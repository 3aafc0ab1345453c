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
  (decode + validate + detect + produce findings + commit) over the same messages, timed from the
  group's last rebalance. Prints each group's rate over the mean raw rate of n consumers (like
  for like) and of one.

    python benchmarks/detect_throughput.py [--nodes 1024] [--ticks 40] [--batch 1000] [--kafka]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
import uuid
from typing import Any

from collectors.sim import Simulation, load_scenario, packaged_path
from fleetwatch import topics
from fleetwatch.runtime import gc_paused


def generate(nodes: int, ticks: int, seed: int) -> list[dict[str, Any]]:
    overrides = {"nodes": nodes, "duration_s": ticks, "seed": seed}
    sim = Simulation(load_scenario(str(packaged_path("scale.yaml")), overrides))
    return [m for msgs in sim.ticks() for t, _k, m in msgs if t == topics.TELEMETRY]


def bench_fleetwatch(msgs: list[dict[str, Any]], batch: int) -> float:
    from pipeline.job_table import JobTable
    from pipeline.node_stage import NodeTask

    NodeTask.warm_up()
    task = NodeTask(JobTable())
    t0 = time.process_time()
    with gc_paused():  # as pipeline/worker.py runs each batch
        for i in range(0, len(msgs), batch):
            task.process(topics.TELEMETRY, msgs[i : i + batch])
    return len(msgs) / (time.process_time() - t0)


def bench_decode_and_stage(raws: list[bytes], batch: int, columnar: bool) -> float:
    """Raw telemetry/1 bytes -> findings, as the worker runs it minus Kafka: decoded by the
    compiled scanner straight into columns (columnar) or by msgspec into structs, then the
    per-node stage. Node-samples per second of CPU time."""
    from fleetwatch import schemas
    from pipeline.job_table import JobTable
    from pipeline.node_stage import NodeTask
    from pipeline.telemetry_decode import decode_telemetry

    NodeTask.warm_up()
    task = NodeTask(JobTable())
    t0 = time.process_time()
    with gc_paused():
        for i in range(0, len(raws), batch):
            chunk = raws[i : i + batch]
            if columnar:
                msgs, _bad = decode_telemetry(chunk, now=0.0, max_skew_s=None)
            else:
                msgs, _bad = schemas.decode_batch(chunk, schemas.TELEMETRY, struct=True)
            task.process(topics.TELEMETRY, msgs)
    return len(raws) / (time.process_time() - t0)


def bench_baseline(msgs: list[dict[str, Any]], nodes: int) -> float:
    """Steady state: the models of `nodes` nodes are built on their first sample (not timed),
    then their remaining samples are timed. Per-sample cost does not depend on the node count."""
    from river import anomaly

    from detectors.batch import GPU_NUMERIC

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


def bench_kafka(msgs: list[dict[str, Any]], bootstrap: str, workers: list[int]) -> dict[str, float]:
    from kafka import KafkaProducer

    from fleetwatch import kafka_io, schemas

    run = uuid.uuid4().hex[:8]
    topic = f"bench.telemetry.{run}"
    kafka_io.ensure_topics(bootstrap, [topic])
    producer = KafkaProducer(**kafka_io.client_config(bootstrap), linger_ms=20, batch_size=512 * 1024)
    for m in msgs:
        producer.send(topic, key=m["node"].encode(), value=schemas.encode(m))
    producer.flush()
    producer.close()

    # The raw rates are measured before and after the workers: this shared machine's speed drifts,
    # and each ratio is taken against the mean of the two. A group of n workers is compared with n
    # raw consumers reading the same partitions in parallel (like for like), and with one.
    counts = sorted({1, *workers})
    before = {n: _raw_rate(bootstrap, topic, n) for n in counts}
    rates = {n: _group_rate(bootstrap, topic, len(msgs), n, f"bench-{run}-{n}w") for n in workers}
    after = {n: _raw_rate(bootstrap, topic, n) for n in counts}
    raw = {n: (before[n] + after[n]) / 2 for n in counts}
    result = {"raw_consume_before_per_s": before[1], "raw_consume_after_per_s": after[1]}
    for n in counts:
        if n > 1:
            result[f"raw_{n}_consumers_per_s"] = raw[n]
    for n, rate in rates.items():
        result[f"workers_{n}_per_s"] = rate
        result[f"workers_{n}_ratio"] = rate / raw[n]
        result[f"workers_{n}_ratio_to_1_consumer"] = rate / raw[1]
    return result


def _raw_rate(bootstrap: str, topic: str, n: int) -> float:
    """n plain kafka-python consumers (processes), each assigned every n-th partition, reading the
    topic once: records per second over the span from the first start to the last finish."""
    from kafka import KafkaConsumer

    from fleetwatch import kafka_io

    probe = KafkaConsumer(**kafka_io.client_config(bootstrap), enable_auto_commit=False)
    parts = sorted(probe.partitions_for_topic(topic) or ())
    probe.close()
    ctx = multiprocessing.get_context("fork")
    reports = ctx.Queue()
    procs = [ctx.Process(target=_raw_proc, args=(bootstrap, topic, parts[i::n], reports)) for i in range(n)]
    for p in procs:
        p.start()
    got = [reports.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    return sum(k for k, _t0, _t1 in got) / (max(t1 for _k, _t0, t1 in got) - min(t0 for _k, t0, _t1 in got))


def _raw_proc(bootstrap: str, topic: str, parts: list[int], reports: Any) -> None:
    from kafka import KafkaConsumer, TopicPartition

    from fleetwatch import kafka_io

    consumer = KafkaConsumer(**kafka_io.client_config(bootstrap), enable_auto_commit=False)
    tps = [TopicPartition(topic, p) for p in parts]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    total = sum(consumer.end_offsets(tps).values())
    k = 0
    t0 = time.perf_counter()
    while k < total:
        for batch in consumer.poll(timeout_ms=500, max_records=2000).values():
            k += len(batch)
    reports.put((k, t0, time.perf_counter()))
    consumer.close()


def _group_rate(bootstrap: str, topic: str, total: int, n: int, group: str) -> float:
    """Messages per second of `n` detect Worker processes in one consumer group, over the time
    after the group's last rebalance (every member owns its partitions) to the last message."""
    ctx = multiprocessing.get_context("fork")
    done = ctx.Value("q", 0)
    started = ctx.Value("q", 0)  # workers subscribed and ready to join
    reports = ctx.Queue()
    procs = [
        ctx.Process(target=_worker_proc, args=(bootstrap, topic, total, group, n, started, done, reports))
        for _ in range(n)
    ]
    for p in procs:
        p.start()
    got = [reports.get(timeout=900) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    t0 = max(r["settled"] for r in got)  # the last member's last assignment change
    t_end = max(t for r in got for t, _k in r["steps"])
    after = sum(k for r in got for t, k in r["steps"] if t > t0)
    if after < total / 2:  # a member joined late and the others had done most of the work alone
        raise RuntimeError(
            f"the group of {n} settled after {total - after} of {total} messages were processed; "
            "this run does not measure the group: run it again"
        )
    return after / (t_end - t0)


def _worker_proc(
    bootstrap: str, topic: str, total: int, group: str, n: int, started: Any, done: Any, reports: Any
) -> None:
    from fleetwatch import schemas
    from pipeline.job_table import JobTable
    from pipeline.node_stage import NodeTask
    from pipeline.tasks import Stage
    from pipeline.worker import Worker

    jobs = JobTable()
    stage = Stage(
        name=group,
        inputs=(topic,),
        schemas={topic: schemas.TELEMETRY},
        new_task=lambda _p: NodeTask(jobs),
        load_task=lambda _p, raw: NodeTask.from_bytes(raw, jobs),
        columnar_telemetry=True,
        warm_up=NodeTask.warm_up,
    )
    worker = Worker(bootstrap, group, [stage], snapshot_every_s=3600)
    # All members join together (their first poll): a member that starts polling alone takes every
    # partition and works through the topic while the others are still starting up.
    with started.get_lock():
        started.value += 1
    while started.value < n:
        time.sleep(0.01)
    steps: list[tuple[float, int]] = []
    owned: set[Any] = set()
    settled = time.perf_counter()
    deadline = settled + 600
    while done.value < total and time.perf_counter() < deadline:
        k = worker.step()
        now = time.perf_counter()
        if set(worker.tasks) != owned:
            owned, settled = set(worker.tasks), now
        if k:
            steps.append((now, k))
            with done.get_lock():
                done.value += k
    reports.put({"settled": settled, "steps": steps})
    worker.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--ticks", type=int, default=40)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--baseline-nodes", type=int, default=64, help="nodes the slow baseline is timed on")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kafka", action="store_true", help="also measure end to end through the local broker")
    ap.add_argument(
        "--workers", default="1,2", help="detect worker process counts to measure, one group each (e.g. 1,2)"
    )
    ap.add_argument("--bootstrap", default=os.environ.get("FLEETWATCH_BOOTSTRAP", "127.0.0.1:19092"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

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
        result["kafka"] = {
            k: round(v, 3)
            for k, v in bench_kafka(msgs, args.bootstrap, [int(w) for w in args.workers.split(",")]).items()
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
