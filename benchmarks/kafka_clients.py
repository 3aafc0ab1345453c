"""kafka-python against confluent-kafka (librdkafka), plain and compressed topics (issue 17, 3-4).

The same telemetry/1 messages of a simulated cluster (~5 KB, 8 GPUs each) are produced, keyed by
node, to one topic per codec (none, lz4, zstd) with kafka-python's producer. For each topic:
- bytes on the broker per message (the partitions' log sizes, DescribeLogDirs);
- raw consume with each client: one process per client and topic, assigned every partition,
  reading the topic once and touching each value; messages per second of wall time and per
  CPU-second of that process (user + system, its own threads included).
Each measurement runs twice, interleaved (kafka-python, confluent, kafka-python, confluent), and
the figures are the mean of the two: this shared machine's speed drifts.

    python benchmarks/kafka_clients.py [--nodes 1024] [--ticks 40] [--bootstrap 127.0.0.1:19092]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import sys
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CODECS = ("none", "lz4", "zstd")

# kafka-python's names for the FLEETWATCH_KAFKA_* security settings. kafka-python is only the
# baseline measured here and in detect_throughput.py (a dev dependency); fleetwatch's own clients
# take these settings through fleetwatch.bus.config.rdkafka_config.
KAFKA_PYTHON_SETTINGS = {
    "FLEETWATCH_KAFKA_SECURITY_PROTOCOL": "security_protocol",
    "FLEETWATCH_KAFKA_SASL_MECHANISM": "sasl_mechanism",
    "FLEETWATCH_KAFKA_SASL_USERNAME": "sasl_plain_username",
    "FLEETWATCH_KAFKA_SASL_PASSWORD": "sasl_plain_password",
    "FLEETWATCH_KAFKA_SSL_CAFILE": "ssl_cafile",
    "FLEETWATCH_KAFKA_SSL_CERTFILE": "ssl_certfile",
    "FLEETWATCH_KAFKA_SSL_KEYFILE": "ssl_keyfile",
}


def kafka_python_config(bootstrap: str) -> dict[str, Any]:
    """kafka-python's settings for `bootstrap` with the FLEETWATCH_KAFKA_* security settings."""
    cfg: dict[str, Any] = {"bootstrap_servers": bootstrap.split(","), "bootstrap_timeout_ms": 10000}
    for var, key in KAFKA_PYTHON_SETTINGS.items():
        if os.environ.get(var):
            cfg[key] = os.environ[var]
    return cfg


def generate(nodes: int, ticks: int) -> list[tuple[bytes, bytes]]:
    from benchmarks.detect_throughput import generate as sim
    from fleetwatch import schemas

    return [(m["node"].encode(), schemas.encode(m)) for m in sim(nodes, ticks, 1)]


def produce(bootstrap: str, topic: str, codec: str, records: list[tuple[bytes, bytes]]) -> float:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        **kafka_python_config(bootstrap),
        linger_ms=20,
        batch_size=512 * 1024,
        compression_type=None if codec == "none" else codec,
    )
    t0 = time.perf_counter()
    for key, value in records:
        producer.send(topic, key=key, value=value)
    producer.flush()
    dt = time.perf_counter() - t0
    producer.close()
    return dt


def log_bytes(bootstrap: str, topic: str) -> int:
    """Sum of the topic's partition sizes on the broker (DescribeLogDirs, all brokers: kafka-python's
    admin, as confluent-kafka's has no DescribeLogDirs)."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(**kafka_python_config(bootstrap), request_timeout_ms=10000)
    try:
        brokers = admin.describe_log_dirs()  # kafka-python 3: one dict per broker
    finally:
        admin.close()
    return sum(
        p["partition_size"]
        for broker in brokers
        for log_dir in broker["log_dirs"]
        for t in log_dir["topics"]
        if t["name"] == topic
        for p in t["partitions"]
    )


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def consume_kafka_python(bootstrap: str, topic: str, n: int, out: Any) -> None:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(**kafka_python_config(bootstrap), enable_auto_commit=False)
    tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    got, size, first = 0, 0, 0
    c0 = t0 = 0.0
    while got < n:
        for batch in consumer.poll(timeout_ms=500, max_records=5000).values():
            if not got:  # timed from the first fetch on: connecting is not throughput
                c0, t0, first = _cpu(), time.perf_counter(), len(batch)
            got += len(batch)
            size += sum(len(r.value) for r in batch)
    out.put((time.perf_counter() - t0, _cpu() - c0, got - first, size))
    consumer.close()


def consume_confluent(bootstrap: str, topic: str, n: int, out: Any) -> None:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            # as large fetches as kafka-python's defaults make (50 MB a fetch, 1 MB a partition is
            # librdkafka's default too), and a deep local queue so consume() never waits on a fetch
            "fetch.max.bytes": 50 * 1024 * 1024,
            "max.partition.fetch.bytes": 8 * 1024 * 1024,
            "queued.min.messages": 200_000,
        }
    )
    parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(parts)])
    got, size, first = 0, 0, 0
    c0 = t0 = 0.0
    while got < n:
        msgs = consumer.consume(num_messages=5000, timeout=0.5)
        if msgs and not got:  # timed from the first fetch on, as above
            c0, t0, first = _cpu(), time.perf_counter(), len(msgs)
        for m in msgs:
            if m.error() is None:
                got += 1
                size += len(m.value())
    out.put((time.perf_counter() - t0, _cpu() - c0, got - first, size))
    consumer.close()


def measure(target: Any, bootstrap: str, topic: str, n: int) -> tuple[float, float]:
    ctx = multiprocessing.get_context("spawn")  # a fresh process: no client state shared
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(bootstrap, topic, n, q))
    p.start()
    wall, cpu, timed, _size = q.get(timeout=600)
    p.join(timeout=60)
    assert timed > n // 2, f"only {timed} of {n} messages timed"
    return timed / wall, timed / cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--ticks", type=int, default=40)
    ap.add_argument("--bootstrap", default=os.environ.get("FLEETWATCH_BOOTSTRAP", "127.0.0.1:19092"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from fleetwatch.bus.admin import Admin, ensure_topics

    records = generate(args.nodes, args.ticks)
    n = len(records)
    raw_bytes = sum(len(v) for _k, v in records)
    run = uuid.uuid4().hex[:8]
    topics = {codec: f"bench.clients.{codec}.{run}" for codec in CODECS}
    ensure_topics(args.bootstrap, list(topics.values()))
    result: dict[str, Any] = {"messages": n, "value_bytes_per_message": raw_bytes / n}
    try:
        for codec, topic in topics.items():
            result[f"{codec}_produce_s"] = produce(args.bootstrap, topic, codec, records)
            time.sleep(1)  # let the broker settle the log sizes
            result[f"{codec}_broker_bytes_per_message"] = log_bytes(args.bootstrap, topic) / n
        for codec, topic in topics.items():
            runs = {"kafka-python": [], "confluent-kafka": []}
            for _ in range(2):
                runs["kafka-python"].append(measure(consume_kafka_python, args.bootstrap, topic, n))
                runs["confluent-kafka"].append(measure(consume_confluent, args.bootstrap, topic, n))
            for client, rs in runs.items():
                result[f"{codec}_{client}_msgs_per_s"] = sum(r[0] for r in rs) / len(rs)
                result[f"{codec}_{client}_msgs_per_cpu_s"] = sum(r[1] for r in rs) / len(rs)
    finally:
        with Admin(args.bootstrap) as admin:
            admin.delete_topics(list(topics.values()))

    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    plain = result["none_broker_bytes_per_message"]
    print(f"{n} telemetry/1 messages, {result['value_bytes_per_message']:.0f} B of JSON each")
    print(f"{'codec':6} {'bytes/msg':>10} {'vs plain':>9} {'client':16} {'msg/s':>9} {'msg/CPU-s':>10}")
    for codec in CODECS:
        size = result[f"{codec}_broker_bytes_per_message"]
        for i, client in enumerate(("kafka-python", "confluent-kafka")):
            head = f"{codec:6} {size:10.0f} {plain / size:8.1f}x" if i == 0 else " " * 27
            rate = result[f"{codec}_{client}_msgs_per_s"]
            per_cpu = result[f"{codec}_{client}_msgs_per_cpu_s"]
            print(f"{head} {client:16} {rate:9.0f} {per_cpu:10.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
