"""Detector throughput in node-samples per second on one core, against a naive baseline
measured in the same run, and end to end through the real local Kafka broker.

A node-sample is one telemetry/1 message of 8 GPUs. The messages come from the simulator
(scale.yaml: background faults at published rates) and are generated before timing starts.

- fleetwatch: the per-node stage (pipeline/node_stage.py: batch decode into numpy, hardware
  rules, silence, lemon, node features) on batches of --batch messages.
- baseline: the naive design, per sample and per metric, one river anomaly model per
  (node, GPU, metric) with score_one + learn_one (river.anomaly.StandardAbsoluteDeviation).
- kafka (with --kafka): the same messages produced to a fresh topic; a plain kafka-python
  consumer's raw consume rate, then a detect Worker (decode + validate + detect + produce
  findings + commit) over the same messages. Prints the ratio worker / raw consume.

    python benchmarks/detect_throughput.py [--nodes 1024] [--ticks 40] [--batch 1000] [--kafka]
"""

from __future__ import annotations

import argparse
import json
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

    task = NodeTask(JobTable())
    t0 = time.process_time()
    with gc_paused():  # as pipeline/worker.py runs each batch
        for i in range(0, len(msgs), batch):
            task.process(topics.TELEMETRY, msgs[i : i + batch])
    return len(msgs) / (time.process_time() - t0)


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


def bench_kafka(msgs: list[dict[str, Any]], bootstrap: str) -> dict[str, float]:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    from fleetwatch import kafka_io, schemas
    from fleetwatch.runtime import StopFlag
    from pipeline.job_table import JobTable
    from pipeline.node_stage import NodeTask
    from pipeline.tasks import Stage
    from pipeline.worker import Worker

    run = uuid.uuid4().hex[:8]
    topic = f"bench.telemetry.{run}"
    kafka_io.ensure_topics(bootstrap, [topic])
    producer = KafkaProducer(**kafka_io.client_config(bootstrap), linger_ms=20, batch_size=512 * 1024)
    for m in msgs:
        producer.send(topic, key=m["node"].encode(), value=schemas.encode(m))
    producer.flush()
    producer.close()

    consumer = KafkaConsumer(**kafka_io.client_config(bootstrap), enable_auto_commit=False)
    parts = sorted(consumer.partitions_for_topic(topic) or ())
    tps = [TopicPartition(topic, p) for p in parts]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    n = 0
    t0 = time.perf_counter()
    while n < len(msgs):
        for batch in consumer.poll(timeout_ms=500, max_records=2000).values():
            n += len(batch)
    raw_rate = n / (time.perf_counter() - t0)
    consumer.close()

    jobs = JobTable()
    stage = Stage(
        name=f"bench-{run}",
        inputs=(topic,),
        schemas={topic: schemas.TELEMETRY},
        new_task=lambda _p: NodeTask(jobs),
        load_task=lambda _p, raw: NodeTask.from_bytes(raw, jobs),
        telemetry_structs=True,
    )
    worker = Worker(bootstrap, f"bench-{run}", [stage], snapshot_every_s=3600)
    stop = StopFlag(install=False)
    done = 0
    t0 = time.perf_counter()
    while done < len(msgs) and time.perf_counter() - t0 < 600:
        done += worker.step()
    worker_rate = done / (time.perf_counter() - t0)
    worker.close()
    stop.set()
    return {"raw_consume_per_s": raw_rate, "worker_per_s": worker_rate, "ratio": worker_rate / raw_rate}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--ticks", type=int, default=40)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--baseline-nodes", type=int, default=64, help="nodes the slow baseline is timed on")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kafka", action="store_true", help="also measure end to end through the local broker")
    ap.add_argument("--bootstrap", default=os.environ.get("FLEETWATCH_BOOTSTRAP", "127.0.0.1:19092"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    msgs = generate(args.nodes, args.ticks, args.seed)
    fw = bench_fleetwatch(msgs, args.batch)
    base = bench_baseline(msgs, args.baseline_nodes)
    result: dict[str, Any] = {
        "node_samples": len(msgs),
        "fleetwatch_per_core_per_s": round(fw),
        "naive_river_per_core_per_s": round(base),
        "speedup": round(fw / base, 1),
    }
    if args.kafka:
        result["kafka"] = {k: round(v, 3) for k, v in bench_kafka(msgs, args.bootstrap).items()}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        shape = f"{args.nodes} nodes x {args.ticks} ticks"
        print(f"{len(msgs)} node-samples of 8 GPUs ({shape}), batch {args.batch}")
        print(f"  fleetwatch node stage : {fw:>10,.0f} node-samples/s per core (CPU time)")
        print(f"  naive per-metric river: {base:>10,.0f} node-samples/s per core (CPU time)")
        print(f"  ratio                 : {fw / base:>10.1f}x")
        if args.kafka:
            k = result["kafka"]
            print(f"  kafka raw consume     : {k['raw_consume_per_s']:>10,.0f} msgs/s")
            print(
                f"  kafka detect worker   : {k['worker_per_s']:>10,.0f} msgs/s (decode+detect+produce+commit)"
            )
            print(f"  ratio worker/raw      : {k['ratio']:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
