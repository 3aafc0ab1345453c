"""`fleetwatch slurm-drainer`: executes signed drain/1 requests from scheduler.drain.v1 with scontrol.

Per request, in order:
1. decode + validate drain/1 (malformed -> dead-letter, counted);
2. check the HMAC signature with the shared key (forged or tampered -> dead-letter, counted);
3. skip it if the journal already has it (a duplicate delivery or a replaying `act`);
4. check the node against the nodes Slurm knows (unknown -> journal + dead-letter, counted);
5. never overrule a human: a drain does not overwrite someone else's drain reason, and a resume
   only lifts a drain whose reason fleetwatch wrote;
6. journal `executing`, run scontrol, journal the outcome; commit the offsets after the batch.
Slurm being down is not the request's fault: the batch stops, offsets stay, and it is retried
with backoff (up to MAX_ATTEMPTS, then recorded as failed and dead-lettered).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from kafka import TopicPartition
from kafka.structs import OffsetAndMetadata
from prometheus_client import Counter, start_http_server

from alerts import drain_request
from alerts.journal import Journal
from alerts.slurm import TAG, SlurmClient, SlurmError
from fleetwatch import kafka_io, schemas, topics
from fleetwatch.runtime import StopFlag
from pipeline.deadletter import send_deadletter

log = logging.getLogger(__name__)

REQUESTS = Counter("fleetwatch_drainer_requests_total", "drain/1 requests handled, by outcome", ["outcome"])
MAX_ATTEMPTS = 5
DEFAULT_GROUP = "fleetwatch-slurm"


class Retry(Exception):
    """Slurm did not answer; try this request again later."""


class Drainer:
    def __init__(self, slurm: SlurmClient, journal: Journal, key: bytes, producer: Any) -> None:
        self.slurm = slurm
        self.journal = journal
        self._key = key
        self.producer = producer
        self._attempts: dict[str, int] = {}

    def _reject(self, raw: bytes, outcome: str, detail: str, source: str, topic: str) -> str:
        REQUESTS.labels(outcome).inc()
        log.warning("rejected drain request from %s: %s: %s", source, outcome, detail)
        send_deadletter(self.producer, raw, outcome, detail, source, topic)
        return outcome

    def handle(self, raw: bytes, source: str, topic: str = topics.DRAIN) -> str:
        """Handle one record; returns its outcome. Raises Retry when Slurm is unreachable."""
        try:
            msg = schemas.decode(raw, drain_request.DRAIN)
        except schemas.MessageError as e:
            return self._reject(raw, "malformed", str(e), source, topic)
        if not drain_request.verify(msg, self._key):
            return self._reject(raw, "forged", "signature does not match", source, topic)
        rid, node, action = msg["request_id"], msg["node"], msg["action"]
        prior = self.journal.get(rid)
        if prior is not None and prior.status != "executing":
            REQUESTS.labels("duplicate").inc()
            log.info("request %s (%s %s) already %s; skipping", rid, action, node, prior.status)
            return "duplicate"
        try:
            if not self.slurm.knows(node):
                self.journal.record(rid, node, action, "rejected", "unknown node", msg["issued_at"], source)
                return self._reject(raw, "unknown_node", f"Slurm has no node {node}", source, topic)
            info = self.slurm.node(node)
            tag = f"fw:{rid[:12]}"
            if prior is not None:  # died between journal and scontrol last time: did it happen?
                done = (info.drained and tag in info.reason) if action == "drain" else not info.drained
                if done:
                    self.journal.finish(rid, "executed", "found done after a restart")
                    REQUESTS.labels("executed").inc()
                    return "executed"
            ours = info.reason.startswith(TAG)
            if action == "resume" and info.drained and not ours:
                return self._refuse(rid, node, action, msg, source, f"drained by someone else: {info.reason}")
            if action == "drain" and info.drained and not ours:
                return self._refuse(rid, node, action, msg, source, f"already drained: {info.reason}")
            self.journal.begin(rid, node, action, msg["issued_at"], source)
            if action == "drain":
                reason = msg["reason"] if msg["reason"].startswith(TAG) else f"{TAG}: {msg['reason']}"
                self.slurm.drain(node, f"{reason} [{tag}]")
            elif info.drained:
                self.slurm.resume(node)
            self.journal.finish(rid, "executed")
        except SlurmError as e:
            n = self._attempts[rid] = self._attempts.get(rid, 0) + 1
            if n < MAX_ATTEMPTS:
                raise Retry(str(e)) from None
            self._attempts.pop(rid, None)
            self.journal.record(rid, node, action, "failed", str(e), msg["issued_at"], source)
            self.journal.finish(rid, "failed", str(e))
            return self._reject(raw, "failed", str(e), source, topic)
        self._attempts.pop(rid, None)
        REQUESTS.labels("executed").inc()
        log.info("%s %s done (request %s: %s)", action, node, rid, msg["reason"])
        return "executed"

    def _refuse(self, rid: str, node: str, action: str, msg: dict[str, Any], source: str, why: str) -> str:
        self.journal.record(rid, node, action, "rejected", why, msg["issued_at"], source)
        REQUESTS.labels("not_ours").inc()
        log.warning("not %s %s (request %s): %s", action, node, rid, why)
        return "not_ours"


def run(args: argparse.Namespace) -> int:
    key = drain_request.load_key(args.drain_key_file)
    try:
        slurm = SlurmClient(args.slurm_conf)
        known = slurm.nodes()
    except SlurmError as e:
        print(f"fleetwatch slurm-drainer: Slurm is not reachable: {e}", file=sys.stderr)
        return 3
    state_dir = Path(
        args.state_dir or Path(os.environ.get("FLEETWATCH_HOME", ".fleetwatch")) / "slurm-drainer"
    )
    journal = Journal(state_dir / "journal.sqlite")
    kafka_io.wait_for_broker(args.bootstrap, timeout_s=30)
    kafka_io.ensure_topics(args.bootstrap, [args.drain_topic, topics.DEADLETTER])
    if args.metrics_port:
        start_http_server(args.metrics_port)
    producer = kafka_io.make_producer(args.bootstrap)
    consumer = kafka_io.make_consumer(
        args.bootstrap, args.drain_topic, group_id=args.group, max_poll_records=100
    )
    drainer = Drainer(slurm, journal, key, producer)
    log.info("slurm-drainer up: %d Slurm nodes, journal %s, group %s", len(known), state_dir, args.group)
    stop = StopFlag()
    backoff = 1.0
    idle_since = time.monotonic()
    try:
        while not stop:
            polled = consumer.poll(timeout_ms=200)
            if polled:
                idle_since = time.monotonic()
            elif args.idle_exit is not None and time.monotonic() - idle_since > args.idle_exit:
                break
            done: dict[TopicPartition, int] = {}
            retry_at: dict[TopicPartition, int] = {}
            for tp, records in polled.items():
                for r in records:
                    try:
                        drainer.handle(r.value, f"{tp.topic}:{tp.partition}:{r.offset}", tp.topic)
                    except Retry as e:
                        log.warning("Slurm unavailable (%s); retrying in %.0f s", e, backoff)
                        retry_at[tp] = r.offset
                        break
                    done[tp] = r.offset + 1
            producer.flush(timeout=30)  # dead letters first, then the commit that forgets the input
            if done:
                consumer.commit({tp: OffsetAndMetadata(o, "", -1) for tp, o in done.items()})
            for tp, off in retry_at.items():
                consumer.seek(tp, off)
            if retry_at:
                if stop.wait(backoff):
                    break
                backoff = min(backoff * 2, 30.0)
            else:
                backoff = 1.0
    finally:
        consumer.close()
        producer.close(timeout=10)
        journal.close()
    return 0
