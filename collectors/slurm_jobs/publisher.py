"""`fleetwatch slurm-jobs`: publishes job/1 for every Slurm job's start and end.

Runs beside slurmctld. Every `--interval` seconds it asks Slurm for all jobs (`squeue --json`),
compares the answer with its ledger of what it has published (collectors/slurm_jobs/ledger.py)
and publishes what is missing, then tombstones ended jobs older than the history window. Why
polling: docs/slurm-jobs.md ("Why squeue polling").

One loop, in order:
1. ask Slurm (a failure is logged and counted; nothing is published from a failed answer);
2. read what the jobcomp log gained (ends of jobs Slurm may already have forgotten);
3. compute the missing messages: starts and ends in the answer, ends of running jobs Slurm no
   longer lists, jobs only the jobcomp log knows, tombstones;
4. send them keyed by job and wait for the broker; only acknowledged ones enter the ledger, so
   whatever the broker did not take is computed and sent again next time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import subprocess
import sys
import time
from collections import OrderedDict
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from fleetwatch import schemas, topics
from fleetwatch.bus import Bus, Producer, Record, RecordTooLarge, SendError
from fleetwatch.bus.kafka import KafkaBus
from fleetwatch.collectors.slurm_jobs import squeue
from fleetwatch.collectors.slurm_jobs.jobcomp import JobcompLog
from fleetwatch.collectors.slurm_jobs.ledger import Ledger
from fleetwatch.collectors.slurm_jobs.model import SlurmJob, SlurmParseError
from fleetwatch.follow import TopicFollower
from fleetwatch.runtime import StopFlag, serve_metrics

log = logging.getLogger(__name__)

PUBLISHED = Counter(
    "fleetwatch_slurm_jobs_published_total", "job/1 records the broker acknowledged", ["state"]
)
BAD_ANSWERS = Counter(
    "fleetwatch_slurm_jobs_bad_answers_total",
    "Slurm answers, jobs or jobcomp lines that did not parse (logged with their text, not published)",
    ["what"],
)
POLL_ERRORS = Counter("fleetwatch_slurm_jobs_poll_errors_total", "squeue calls that failed", ["reason"])
SLURM_UP = Gauge("fleetwatch_slurm_jobs_slurm_up", "1 if the last squeue call answered")
LAST_POLL = Gauge(
    "fleetwatch_slurm_jobs_last_poll_timestamp_seconds",
    "when an answer from Slurm was last compared and published (squeue blocks while slurmctld is down)",
)
RUNNING = Gauge("fleetwatch_slurm_jobs_running", "jobs published as running")
DROPPED = Counter(
    "fleetwatch_slurm_jobs_dropped_total",
    "job records never published because the Kafka client refuses them (too_large: past message.max.bytes)",
    ["reason"],
)
DROPPED.labels("too_large")
UNSENT = Gauge("fleetwatch_slurm_jobs_unsent", "records computed but not yet acknowledged by the broker")
START_LAG = Histogram(
    "fleetwatch_slurm_jobs_start_lag_seconds",
    "from Slurm's start time of a job (whole seconds) to the broker's acknowledgement of its start",
    buckets=(0.5, 1, 2, 3, 5, 10, 30, 60, 300),
)

SQUEUE_TIMEOUT_S = 60.0
WINDOW_MARGIN_S = 60.0  # how far inside the consumers' clock window a late event is dated
LOGGED_ERRORS = 1000  # distinct bad answers remembered so each is logged once, not every poll


for _what in ("squeue", "job", "nodelist", "jobcomp"):  # exported at 0 from the start, for rules' increase()
    BAD_ANSWERS.labels(_what)


class SlurmUnavailable(RuntimeError):
    pass


def ask_squeue(slurm_conf: str | None, timeout_s: float = SQUEUE_TIMEOUT_S) -> bytes:
    """All jobs slurmctld holds, as squeue's JSON (22.05 lists every state; --states=all makes
    newer versions do the same)."""
    env = dict(os.environ)
    if slurm_conf:
        env["SLURM_CONF"] = slurm_conf
    try:
        done = subprocess.run(
            ["squeue", "--json", "--states=all"], env=env, capture_output=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as e:
        raise SlurmUnavailable("timeout") from e
    except OSError as e:
        raise SlurmUnavailable(f"squeue: {e}") from e
    if done.returncode != 0:
        raise SlurmUnavailable(
            f"exit {done.returncode}: {done.stderr.decode(errors='replace').strip()[:300]}"
        )
    return done.stdout


def encode(msg: dict[str, Any]) -> bytes:
    return json.dumps(msg, separators=(",", ":"), allow_nan=False).encode()


class Publisher:
    """The loop's state: the ledger, the jobcomp log, the producer."""

    def __init__(
        self,
        producer: Producer,
        ledger: Ledger,
        jobcomp: JobcompLog | None,
        topic: str = topics.JOBS,
        max_behind_s: float = schemas.DEFAULT_CLOCK.behind_s,
    ) -> None:
        self.producer = producer
        self.ledger = ledger
        self.jobcomp = jobcomp
        self.topic = topic
        self.max_behind_s = max_behind_s
        self._logged: OrderedDict[str, None] = OrderedDict()

    def once(self, answer: bytes, now: float) -> int:
        """One comparison and publication; returns how many records were acknowledged."""
        jobs, errors = self.parse(answer)
        if self.jobcomp is not None:
            # keep what consumers still accept (older records are dead-lettered as stale)
            self.jobcomp.forget_before(now - self.max_behind_s + 60.0)
            for e in self.jobcomp.refresh():
                self.report(e)
        msgs = self.ledger.observe(jobs, self.jobcomp, now)
        if all(e.job is not None for e in errors):  # every listed job is accounted for
            seen = {j.job for j in jobs} | {e.job for e in errors if e.job is not None}
            msgs += self.ledger.vanished(seen, self.jobcomp, now)
        if self.jobcomp is not None:
            msgs += self.ledger.catch_up(self.jobcomp, {m["job"] for m in msgs})
        msgs = [self._in_window(m, now) for m in msgs]
        tombstones = list(self.ledger.expired(now))
        sent = self.send(msgs, tombstones)
        RUNNING.set(len(self.ledger.running()))
        LAST_POLL.set(now)
        return sent

    def parse(self, answer: bytes) -> tuple[list[SlurmJob], list[SlurmParseError]]:
        jobs, errors = squeue.parse(answer)
        for e in errors:
            self.report(e)
        return jobs, errors

    def _in_window(self, msg: dict[str, Any], now: float) -> dict[str, Any]:
        """The message with its ts inside what consumers accept. A start or end learned after the
        consumers' clock window (a publisher down for over a day, or deployed beside jobs running
        for days) is published dated at the window's edge, its start_ts as Slurm said: not sent,
        it left a job that runs unknown to every stage (its drain guard too), or one that ended
        running for days more. An event dated ahead of this host's clock (Slurm's "infinite" end,
        a bad clock) is dated now: nothing that already happened is later than that."""
        oldest = now - self.max_behind_s + WINDOW_MARGIN_S
        if msg["ts"] < oldest:
            log.info(
                "job %s %s at %.0f is older than consumers accept; published dated %.0f (start_ts %.0f)",
                msg["job"],
                msg["state"],
                msg["ts"],
                oldest,
                msg["start_ts"],
            )
            return {**msg, "ts": oldest}
        if msg["ts"] > now:
            return {**msg, "ts": now}
        return msg

    def send(self, msgs: list[dict[str, Any]], tombstones: list[str]) -> int:
        items: list[tuple[dict[str, Any] | str, bytes, bytes | None]] = [
            (m, m["job"].encode(), encode(m)) for m in msgs
        ]
        items += [(j, j.encode(), None) for j in tombstones]
        UNSENT.set(len(items))
        if not items:
            return 0
        sent = []
        held: set[bytes] = set()  # jobs one of whose records was refused: their later ones wait too
        for item, key, value in items:  # one record the client refuses holds back none behind it
            if key in held:
                continue  # (an end acknowledged without its start would leave the start unsent for good)
            try:
                sent.append((item, self.producer.send(self.topic, key=key, value=value)))
            except RecordTooLarge as e:
                # never sent whatever the retries (a job of tens of thousands of long node names):
                # settled as if published, logged and counted, so it is not tried at every poll
                DROPPED.labels("too_large").inc()
                log.error("job %s: its record is too large to publish (%s); dropped", key.decode(), e)
                self._settle(item)
            except SendError as e:  # not in the ledger: computed and sent again next loop
                held.add(key)
                log.warning(
                    "the producer refused the record of job %s (%s); sent again next loop", key.decode(), e
                )
        unacked = self.producer.flush(30)
        if unacked:
            log.warning("broker did not acknowledge %d job records; they are sent again", len(unacked))
        acked = 0
        for item, delivery in sent:
            if not delivery.acked:
                continue  # not in the ledger: computed and sent again next loop
            acked += 1
            self._settle(item)
            PUBLISHED.labels(item["state"] if isinstance(item, dict) else "tombstone").inc()
            if isinstance(item, dict) and item["state"] == "started":
                START_LAG.observe(max(0.0, time.time() - item["ts"]))
        UNSENT.set(len(items) - acked)
        return acked

    def _settle(self, item: dict[str, Any] | str) -> None:
        """Into the ledger: a message (what the topic now holds for its job) or a tombstone."""
        if isinstance(item, str):
            self.ledger.forget(item)
        else:
            self.ledger.apply(item)

    def report(self, e: SlurmParseError) -> None:
        """Counts an answer, job or line that did not parse; logs each distinct one once, with its text."""
        BAD_ANSWERS.labels(e.what).inc()
        digest = hashlib.sha256(f"{e}|{e.raw}".encode()).hexdigest()
        if digest in self._logged:
            return
        self._logged[digest] = None
        while len(self._logged) > LOGGED_ERRORS:
            self._logged.popitem(last=False)
        # the text as a quoted literal, bounded: a job's name is its user's, and a carriage return
        # or a terminal escape in it must not forge or hide log lines
        log.error("unparsable Slurm %s, not published: %s; text: %r", e.what, e, e.raw[:2000])


class _LedgerReader(TopicFollower):
    """The jobs topic from its beginning into a Ledger (TopicFollower: every partition, tombstones
    as value None), read once at start-up."""

    def __init__(self, ledger: Ledger, topic: str, bus: Bus) -> None:
        super().__init__(topic, None, bus)
        self.ledger = ledger
        self.records = 0

    def apply_record(self, record: Record, now: float) -> None:
        self.records += 1
        if record.key is None:
            return
        key = record.key.decode(errors="replace")
        if record.value is None:
            self.ledger.load(key, None)
            return
        try:
            msg = schemas.decode(record.value, schemas.JOB, key=record.key, clock=None)
        except schemas.MessageError:
            return  # someone else's bad record: the workers dead-letter it
        self.ledger.load(key, msg)


def load_ledger(bus: Bus, ledger: Ledger, topic: str = topics.JOBS, timeout_s: float = 300.0) -> int:
    """Reads the whole (compacted) jobs topic into `ledger`; returns the records read."""
    reader = _LedgerReader(ledger, topic, bus)
    reader.start()
    try:
        deadline = time.monotonic() + timeout_s
        while not reader.caught_up.wait(0.5):
            if not reader.is_alive():
                raise RuntimeError(f"reading {topic} failed (see the log)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {topic} to its end within {timeout_s:.0f} s")
    finally:
        reader.stop()
        reader.join(timeout=30)
    return reader.records


def run(args: argparse.Namespace) -> int:
    slurm_conf = args.slurm_conf or os.environ.get("SLURM_CONF")
    try:
        ask_squeue(slurm_conf)
    except SlurmUnavailable as e:
        print(f"fleetwatch slurm-jobs: Slurm is not reachable: {e}", file=sys.stderr)
        return 3
    bus = KafkaBus(args.bootstrap)
    bus.wait_for_broker(30)
    bus.ensure_topics([args.topic])
    serve_metrics(args.metrics_port, args.metrics_addr)
    ledger = Ledger()
    n = load_ledger(bus, ledger, args.topic)
    jobcomp = JobcompLog(args.jobcomp) if args.jobcomp else None
    log.info(
        "slurm-jobs up: %d records read back from %s, %d jobs running there; jobcomp %s",
        n,
        args.topic,
        len(ledger.running()),
        args.jobcomp or "not used",
    )
    producer = bus.producer(linger_ms=0)
    publisher = Publisher(producer, ledger, jobcomp, args.topic)
    stop = StopFlag()
    try:
        while not stop:
            started = time.monotonic()
            try:
                answer = ask_squeue(slurm_conf)
                SLURM_UP.set(1)
                publisher.once(answer, time.time())
            except SlurmUnavailable as e:
                SLURM_UP.set(0)
                POLL_ERRORS.labels("timeout" if str(e) == "timeout" else "error").inc()
                log.warning("squeue failed (%s); nothing published from this poll", e)
            except SlurmParseError as e:
                publisher.report(e)
            if args.once:
                break
            stop.wait(max(0.0, args.interval - (time.monotonic() - started)))
    finally:
        producer.close(10)
    return 0
