"""A Kafka consumer-group worker that runs stages (pipeline/tasks.py) over their partitions.

One loop: poll a batch, decode and validate each record (bad ones go to the dead-letter topic,
counted by reason), hand each partition's messages to its task, produce the outputs, wait until
every one is acknowledged, and only then commit the input offsets (asynchronously; synchronously
on close): at-least-once, and outputs carry stable ids so a replayed batch
yields duplicates that downstream drops. Task state is snapshotted to the
compacted state topic every `snapshot_every_s` and when partitions are revoked; a worker
that takes a partition over restores the snapshot and resumes from the offsets stored in it
(inside the rebalance callback, on the worker's thread: the client heartbeats on its own).
A stage can also be told each batch's partitions before its tasks run (Stage.begin_batch) and do
time-driven work between batches (Stage.tick, produced like a batch's outputs): act runs so.

Kafka is reached through fleetwatch.bus (confluent-kafka on the real broker, an in-memory bus in
unit tests); docs/ARCHITECTURE.md gives the commit and snapshot sequence step by step.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from prometheus_client import Counter, Gauge, Histogram

from fleetwatch import schemas, topics
from fleetwatch.bus import Bus, Outgoing, TopicPart
from fleetwatch.bus.kafka import KafkaBus
from fleetwatch.bus.partitioner import partition_for
from fleetwatch.deadletter import send_deadletter
from fleetwatch.pipeline import fleet_metrics
from fleetwatch.pipeline.state_store import (
    LOST_REASONS,
    Snapshot,
    check_offsets,
    read_snapshots,
    write_snapshot,
)
from fleetwatch.pipeline.tasks import Output, Refused, Stage, Task
from fleetwatch.record_block import RecordBlock
from fleetwatch.runtime import StopFlag, gc_paused

log = logging.getLogger(__name__)

CONSUMED = Counter("fleetwatch_worker_messages_total", "input messages processed", ["group", "topic"])
REJECTED = Counter(
    "fleetwatch_worker_rejected_total", "input messages rejected", ["group", "topic", "reason"]
)
PRODUCED = Counter("fleetwatch_worker_outputs_total", "messages produced", ["group", "topic"])
BATCH_SECONDS = Histogram(
    "fleetwatch_worker_batch_seconds",
    "time to process one polled batch, decode to commit",
    ["group"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
COMMIT_FAILURES = Counter(
    "fleetwatch_worker_commit_failures_total",
    "offset commits that failed (their input is replayed)",
    ["group"],
)
PARTITIONS = Gauge(
    "fleetwatch_worker_partitions",
    "input partitions this worker owns (0 while joining, or with more workers than partitions)",
    ["group"],
)
STATE_LOST = Counter(
    "fleetwatch_worker_state_lost_total",
    "partitions whose snapshot existed but could not be restored (they start cold)",
    ["group", "stage", "reason"],
)
SNAPSHOTS = Counter("fleetwatch_worker_snapshots_total", "state snapshots written", ["group", "stage"])
INTERNAL_ERRORS = Counter(
    "fleetwatch_worker_internal_errors_total",
    "records whose handling raised an unexpected exception (dead-lettered as internal_error, the "
    "exception named in the dead letter's detail and the log)",
    ["group", "stage"],
)
# A task restored from a snapshot whose records then raise this many times in a row, each on its
# own, with none handled in between: the state, not the records, is what fails (a snapshot its
# stage loads but cannot run on), and the partition starts cold instead of dead-lettering all
# its input one record at a time for good.
# how much longer --idle-exit waits for the first assignment (a join is not idleness)
JOIN_WAIT_S = 30.0
FAILING_STATE_RECORDS = 10
# Every output is checked against this before it is produced: an output the broker would refuse
# (Kafka's default max.message.bytes is 1 MiB) would stop the worker before it commits, on every
# restart. Detectors bound their findings far below it (detectors/findings.py).
MAX_OUTPUT_BYTES = 512 * 1024


class OutputTooLarge(RuntimeError):
    """A task produced an output over MAX_OUTPUT_BYTES: a detector bug, handled as one."""


class Worker:
    def __init__(
        self,
        bus: Bus | str,
        group: str,
        stages: Sequence[Stage],
        *,
        snapshot_every_s: float = 30.0,
        max_poll_records: int = 2000,
        client_id: str | None = None,
        clock: Callable[[], float] = time.time,
        start_at: str = "earliest",
        session_timeout_ms: int = 10000,
        heartbeat_interval_ms: int | None = None,
        instance_id: str | None = None,
        poll_stall_s: float = 120.0,
        on_poll_stall: Callable[[float], None] | None = None,
    ) -> None:
        """bus: the Kafka interface (a bootstrap address: the real broker there).

        start_at: where a group with no committed offset begins ("earliest" or "latest").
        instance_id: static group membership (see Bus.group_consumer).

        poll_stall_s: run() treats a consumer poll() that has not returned for this long as a
        client stall and calls on_poll_stall(seconds), by default exiting the process (see
        _watch_polls)."""
        self.bus: Bus = KafkaBus(bus) if isinstance(bus, str) else bus
        self.poll_stall_s = poll_stall_s
        self.on_poll_stall = on_poll_stall or _exit_for_restart
        self._poll_started: float | None = None  # monotonic start of the poll() in progress
        self.group = group
        self.stages = {s.name: s for s in stages}
        self.topic_stage = {t: s for s in stages for t in s.inputs}
        self.snapshot_every_s = snapshot_every_s
        self.max_poll_records = max_poll_records
        self.clock = clock
        self.tasks: dict[tuple[str, int], Task] = {}
        # input offsets each task's newest snapshot reflects (where to resume after a restore)
        self._snap_offsets: dict[tuple[str, int], dict[str, int]] = {}
        # the chunk numbers the state topic holds for each task's key (pipeline/state_store.py): the
        # next snapshot deletes those past its own
        self._chunks_on_topic: dict[tuple[str, int], set[int]] = {}
        # tasks of revoked partitions, kept in case the rebalance hands them straight back
        self._parked: dict[tuple[str, int], Task] = {}
        self._parked_offsets: dict[TopicPart, int] = {}  # where each parked task's input resumes
        # partitions whose task raised (_quarantine), to rebuild from its snapshot before the next poll
        self._restoring: set[TopicPart] = set()
        self.offsets: dict[TopicPart, int] = {}  # next offset to process, per owned partition
        # Internal errors (see _quarantine): records dead-lettered because handling them raised, to
        # skip when their partition is replayed; and per partition the offsets of a batch that
        # raised, to replay one record at a time until the one that raises is found.
        self._poison: dict[TopicPart, set[int]] = {}
        self._suspect: dict[TopicPart, tuple[int, int]] = {}
        # tasks restored from a snapshot (not started cold), how many records in a row raised on
        # each since it last handled one, and those whose snapshot is no longer to be trusted
        self._from_snapshot: set[tuple[str, int]] = set()
        self._failing: dict[tuple[str, int], int] = {}
        self._distrusted: set[tuple[str, int]] = set()
        self._last_snapshot = time.monotonic()
        # Set once deliver() gave up: the tasks then hold a batch whose outputs were never produced,
        # so from then on nothing is snapshotted or committed (close() included); the successor
        # replays that batch from the last snapshot.
        self._undelivered = False
        self._last_tick = dict.fromkeys(self.stages, -float("inf"))  # monotonic, per stage (Stage.tick)
        self._rebalanced_at = time.monotonic()  # when partitions were last assigned
        self._ever_assigned = False
        # Exported at 0 from the start: a member stuck in its first join shows 0 partitions (the
        # rule FleetwatchGroupOwnsNoPartitions sees it), and increase() sees the first lost state.
        PARTITIONS.labels(group)
        for name in self.stages:
            INTERNAL_ERRORS.labels(group, name)
            for reason in LOST_REASONS:
                STATE_LOST.labels(group, name, reason)
        for stage in stages:  # compiled kernels load before the member joins (not in its first batch)
            if stage.warm_up is not None:
                stage.warm_up()
        self.producer = self.bus.producer()
        self.consumer = self.bus.group_consumer(
            group,
            client_id=client_id or f"{group}-worker",
            start_at=start_at,
            session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=heartbeat_interval_ms,
            instance_id=instance_id,
            on_commit_failure=self._on_commit_failure,
        )
        self.consumer.subscribe(sorted(self.topic_stage), self._on_assign, self._on_revoke, self._on_lost)

    # ------------------------------------------------------------ what this member owns

    def owned(self, stage: str) -> dict[int, Task]:
        """The tasks of `stage` this member owns now, by partition (a copy: the worker alone changes
        its tasks). Revoked tasks kept for a quick hand-back and tasks being rebuilt are not owned."""
        return {p: task for (name, p), task in self.tasks.items() if name == stage}

    def partition_count(self, stage: str) -> int:
        """How many partitions the stage's inputs have (they are co-partitioned); 0 if unknown."""
        return self.consumer.partition_count(self.stages[stage].inputs[0])

    def task_for_key(self, stage: str, key: bytes) -> Task | None:
        """The owned task of `stage` whose partition holds the records keyed `key` (the producers'
        partitioner, fleetwatch/bus/partitioner.py), None if another member owns it or the
        partition count is not known yet."""
        n = self.partition_count(stage)
        return self.tasks.get((stage, partition_for(key, n))) if n > 0 else None

    # ------------------------------------------------------------ rebalance

    def _state_name(self, stage: str) -> str:
        # State belongs to a consumer group: two pipelines on one cluster must not share it.
        return f"{self.group}/{stage}"

    def _task_key(self, tp: TopicPart) -> tuple[str, int]:
        """The task an input partition feeds: (stage name, partition number)."""
        return (self.topic_stage[tp.topic].name, tp.partition)

    def _on_assign(self, assigned: list[TopicPart]) -> dict[TopicPart, int]:
        """_assign, all or nothing: where it raises (the state topic or the group coordinator out
        of reach), no task of these partitions is kept and the exception goes to the bus, which
        reads none of them until a retry succeeds (fleetwatch/bus). State is never restored from
        half a rebalance."""
        try:
            return self._assign(assigned)
        except BaseException:
            keys = {self._task_key(tp) for tp in assigned}
            for key in keys:
                _close(self.tasks.pop(key, None))
                self._snap_offsets.pop(key, None)
                self._chunks_on_topic.pop(key, None)
            for task in self._parked.values():
                _close(task)
            self._parked, self._parked_offsets = {}, {}
            for tp in assigned:
                self.offsets.pop(tp, None)
                self._restoring.discard(tp)
            raise

    def _assign(self, assigned: list[TopicPart]) -> dict[TopicPart, int]:
        """The partitions this member now owns: their tasks, and the offset each input is read
        from. A task revoked a moment ago and handed straight back resumes where its state ends
        (the commit made at revocation may not have landed); any other is restored from its
        snapshot (this runs on the worker's thread, and the client heartbeats on its own, so a
        long restore does not cost the membership)."""
        starts: dict[TopicPart, int] = {}
        anchor: set[tuple[str, int]] = set()
        restore: list[TopicPart] = []
        unknown: list[TopicPart] = []  # handed back without an offset of its own
        for tp in assigned:
            key = self._task_key(tp)
            if key in self._parked:
                self.tasks[key] = self._parked.pop(key)
            if key in self.tasks:
                off = self._parked_offsets.pop(tp, None)
                if off is None:
                    unknown.append(tp)
                else:
                    starts[tp] = self.offsets[tp] = off
                anchor.add(key)
            else:
                restore.append(tp)
        for tp, off in self.consumer.group_offsets(unknown).items():
            starts[tp] = self.offsets[tp] = off
        for task in self._parked.values():  # revoked and not handed back: gone to another worker
            _close(task)
        self._parked = {}
        self._parked_offsets = {}
        loaded, fresh = self._load(restore)
        starts.update(loaded)
        self._anchor(anchor | fresh)
        self._rebalanced_at = time.monotonic()
        self._ever_assigned = True
        PARTITIONS.labels(self.group).inc(len(assigned))
        log.info("assigned %s", sorted(f"{tp.topic}:{tp.partition}" for tp in assigned))
        return starts

    def _load(self, parts: list[TopicPart]) -> tuple[dict[TopicPart, int], set[tuple[str, int]]]:
        """Build the tasks of these partitions from their snapshots (one pass over the state
        topic): (the offset each input resumes from, where its task's state ends; the tasks to
        anchor). A task with no snapshot starts where the group stands, and is to be anchored."""
        if not parts:
            return {}, set()
        keys = {self._task_key(tp) for tp in parts}
        names = {self._state_name(s): s for s, _p in keys}
        stored: dict[tuple[str, int], set[int]] = {}
        snaps = read_snapshots(
            self.bus,
            [(self._state_name(s), p) for s, p in keys],
            on_lost=lambda key, why: STATE_LOST.labels(self.group, names[key[0]], why).inc(),
            stored=stored,
        )
        for name, p in sorted(keys):
            stage = self.stages[name]
            snap = snaps[(self._state_name(name), p)]
            self._chunks_on_topic[(name, p)] = stored.get((self._state_name(name), p), set())
            if (name, p) in self._distrusted:  # counted when it was found out (_quarantine)
                self._distrusted.discard((name, p))
                snap = None
            task = None if snap is None else self._restored(name, p, snap)
            if task is None:
                self.tasks[(name, p)] = stage.new_task(p)
                self._snap_offsets[(name, p)] = {}
                self._from_snapshot.discard((name, p))
            else:
                self.tasks[(name, p)] = task
                self._from_snapshot.add((name, p))
                self._snap_offsets[(name, p)] = snap.offsets
                log.info(
                    "restored %s partition %d from a snapshot of %.0f s ago",
                    name,
                    p,
                    time.time() - snap.written_at,
                )
        starts: dict[TopicPart, int] = {}
        unknown: list[TopicPart] = []
        for tp in parts:
            # The state reflects input up to here; reprocess from there (duplicates carry the same
            # ids) rather than from a later committed offset, which would skip input.
            resume = self._snap_offsets[self._task_key(tp)].get(tp.topic)
            if resume is None:
                unknown.append(tp)
            else:
                starts[tp] = resume
        anchor = set()
        for tp, off in self.consumer.group_offsets(unknown).items():
            starts[tp] = self.offsets[tp] = off
            anchor.add(self._task_key(tp))
        return starts, anchor

    def _restored(self, name: str, partition: int, snap: Snapshot) -> Any:
        """The task of a snapshot, or None where the stage cannot load it (a bug, a snapshot no
        release this one reads wrote, or offsets that are not of this stage's inputs): that
        partition starts cold, counted and logged, rather than stopping the worker on every
        restart."""
        stage = self.stages[name]
        try:
            check_offsets(snap.offsets, stage.inputs)
            return stage.load_task(partition, snap.state)
        except Exception:
            log.exception(
                "could not restore %s partition %d from its snapshot; it starts cold", name, partition
            )
            STATE_LOST.labels(self.group, name, "unreadable").inc()
            return None

    def _anchor(self, keys: set[tuple[str, int]]) -> None:
        """Snapshot these tasks at once, with the offsets they start from, before they process
        anything: a worker that crashes before its first periodic snapshot still leaves its
        successor a place to replay from (else the successor would start at the committed offset
        with none of this state)."""
        if keys:
            self._snapshot(keys, reset_timer=False)
            self.producer.flush(timeout_s=30)

    def _restore(self) -> None:
        """Rebuild the tasks of partitions whose handling raised (_quarantine) from their last
        snapshots, and read their input again from where that state ends."""
        restoring = [tp for tp in self._restoring if tp in self.consumer.assignment()]
        self._restoring = set()
        loaded, fresh = self._load(restoring)
        self._anchor(fresh)
        for tp, off in loaded.items():
            self.consumer.seek(tp, off)
        self._rebalanced_at = time.monotonic()
        PARTITIONS.labels(self.group).inc(len(restoring))

    def _on_lost(self, lost: list[TopicPart]) -> None:
        """Partitions this member lost without a rebalance (its session expired, it was fenced):
        another member may own them already, and may have snapshotted past this one. Nothing is
        written for them (a snapshot here would replace that newer one, a commit would move the
        group's offsets under it); their tasks are closed, not parked: a task handed back later
        is restored from the group's latest snapshot, not resumed from this member's stale state.
        What they processed since their last snapshot is replayed (at-least-once)."""
        keys = {self._task_key(tp) for tp in lost}
        for key in keys:
            _close(self.tasks.pop(key, None))
            _close(self._parked.pop(key, None))
        self._drop(lost, keys)
        if lost:
            log.warning("lost %s", sorted(f"{tp.topic}:{tp.partition}" for tp in lost))

    def _drop(self, parts: list[TopicPart], keys: set[tuple[str, int]]) -> None:
        """Forget what this member kept of the partitions and their tasks (revoked or lost)."""
        for key in keys:
            self._snap_offsets.pop(key, None)
            self._chunks_on_topic.pop(key, None)
            self._failing.pop(key, None)
            self._distrusted.discard(key)
        PARTITIONS.labels(self.group).dec(len([tp for tp in parts if tp not in self._restoring]))
        self._restoring.difference_update(parts)
        for tp in parts:
            self.offsets.pop(tp, None)
            self._poison.pop(tp, None)
            self._suspect.pop(tp, None)

    def _on_revoke(self, revoked: list[TopicPart]) -> None:
        # Everything processed is already produced (see step()). The revoked tasks are
        # snapshotted first, and only the input of those whose snapshot the broker acknowledged
        # is committed: a task whose state could not be written leaves its input to be replayed
        # from its previous snapshot. The commit goes out asynchronously, and no owner depends on
        # it landing (a new one resumes from the snapshot's offsets, this one from the offsets it
        # remembers for its parked tasks). Nothing here raises: the tasks are parked whatever
        # became of their snapshots.
        keys = {self._task_key(tp) for tp in revoked}
        try:
            failed = self._snapshot(keys)
            if self.producer.flush(timeout_s=30):  # some snapshot (or earlier output) not acknowledged
                failed = set(keys)
            if failed:
                log.error("revoked %s without a snapshot; their input is not committed", sorted(failed))
            done = {tp: off for tp, off in self.offsets.items() if self._task_key(tp) not in failed}
            if done:  # nothing to commit on joining
                self.consumer.commit(done, asynchronous=True)
        except Exception as e:  # the broker out of reach: the next owner replays from the last snapshot
            log.error("revoking %d partitions: %s; their input is not committed", len(revoked), _describe(e))
        for key in keys:
            task = self.tasks.pop(key, None)
            if task is not None:
                self._parked[key] = task
        for tp in revoked:
            off = self.offsets.get(tp)
            if off is not None:
                self._parked_offsets[tp] = off
        self._drop(revoked, keys)
        if revoked:
            log.info("revoked %s", sorted(f"{tp.topic}:{tp.partition}" for tp in revoked))

    # ------------------------------------------------------------ main loop

    def step(self, timeout_ms: int = 200) -> int:
        """Poll, process, produce, flush, commit. Returns the number of input records handled."""
        with gc_paused():
            return self._step(timeout_ms)

    def _step(self, timeout_ms: int) -> int:
        if self._restoring:
            self._restore()
        self._poll_started = time.monotonic()
        polled = self.consumer.poll(self.max_poll_records, timeout_ms / 1000.0)
        self._poll_started = None
        if not polled:
            self._maybe_snapshot()
            return 0
        for stage in self.stages.values():
            if stage.begin_batch is not None:
                stage.begin_batch(frozenset(tp.partition for tp in polled if tp.topic in stage.inputs))
        t0 = time.perf_counter()
        handled = 0
        now = self.clock()
        out = _Outbox()
        for tp, block in polled.items():
            stage = self.topic_stage[tp.topic]
            task = self.tasks.get(self._task_key(tp))
            if task is None or tp in self._restoring:  # revoked since, or being restored (_quarantine)
                continue
            if not self._handle(tp, stage, task, block, now, out):
                continue  # an internal error: the partition's task is being restored
            last = int(block.offsets[-1])
            high = self.consumer.highwater(tp)
            if high is not None:
                fleet_metrics.CONSUMER_LAG.labels(self.group, tp.topic, str(tp.partition)).set(
                    max(0, high - last - 1)
                )
            CONSUMED.labels(self.group, tp.topic).inc(len(block))
            self.offsets[tp] = last + 1
            handled += len(block)
        self.deliver(out.items)
        # Asynchronous: a synchronous commit is a coordinator round trip per batch (~10 us a
        # message here). Outputs are already acknowledged, so a commit that is lost (crash, failure)
        # only means this batch is replayed, with the same output ids. A partition that changes
        # hands resumes from its snapshot's offsets, not from the committed one; close() commits
        # synchronously.
        self.consumer.commit(self._commit_offsets(), asynchronous=True)
        BATCH_SECONDS.labels(self.group).observe(time.perf_counter() - t0)
        self._maybe_snapshot()
        return handled

    def _handle(
        self, tp: TopicPart, stage: Stage, task: Task, block: RecordBlock, now: float, out: _Outbox
    ) -> bool:
        """Decode one partition's records, dead-letter the bad ones, run the task, queue its outputs.
        False when handling raised (see _quarantine): nothing of it is queued, the offset stays."""
        poison = self._poison.get(tp)
        if poison:  # dead-lettered already (internal errors): skipped in a replay
            block = block.subset([k for k, o in enumerate(block.offsets.tolist()) if o not in poison])
        suspect = self._suspect.get(tp)
        if len(block) and suspect is not None and block.offsets[0] <= suspect[1]:
            # the batch that raised, again: one record at a time, to find the one that raises
            parts = [block.subset([k]) for k in range(len(block))]
        else:
            parts = [block] if len(block) else []
        for part in parts:
            if not self._handle_part(tp, stage, task, part, now, out):
                return False
        if suspect is not None and len(block) and block.offsets[-1] >= suspect[1]:
            del self._suspect[tp]
        return True

    def _handle_part(
        self, tp: TopicPart, stage: Stage, task: Task, block: RecordBlock, now: float, out: _Outbox
    ) -> bool:
        if tp.topic in stage.skip_tombstones:
            block = _without_tombstones(block)
            if not len(block):
                return True
        msgs, bad = self._decode(stage, tp, block, now)
        try:
            outputs = task.process(tp.topic, msgs)
            encoded = _encode_outputs(stage, outputs)
            findings = [m for t, _k, m in outputs if t == topics.FINDINGS and m is not None]
            fleet_metrics.count_findings(findings, time.time())
        except Exception as e:  # a bug, or input no check foresaw: that record's problem only
            self._quarantine(tp, stage, block, e, out)
            return False
        if self._failing:
            self._failing.pop(self._task_key(tp), None)
        refused = getattr(task, "clock_refused", None)
        for i, e in bad:
            REJECTED.labels(self.group, tp.topic, e.reason).inc()
            send_deadletter(
                out,
                block.value(i),
                e.reason,
                e.detail,
                f"{tp.topic}:{tp.partition}:{block.offsets[i]}",
                tp.topic,
            )
            if e.skew_s is not None and refused is not None:
                refused(block.key(i), e.skew_s)
        self._dead_letter_refused(tp, block, bad, getattr(task, "refused", ()), out)
        for topic, key, value in encoded:
            out.send(topic, key=key, value=value)
            PRODUCED.labels(self.group, topic).inc()
        if tp.topic == topics.TELEMETRY:
            fleet_metrics.SAMPLES.inc(len(msgs))
        return True

    def _dead_letter_refused(
        self,
        tp: TopicPart,
        block: RecordBlock,
        bad: list[tuple[int, schemas.MessageError]],
        refused: Sequence[Refused],
        out: _Outbox,
    ) -> None:
        """Dead-letter and count what the task refused after decoding (pipeline/tasks.Refused), as
        records that fail to decode are: one of this call by its original bytes, one an earlier
        call held re-encoded (its bytes are gone)."""
        if not refused:
            return
        failed = {i for i, _e in bad}
        good = [k for k in range(len(block)) if k not in failed]  # the task's messages, in order
        for r in refused:
            REJECTED.labels(self.group, r.topic, r.reason).inc()
            if r.index is not None and r.topic == tp.topic and 0 <= r.index < len(good):
                k = good[r.index]
                raw, source = block.value(k), f"{tp.topic}:{tp.partition}:{block.offsets[k]}"
            else:
                raw, source = schemas.encode(dict(r.msg)), f"{r.topic}:{tp.partition}"
            send_deadletter(out, raw, r.reason, r.detail, source, r.topic)

    def _decode(
        self, stage: Stage, tp: TopicPart, block: RecordBlock, now: float
    ) -> tuple[Any, list[tuple[int, schemas.MessageError]]]:
        """The stage's decoder over a block: (messages, [(index, error)]). Decoding changes no state,
        so when it raises, the records are decoded one at a time and only the one that raises is
        refused (as internal_error)."""
        clock, decode = stage.clock.get(tp.topic), stage.decoder(tp.topic)
        try:
            return decode(block, now=now, clock=clock)
        except Exception as e:  # counted below, per record that raises on its own
            log.error("decoding %d records of %s:%d raised; decoding them one by one", len(block), tp.topic,
                      tp.partition, exc_info=e)  # fmt: skip
        fine: list[int] = []  # the records that do not raise alone, decoded together below
        bad: list[tuple[int, schemas.MessageError]] = []
        for k in range(len(block)):
            try:
                decode(block.subset([k]), now=now, clock=clock)
            except Exception as e:
                INTERNAL_ERRORS.labels(self.group, stage.name).inc()
                bad.append((k, schemas.MessageError("internal_error", _describe(e))))
            else:
                fine.append(k)
        msgs, refused = decode(block.subset(fine), now=now, clock=clock)  # none: the stage's empty form
        return msgs, sorted(bad + [(fine[j], e) for j, e in refused], key=lambda b: b[0])

    def _quarantine(
        self, tp: TopicPart, stage: Stage, block: RecordBlock, exc: Exception, out: _Outbox
    ) -> None:
        """Handling `block` raised. The task may have applied part of it, so it is rebuilt from its
        last snapshot and its input replayed from there (the outputs of the replay carry the ids
        they had). A single record that raises is dead-lettered as internal_error and skipped in
        the replay; a batch that raises is replayed one record at a time to find it. A rising
        fleetwatch_worker_internal_errors_total pages (FleetwatchWorkerInternalErrors): a
        systematic bug is loud, while the rest of the input goes on."""
        first, last = int(block.offsets[0]), int(block.offsets[-1])
        if len(block) == 1:  # counted once, for the record that raises on its own
            INTERNAL_ERRORS.labels(self.group, stage.name).inc()
            log.error(
                "record %s:%d:%d raised %s; dead-lettered as internal_error, restoring the partition",
                tp.topic, tp.partition, first, type(exc).__name__, exc_info=exc,
            )  # fmt: skip
            send_deadletter(
                out,
                block.value(0),
                "internal_error",
                _describe(exc),
                f"{tp.topic}:{tp.partition}:{first}",
                tp.topic,
            )
            self._poison.setdefault(tp, set()).add(first)
            key = self._task_key(tp)
            failing = self._failing[key] = self._failing.get(key, 0) + 1
            if failing >= FAILING_STATE_RECORDS and key in self._from_snapshot:
                self._distrust(key, failing)
        else:
            log.error(
                "%d records of %s:%d (offsets %d-%d) raised %s; replaying them one at a time",
                len(block), tp.topic, tp.partition, first, last, type(exc).__name__, exc_info=exc,
            )  # fmt: skip
            self._suspect[tp] = (first, last)
        self._reload(self._task_key(tp))

    def _distrust(self, key: tuple[str, int], failing: int) -> None:
        """The task's snapshot loads but every record raises on it: start the partition cold
        (counted as unreadable state, as one its stage cannot load), and hand the records it
        dead-lettered to the cold task (they were not at fault)."""
        log.error(
            "%s partition %d: %d records in a row raised on the state restored from its snapshot; "
            "the snapshot is not used, the partition starts cold",
            key[0], key[1], failing,
        )  # fmt: skip
        STATE_LOST.labels(self.group, key[0], "unreadable").inc()
        self._distrusted.add(key)
        self._failing.pop(key, None)
        for tp in [tp for tp in self._poison if self._task_key(tp) == key]:
            del self._poison[tp]

    def _reload(self, key: tuple[str, int]) -> None:
        """Drop a task and restore it from its last snapshot before the next poll (see _restore)."""
        _close(self.tasks.pop(key, None))
        self.producer.flush(timeout_s=30)  # the latest snapshot, if still in the producer's queue
        tps = [tp for tp in self.consumer.assignment() if self._task_key(tp) == key]
        for tp in tps:
            self.offsets.pop(tp, None)
        self._restoring.update(tps)
        PARTITIONS.labels(self.group).dec(len(tps))

    def _commit_offsets(self) -> dict[TopicPart, int]:
        return dict(self.offsets)

    def _on_commit_failure(self, error: Exception) -> None:
        COMMIT_FAILURES.labels(self.group).inc()
        log.warning("offset commit failed (the batch will be replayed if this worker stops): %s", error)

    def _commit_sync(self) -> None:
        if not self.offsets or self._undelivered:
            return
        try:
            self.consumer.commit(self._commit_offsets(), asynchronous=False)
        except Exception as e:  # e.g. the group already moved on: the next owner replays, same ids
            self._on_commit_failure(e)

    def deliver(self, items: list[Outgoing], attempts: int = 6) -> None:
        """Produce a batch's outputs and make sure every one was acknowledged before the input
        offsets are committed. A failed record does not raise (after a broker restart an
        idempotent producer can fail whole batches): flush() names what was not acknowledged,
        outputs and anything else sent since the last flush (a snapshot's chunks), and those are
        sent again from a fresh producer. The task already applied the batch and would not
        produce these outputs a second time: giving up would lose them, so the worker stops
        instead (its successor replays from the last snapshot)."""
        pending = items
        for attempt in range(1, attempts + 1):
            for it in pending:
                self.producer.send(*it)
            pending = self.producer.flush(timeout_s=60)
            if not pending:
                return
            log.warning("%d outputs were not acknowledged (attempt %d); resending", len(pending), attempt)
            try:
                self.producer.close(timeout_s=5)
            except Exception:  # a producer whose broker went away may fail to close cleanly
                log.debug("error closing producer", exc_info=True)
            time.sleep(min(5.0, float(attempt)))
            self.producer = self.bus.producer()
        self._undelivered = True
        raise RuntimeError(f"{len(pending)} outputs could not be produced; stopping before committing input")

    def _maybe_snapshot(self) -> None:
        if time.monotonic() - self._last_snapshot >= self.snapshot_every_s:
            self._snapshot(set(self.tasks))

    def _snapshot(self, keys: set[tuple[str, int]], reset_timer: bool = True) -> set[tuple[str, int]]:
        """Queue a snapshot of each of these tasks (the caller flushes); the tasks whose snapshot
        could not be written (its to_bytes() or the producer raised: a bug, or the broker refusing):
        their previous snapshot stays the one to restore, and the worker goes on."""
        if reset_timer:
            self._last_snapshot = time.monotonic()
        if self._undelivered:  # the tasks hold a batch whose outputs were lost: keep the last state
            return set(keys)
        failed: set[tuple[str, int]] = set()
        for key in sorted(keys):
            task = self.tasks.get(key)
            if task is None:
                continue
            stage = self.stages[key[0]]
            offsets = dict(self._snap_offsets.get(key, {}))
            for topic in stage.inputs:
                off = self.offsets.get(TopicPart(topic, key[1]))
                if off is not None:
                    offsets[topic] = off
            try:
                on_topic = self._chunks_on_topic.get(key, ())
                n = write_snapshot(
                    self.producer, self._state_name(key[0]), key[1], offsets, task.to_bytes(), on_topic
                )
            except Exception as e:
                INTERNAL_ERRORS.labels(self.group, key[0]).inc()
                log.error("could not snapshot %s partition %d: %s", key[0], key[1], _describe(e), exc_info=e)
                failed.add(key)
                continue
            self._snap_offsets[key] = offsets
            self._chunks_on_topic[key] = set(range(n))
            SNAPSHOTS.labels(self.group, key[0]).inc()
        return failed

    def run(self, stop: StopFlag, idle_exit_s: float | None = None) -> None:
        """Loop until stopped (or, for tests and eval, until idle for idle_exit_s): a batch (step),
        then the stages' ticks that are due (Stage.tick), while a watchdog reports a poll() that
        does not return (_watch_polls). Idle time
        counts from the last record or the last rebalance, whichever is later, and before the first
        assignment only after JOIN_WAIT_S more: joining the group (librdkafka's first rebalance
        waits seconds) and restoring snapshots can take longer than idle_exit_s, and is not
        idleness."""
        idle_since = time.monotonic()
        watching = threading.Event()
        watcher = threading.Thread(
            target=self._watch_polls, args=(watching,), name="poll-watchdog", daemon=True
        )
        watcher.start()
        try:
            while not stop:
                if self.step():
                    idle_since = time.monotonic()
                self._tick()
                if idle_exit_s is not None:
                    waited = time.monotonic() - max(idle_since, self._rebalanced_at)
                    if waited > idle_exit_s + (0.0 if self._ever_assigned else JOIN_WAIT_S):
                        break
        finally:
            watching.set()
            watcher.join(timeout=5)

    def _tick(self) -> None:
        """Run each stage's tick that is due (Stage.tick) while this member owns a task of it, and
        produce its outputs as a batch's: acknowledged before the next poll (deliver raises, and the
        worker stops, where they cannot be)."""
        for name, stage in self.stages.items():
            if stage.tick is None or time.monotonic() - self._last_tick[name] < stage.tick_every_s:
                continue
            if not any(key[0] == name for key in self.tasks):
                continue
            self._last_tick[name] = time.monotonic()
            encoded = _encode_outputs(stage, stage.tick())
            for topic, _key, _value in encoded:
                PRODUCED.labels(self.group, topic).inc()
            self.deliver([Outgoing(topic, key, value, None, None) for topic, key, value in encoded])

    def _watch_polls(self, done: threading.Event) -> None:
        """Report a poll() that does not return (kafka-python 3, this worker's earlier client, could
        block in poll() for good, in a join that never completed; any client can hang in a bug of
        its own). Nothing inside the process can unblock it, but a restarted process rejoins
        cleanly, and input is replayed from the snapshots' offsets (at-least-once), so by default
        the process exits for its supervisor to restart it. Our own slow work (a restore, resends
        during a broker outage) runs outside poll() and is never mistaken for a stall."""
        while not done.wait(min(5.0, self.poll_stall_s / 4)):
            started = self._poll_started
            if started is not None and (stalled := time.monotonic() - started) > self.poll_stall_s:
                log.critical(
                    "poll() has not returned for %.0f s: the Kafka client is stuck (group %s)",
                    stalled,
                    self.group,
                )
                self.on_poll_stall(stalled)
                return

    def close(self) -> None:
        """Snapshot, flush and leave the group (partitions move to the other members at once)."""
        self._snapshot(set(self.tasks))
        self.producer.flush(timeout_s=30)
        self._commit_sync()
        for task in [*self.tasks.values(), *self._parked.values()]:
            _close(task)
        self.consumer.close()
        self.producer.close(timeout_s=10)


def _close(task: Task | None) -> None:
    close = getattr(task, "close", None)
    if close:
        close()


def _exit_for_restart(stalled_s: float) -> None:
    # os._exit: the main thread is blocked inside the client, so a clean shutdown cannot run.
    log.critical("exiting so that the supervisor restarts this worker")
    logging.shutdown()
    os._exit(75)  # EX_TEMPFAIL


def _without_tombstones(block: RecordBlock) -> RecordBlock:
    """The block's records that carry a value (RecordBlock.starts is -1 for a null one)."""
    keep = np.flatnonzero(block.starts >= 0)
    return block if len(keep) == len(block) else block.subset(keep)


def _encode_outputs(stage: Stage, outputs: list[Output]) -> list[tuple[str, bytes | None, bytes | None]]:
    """A task's outputs as (topic, key, value) to produce, each written by its topic's serializer."""
    return [
        (topic, key.encode() if key else None, _encode(msg, stage.serializer(topic)))
        for topic, key, msg in outputs
    ]


def _encode(msg: dict[str, Any] | None, serialize: Callable[[dict[str, Any]], bytes]) -> bytes | None:
    """An output's value, written by its topic's serializer (Stage.serializer); None (a tombstone:
    a compacted topic forgets the key) stays None."""
    if msg is None:
        return None
    value = serialize(msg)
    if len(value) > MAX_OUTPUT_BYTES:
        raise OutputTooLarge(f"a {msg.get('schema')} output of {len(value)} bytes (limit {MAX_OUTPUT_BYTES})")
    return value


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e)[:300]}"


class _Outbox:
    """Collects a batch's outputs (send() like a producer's) so that they are delivered and
    checked together before the input offsets are committed."""

    def __init__(self) -> None:
        self.items: list[Outgoing] = []

    def send(
        self, topic: str, key: bytes | None = None, value: bytes | None = b"", headers: Any = None
    ) -> None:
        self.items.append(Outgoing(topic, key, value, headers, None))
