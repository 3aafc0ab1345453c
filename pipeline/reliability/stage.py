"""`fleetwatch account`: the accounting stage. It reads jobs, steps, findings, drain results and
the node census, and keeps the history in the store (store.py); every few minutes it computes
the live figures over a trailing window and exports them to Prometheus.

One process, not a consumer group: the store is one file, and the stage reads every partition of
its topics with a plain reader. Each polled batch is applied in one transaction together with the
next offset of every partition it came from, so a stage killed at any moment resumes exactly
after its last commit: nothing is counted twice, nothing skipped. A record that does not decode,
or a finding or drain result whose signature does not verify, goes to the dead-letter topic, is
counted, and changes nothing; it never stops the records behind it. A batch's dead letters are
acknowledged by the broker before its offsets are committed: a stage killed, or a broker that
does not take them, reads the batch again (its dead letters sent again, nothing counted twice)
rather than losing them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import Counter, Gauge

from fleetwatch import schemas, signing, topics
from fleetwatch.bus import Bus, Producer, Reader, Record, TopicPart
from fleetwatch.deadletter import send_deadletter
from fleetwatch.detectors import findings as finding_sig
from fleetwatch.pipeline.reliability import report
from fleetwatch.pipeline.reliability.attribution import Window
from fleetwatch.pipeline.reliability.figures import FigureConfig
from fleetwatch.pipeline.reliability.ingest import Ingest, IngestConfig, clock_skew
from fleetwatch.pipeline.reliability.store import Progress, Store

log = logging.getLogger(__name__)

DEADLETTER_FLUSH_S = 30.0  # how long a batch waits for its dead letters to be acknowledged


class DeadLettersUnsent(RuntimeError):
    """The broker did not acknowledge a batch's dead letters: the batch is not committed."""


RECORDS = Counter(
    "fleetwatch_accounting_records_total", "records the accounting stage read", ["topic", "outcome"]
)
LAG = Gauge("fleetwatch_accounting_behind_records", "records on the stage's topics not read yet", ["topic"])
REFRESHED = Gauge(
    "fleetwatch_reliability_refreshed_timestamp_seconds", "when the live figures were last computed"
)
REFRESH_S = Gauge("fleetwatch_reliability_refresh_seconds", "how long computing the live figures took")
WINDOW_S = Gauge("fleetwatch_reliability_window_seconds", "the trailing window of the live figures")
R_F = Gauge(
    "fleetwatch_reliability_failure_rate_per_1000_node_days",
    "infrastructure failures per 1000 node-days of runtime (scope large: runs of more than 128 GPUs)",
    ["scope", "component"],
)
R_F_CI = Gauge(
    "fleetwatch_reliability_failure_rate_ci_per_1000_node_days",
    "95% interval of r_f (scope large)",
    ["bound"],
)
JOB_ENDS = Gauge("fleetwatch_reliability_job_ends", "job ends in the window by category", ["category"])
INFRA = Gauge("fleetwatch_reliability_infra_failures", "infrastructure failures in the window", ["component"])
MTTF = Gauge("fleetwatch_reliability_mttf_hours", "measured job MTTF by GPU bucket", ["gpus"])
MTTF_PROJ = Gauge("fleetwatch_reliability_projected_mttf_hours", "MTTF projected from r_f", ["gpus"])
ETTR = Gauge("fleetwatch_reliability_ettr", "measured ETTR of long jobs: quantiles", ["quantile"])
LOST = Gauge("fleetwatch_reliability_lost_gpu_hours", "GPU-hours lost in the window", ["kind", "cause"])
LEMONS = Gauge("fleetwatch_reliability_lemon_nodes", "lemon nodes in the window")
QUALITY = Gauge("fleetwatch_reliability_data_quality", "data-quality lines in the window", ["what"])


@dataclass(frozen=True)
class StageTopics:
    jobs: str = topics.JOBS
    steps: str = topics.STEPS
    findings: str = topics.FINDINGS
    drain_results: str = topics.DRAIN_RESULTS
    nodes: str = topics.NODES
    slurm_nodes: str = topics.SLURM_NODES

    def all(self) -> list[str]:
        return [self.jobs, self.steps, self.findings, self.drain_results, self.nodes, self.slurm_nodes]

    def signed_by_the_adapter(self) -> tuple[str, str]:
        """The topics the drain key verifies: read only with it."""
        return (self.drain_results, self.slurm_nodes)


class Accounting:
    """Applies polled records to the store (no Kafka calls but dead letters: unit-testable)."""

    def __init__(
        self,
        store: Store,
        ingest: Ingest,
        census_key: bytes,
        drain_key: bytes | None,
        dead_letters: Producer | None,
        names: StageTopics | None = None,
    ) -> None:
        self.store = store
        self.ingest = ingest
        self.census_key = census_key
        self.drain_key = drain_key
        self.dead_letters = dead_letters
        self.t = names or StageTopics()
        self._counted: list[tuple[str, str]] = []

    def topics_read(self) -> list[str]:
        """The topics the stage reads: the adapter's (drain results, Slurm's node view) only with
        the key to verify them (read without it, their offsets would be kept, and the records lost
        once the key is given)."""
        adapters = self.t.signed_by_the_adapter()
        return [t for t in self.t.all() if t not in adapters or self.drain_key is not None]

    def apply(self, records: Sequence[Record], now: float) -> None:
        offsets: dict[tuple[str, int], int] = {}
        read = set(self.topics_read())
        # the data's own time: the broker's, never a producer's CreateTime (findings and the census
        # keep the writer's timestamp, which any writer sets: one stamped 2100 would expire every
        # waiting step); a batch with none expires nothing
        data_now = max(
            (r.timestamp_ms / 1000 for r in records if r.log_append and r.timestamp_ms >= 0), default=None
        )
        self._counted = []  # (topic, what) of each record, counted once the batch commits
        with self.store.transaction() as db:
            progress: dict[str, tuple[list[str], list[Progress]]] = {}
            refused = False
            for r in records:
                if r.topic not in read:
                    self._counted.append((r.topic, "not_read"))
                    continue  # its offset is not kept: read once the stage can
                offsets[(r.topic, r.partition)] = r.offset + 1
                try:
                    self._one(db, r, progress)
                except schemas.MessageError as e:
                    # dated by the broker where it took the record, else by this reader's clock
                    when = r.timestamp_ms / 1000 if r.log_append and r.timestamp_ms >= 0 else now
                    self._refuse(db, r, e.reason, str(e), when)
                    refused = True
            for job, (nodes, steps) in progress.items():
                self.ingest.progress(db, job, nodes, steps)
            if data_now is not None:
                self.ingest.expire(db, data_now)
            # the dead letters acknowledged before the offsets that forget their records are kept
            # (raised: the transaction rolls back, the batch is read again)
            if refused and self.dead_letters is not None:
                unsent = self.dead_letters.flush(DEADLETTER_FLUSH_S)
                if unsent:
                    raise DeadLettersUnsent(f"{len(unsent)} dead letters not acknowledged by Kafka")
            self.store.save_offsets(db, offsets)
        for topic, what in self._counted:
            RECORDS.labels(topic, what).inc()

    def _one(self, db: Any, r: Record, progress: dict[str, tuple[list[str], list[Progress]]]) -> None:
        broker_ts = r.timestamp_ms / 1000 if r.log_append and r.timestamp_ms >= 0 else None
        if r.value is None:
            self._counted.append((r.topic, "tombstone"))
            return  # a compacted topic forgetting a key: the history keeps what it had
        if r.topic == self.t.jobs:
            m = schemas.decode(r.value, schemas.JOB, key=r.key)
            self.ingest.job(db, m, broker_ts)
        elif r.topic == self.t.steps:
            m = schemas.decode(r.value, schemas.STEP, key=r.key)
            skew = _add_step(progress, m, broker_ts, self.ingest.cfg)
            if skew is not None and broker_ts is not None:
                self.ingest.count_skew(db, skew, f"step of {m['job']} rank {m['rank']}", m["ts"], broker_ts)
        elif r.topic == self.t.findings:
            m = schemas.decode(r.value, schemas.FINDING, key=r.key)
            why = finding_sig.signature_error(m, self.census_key)
            if why is not None:
                raise schemas.MessageError(*why)
            self.ingest.finding(db, m, broker_ts)
        elif r.topic == self.t.drain_results and self.drain_key is not None:
            m = schemas.decode(r.value, schemas.DRAIN_RESULT, key=r.key)
            # signed as drain/1 is (alerts/drain_request.py): the field `signature`
            if not signing.verify(m, self.drain_key, "signature"):
                raise schemas.MessageError(
                    "bad_signature", "drain_result/1 does not verify under the drain key"
                )
            self.ingest.drain_result(db, m)
        elif r.topic == self.t.slurm_nodes and self.drain_key is not None:
            m = schemas.decode(r.value, schemas.SLURM_NODE, key=r.key)
            if not signing.verify(m, self.drain_key, "signature"):  # as act verifies it
                raise schemas.MessageError(
                    "bad_signature", "slurm_node/1 does not verify under the drain key"
                )
            self.ingest.slurm_view(db, m)
        elif r.topic == self.t.nodes:
            m = schemas.decode(r.value, schemas.NODE, key=r.key)
            if not signing.verify(m, self.census_key):  # False without a `sig`
                raise schemas.MessageError("bad_signature", "node/1 does not verify under the census key")
            if not m.get("gone"):  # a node forgotten by the census stays in the history
                self.ingest.node(db, m)
        else:
            return
        self._counted.append((r.topic, "applied"))

    def _refuse(self, db: Any, r: Record, reason: str, detail: str, now: float) -> None:
        self._counted.append((r.topic, "refused"))
        self.store.count_quality(db, f"refused:{r.topic}:{reason}", now, detail[:200])
        if self.dead_letters is not None:
            send_deadletter(
                self.dead_letters,
                r.value,
                reason,
                detail,
                f"account:{r.topic}:{r.partition}:{r.offset}",
                r.topic,
            )


def _add_step(
    progress: dict[str, tuple[list[str], list[Progress]]],
    m: dict[str, Any],
    broker_ts: float | None,
    cfg: IngestConfig,
) -> str | None:
    """Queue a step report's progress mark; returns its data-quality line (a clock skew) if any."""
    ts = float(m["ts"])
    skew = clock_skew(ts, broker_ts, cfg)
    if skew == "clock_ahead" and broker_ts is not None:
        ts = broker_ts + cfg.max_ahead_s  # a rank's clock ahead: the broker's time bounds it
    ckpt_ts = m.get("checkpoint_ts")
    if ckpt_ts is not None:
        ckpt_ts = min(float(ckpt_ts), ts)
    nodes, marks = progress.setdefault(m["job"], ([], []))
    nodes.append(m["node"])
    marks.append(Progress(ts, ts, ckpt_ts, m.get("checkpoint_step"), m.get("checkpoint_write_s")))
    return skew


# ---------------------------------------------------------------------- the live figures


def export(figs: dict[str, Any], window_s: float) -> None:
    """The report's live subset as gauges (cleared first: a component gone from the window goes)."""
    for g in (R_F, JOB_ENDS, INFRA, MTTF, MTTF_PROJ, LOST, QUALITY, ETTR, R_F_CI):
        g.clear()
    WINDOW_S.set(window_s)
    rf = figs["r_f_per_1000_node_days"]
    for scope, d in (("large", rf), ("all", rf["all_sizes"])):
        if d["total"] is not None:
            R_F.labels(scope, "all").set(d["total"])
        for comp, v in d["by_component"].items():
            if v is not None:
                R_F.labels(scope, comp).set(v)
    for bound in ("ci_low", "ci_high"):
        if rf[bound] is not None:
            R_F_CI.labels(bound.removeprefix("ci_")).set(rf[bound])
    for cat, n in figs["taxonomy"]["by_category"].items():
        JOB_ENDS.labels(cat).set(n)
    for comp, n in figs["taxonomy"]["infra_failures_by_component"].items():
        INFRA.labels(comp).set(n)
    for row in figs["mttf_by_gpus"]:
        if row["mttf_h"] is not None:
            MTTF.labels(str(row["gpus"])).set(row["mttf_h"])
        if row["projected_mttf_h"] is not None:
            MTTF_PROJ.labels(str(row["gpus"])).set(row["projected_mttf_h"])
    values = sorted(j["ettr"] for j in figs["ettr"]["jobs"])
    if values:
        for q in (0.1, 0.5, 0.9):
            ETTR.labels(str(q)).set(values[min(len(values) - 1, int(q * len(values)))])
    lost = figs["lost_gpu_hours_by_cause"]
    for kind in ("lost_progress", "restart"):
        for cause, v in lost[kind].items():
            LOST.labels(kind, cause).set(v)
    LOST.labels("drained", "all").set(lost["drained"])
    LEMONS.set(len(figs["lemons"]["lemons"]))
    for line in figs["data_quality"]:
        QUALITY.labels(line["what"]).set(line["count"])
    REFRESHED.set(time.time())
    REFRESH_S.set(figs.get("compute_s", 0.0))


class LiveFigures(threading.Thread):
    """Recomputes the figures over the trailing window every `every_s`, on its own connection
    (SQLite's WAL lets it read while the stage writes)."""

    def __init__(self, path: str, window_s: float, every_s: float, window: Window, cfg: FigureConfig) -> None:
        super().__init__(name="live-figures", daemon=True)
        self.path, self.window_s, self.every_s = path, window_s, every_s
        self.window, self.cfg = window, cfg
        self._stopping = threading.Event()

    def run(self) -> None:
        store = Store(self.path)
        try:
            while not self._stopping.is_set():
                now = time.time()
                try:
                    with store.reading():
                        figs = report.build(store, now - self.window_s, now, self.window, self.cfg)
                    export(figs, self.window_s)
                except Exception:
                    log.exception("computing the live reliability figures failed; the last ones stand")
                self._stopping.wait(self.every_s)
        finally:
            store.close()

    def stop(self) -> None:
        self._stopping.set()


# ---------------------------------------------------------------------- the loop


class _Waitable(Protocol):
    """A stop signal: threading.Event or fleetwatch.runtime.StopFlag (wait(0) is True once set)."""

    def wait(self, seconds: float) -> bool: ...


def partitions(reader: Reader, names: Sequence[str]) -> list[TopicPart]:
    return [TopicPart(t, p) for t in names for p in reader.partitions(t)]


def _from_stored(reader: Reader, accounting: Accounting, tps: list[TopicPart]) -> None:
    """Read `tps` from the offsets the store committed (a partition it has none of: from 0)."""
    stored = accounting.store.offsets()
    reader.assign(tps, {tp: stored.get((tp.topic, tp.partition), 0) for tp in tps})


def run_loop(
    bus: Bus,
    accounting: Accounting,
    stop: _Waitable,
    idle_exit_s: float | None = None,
    rescan_s: float = 60.0,
) -> None:
    """Poll every partition of the stage's topics from the stored offsets, apply, repeat; new
    partitions are picked up every `rescan_s`."""
    reader = bus.reader()
    names = accounting.topics_read()
    try:
        tps = partitions(reader, names)
        _from_stored(reader, accounting, tps)
        last_data = time.monotonic()
        last_scan = -rescan_s  # the first pass measures the lag at once
        backoff = 1.0
        while not stop.wait(0):
            records = reader.poll(0.5, max_records=5000)
            now = time.time()
            if records:
                try:
                    accounting.apply(records, now)
                    backoff = 1.0
                except DeadLettersUnsent as e:
                    # buffered in Kafka, not dropped: the stage holds here until the dead-letter
                    # topic takes them (the lag below says how far behind it falls meanwhile)
                    log.warning("%s: reading the batch again in %.0f s", e, backoff)
                    _from_stored(reader, accounting, tps)
                    stop.wait(backoff)
                    backoff = min(backoff * 2, 60.0)
                last_data = time.monotonic()
            elif idle_exit_s is not None and time.monotonic() - last_data > idle_exit_s:
                return
            if time.monotonic() - last_scan > rescan_s:
                last_scan = time.monotonic()
                ends = reader.end_offsets(tps)
                for t in names:
                    LAG.labels(t).set(
                        sum(max(0, ends[tp] - reader.position(tp)) for tp in tps if tp.topic == t)
                    )
                fresh = partitions(reader, names)
                if set(fresh) != set(tps):
                    tps = fresh
                    _from_stored(reader, accounting, tps)
    finally:
        reader.close()
