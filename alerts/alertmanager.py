"""Sending alerts to Alertmanager's API v2 (POST /api/v2/alerts) with stdlib urllib.

Active alerts carry endsAt = now + 4 x the re-send period, the way Prometheus does it: if
fleetwatch stops re-sending (crash, partition) Alertmanager resolves them by itself soon after,
instead of paging forever about a state nobody confirms. Ended alerts carry endsAt = the time the
finding resolved. Both are stamped on the wall clock at the post (AlertRecord.stamped), so
startsAt <= endsAt holds whatever clock the finding's times came from.

A post has one of three outcomes (PostResult):
- accepted (2xx): the alerts are delivered;
- refused (400, 413, 422): THIS payload is bad. Alertmanager 0.25 answers 400 if any alert of a
  batch is invalid (and still stores the valid ones), so a refused batch is split in halves and
  re-posted until each bad alert is alone; every alert of an accepted half is delivered at once,
  and a lone refused alert is dropped from the book, counted by reason
  (fleetwatch_alerts_rejected_total) and handed to `on_rejected` (act: the dead-letter topic).
  A refusal never delays any other alert: no backoff, and the later chunks are posted.
- unavailable (no answer, timeout, 5xx, 429, and the other 4xx: 401/403/404/... say that the
  endpoint or a proxy in front of it is wrong, not the alerts, and bisecting would dead-letter
  every alert): the records stay due and retries back off exponentially.

An Alertmanager outage never stops the pipeline: the records are the tasks' state (snapshotted, so
a restart re-sends them too), and the number of ENDED alerts waiting is bounded: dropping the
oldest of those is safe because the active version Alertmanager already holds expires at its own
endsAt.

Nor does a slow one hold anything back. `fleetwatch act` sends through an `AlertSender`: its
decision step only queues what is due (no HTTP on the drain path), and a thread of its own posts.
The queue holds the latest state per alert (a newer version replaces a queued one), at most
`max_queued` entries: when full, a changed alert evicts the oldest queued re-send (counted; it stays
due in its book and is queued again when there is room), and anything else waits in its book. An
answer is applied to the books on the worker's thread at its next step, only if the record is still
the version that was posted. Backoff after an unavailable Alertmanager counts from the END of the
failed post, and a slow answer is not a failure: the client's timeout (act's
--alertmanager-timeout, 30 s) is well above the seconds a loaded Alertmanager takes. At exit the
sender gets a bounded time to deliver what is queued; what it could not is counted in the log and
stays in the closing snapshot, to be sent after a restart. `Dispatcher` is the same protocol,
synchronous (one flush posts everything due), for tools and tests that want the answer at once.
"""

from __future__ import annotations

import enum
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge

from fleetwatch.alerts.alert_model import AlertBook, AlertRecord, rfc3339
from fleetwatch.deadletter import send_deadletter

log = logging.getLogger(__name__)

BATCH = 200
DEFAULT_TIMEOUT_S = 30.0  # a loaded Alertmanager answers in seconds; a slow answer is not a failure
MAX_QUEUED = 10000
DEFAULT_EXIT_FLUSH_S = 5.0
REFUSED_STATUS = frozenset({400, 413, 422})  # the payload itself is wrong (413: too big, bisect helps)
DEADLETTER_REASON = "alert_rejected"

# Alertmanager's validation messages (types.Alert.Validate) -> the bounded `reason` label.
REJECT_REASONS = (
    ("start time must be before end time", "start_after_end"),
    ("start time missing", "start_missing"),
    ("invalid label set", "invalid_label"),
    ("at least one label pair required", "empty_labels"),
    ("invalid annotations", "invalid_annotation"),
)
REASONS = (*(reason for _, reason in REJECT_REASONS), "other")


class AlertMetrics:
    """What sending alerts counts, on the registry given (act's: alerts/act_metrics.py); none:
    counted, exported nowhere."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry
        self.sent = Counter(
            "fleetwatch_act_alerts_sent_total", "alerts accepted by Alertmanager (incl. re-sends)", registry=r
        )
        self.failed = Counter(
            "fleetwatch_act_alerts_failed_total",
            "alerts not delivered because Alertmanager was unavailable",
            registry=r,
        )
        self.dropped = Counter(
            "fleetwatch_act_alerts_dropped_total", "ended alerts dropped from a full buffer", registry=r
        )
        self.pending = Gauge(
            "fleetwatch_act_alerts_pending", "alerts waiting for Alertmanager to accept them", registry=r
        )
        self.active = Gauge("fleetwatch_act_alerts_active", "alerts fleetwatch holds active", registry=r)
        self.rejected = Counter(
            "fleetwatch_alerts_rejected",
            "alerts Alertmanager refused as invalid (dead-lettered)",
            ["reason"],
            registry=r,
        )
        for reason in REASONS:
            self.rejected.labels(reason)  # exported at 0 from the start: the first rejection is an increase
        self.queued = Gauge(
            "fleetwatch_act_alerts_queued", "alerts queued for, or being posted to, Alertmanager", registry=r
        )
        self.evicted = Counter(
            "fleetwatch_act_alerts_evicted_total",
            "queued re-sends evicted from the full alert queue by a changed alert "
            "(they stay due in their book)",
            registry=r,
        )


def reject_reason(detail: str) -> str:
    """The bounded reason for Alertmanager's error text about one alert."""
    return next((reason for text, reason in REJECT_REASONS if text in detail), "other")


def error_text(body: bytes) -> str:
    """Alertmanager's error body: a JSON string (validation) or {"message": ...} (parsing), cut short."""
    text = body[:2000].decode("utf-8", "replace").strip()
    try:
        doc = json.loads(text)
    except ValueError:
        return text[:300]
    if isinstance(doc, dict):
        doc = doc.get("message", text)
    return str(doc)[:300]


class Outcome(enum.Enum):
    ACCEPTED = "accepted"
    REFUSED = "refused"
    UNAVAILABLE = "unavailable"


@dataclass(frozen=True)
class PostResult:
    outcome: Outcome
    detail: str = ""  # Alertmanager's answer, or why it could not be reached


OnRejected = Callable[[bytes, str, str], None]  # (alert JSON, reason, Alertmanager's detail)


def dead_letter_alert(producer: Any, raw: bytes, reason: str, detail: str) -> None:
    """`fleetwatch act`'s OnRejected: the refused alert's JSON to fleet.deadletter.v1."""
    send_deadletter(producer, raw, DEADLETTER_REASON, f"{reason}: {detail}", "alertmanager", "alertmanager")


class AlertmanagerClient:
    def __init__(self, base_url: str, timeout_s: float = DEFAULT_TIMEOUT_S, retries: int = 1) -> None:
        self.url = base_url.rstrip("/") + "/api/v2/alerts"
        self.timeout_s = timeout_s
        self.retries = retries

    def post(self, alerts: list[dict[str, object]]) -> PostResult:
        """POST the batch; an unavailable Alertmanager is tried `retries` more times first."""
        body = json.dumps(alerts).encode()
        result = PostResult(Outcome.UNAVAILABLE)
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(0.2 * attempt)
            result = self._post_once(body)
            if result.outcome is not Outcome.UNAVAILABLE:
                return result
        log.warning("Alertmanager at %s unavailable: %s", self.url, result.detail)
        return result

    def _post_once(self, body: bytes) -> PostResult:
        req = urllib.request.Request(
            self.url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                resp.read()
            return PostResult(Outcome.ACCEPTED)
        except urllib.error.HTTPError as e:
            outcome = Outcome.REFUSED if e.code in REFUSED_STATUS else Outcome.UNAVAILABLE
            return PostResult(outcome, f"HTTP {e.code}: {error_text(e.read())}")
        except (urllib.error.URLError, OSError, TimeoutError) as e:
            return PostResult(Outcome.UNAVAILABLE, str(getattr(e, "reason", e)))


Due = tuple[AlertBook, str, AlertRecord]
T = TypeVar("T")


class AlertSink(Protocol):
    """What the actor hands its alert books to (Dispatcher, AlertSender)."""

    def flush(self, books: Iterable[AlertBook], force: bool = False) -> bool: ...


def payload(rec: AlertRecord, now: float, hold_s: float) -> dict[str, object]:
    starts, ends = rec.stamped(now, hold_s)
    return {
        "labels": rec.labels,
        "annotations": rec.annotations,
        "startsAt": rfc3339(starts),
        "endsAt": rfc3339(ends),
    }


def bound_ended(books: Sequence[AlertBook], max_ended: int) -> int:
    """Drop the oldest ENDED alerts over `max_ended` (Alertmanager expires their active version);
    returns how many were dropped."""
    ended = [(r.ends_at, fp, b) for b in books for fp, r in b.records.items() if r.ends_at is not None]
    if len(ended) <= max_ended:
        return 0
    ended.sort(key=lambda e: e[0] or 0.0)
    for _, fp, book in ended[: len(ended) - max_ended]:
        del book.records[fp]
    return len(ended) - max_ended


def post_bisecting(
    client: AlertmanagerClient,
    items: Sequence[T],
    payload_of: Callable[[T], dict[str, object]],
    accepted: Callable[[Sequence[T]], None],
    rejected: Callable[[T, str], None],
) -> int:
    """Post `items`, splitting a refused batch until each bad alert is alone. Returns how many are
    left undelivered because Alertmanager is unavailable: always the LAST ones of `items`."""
    result = client.post([payload_of(i) for i in items])
    if result.outcome is Outcome.ACCEPTED:
        accepted(items)
        return 0
    if result.outcome is Outcome.UNAVAILABLE:
        return len(items)
    if len(items) == 1:
        rejected(items[0], result.detail)
        return 0
    half = len(items) // 2
    left = post_bisecting(client, items[:half], payload_of, accepted, rejected)
    if left:
        return left + len(items) - half
    return post_bisecting(client, items[half:], payload_of, accepted, rejected)


class Dispatcher:
    """Sends what is due from a set of AlertBooks, re-sends active alerts every `resend_s`."""

    def __init__(
        self,
        client: AlertmanagerClient,
        resend_s: float = 60.0,
        max_ended: int = 10000,
        max_backoff_s: float = 60.0,
        clock: Callable[[], float] = time.time,
        on_rejected: OnRejected | None = None,
        metrics: AlertMetrics | None = None,  # `fleetwatch act`: act_metrics.exported().alerts
    ) -> None:
        self.client = client
        self.metrics = metrics or AlertMetrics()
        self.resend_s = resend_s
        self.max_ended = max_ended
        self.max_backoff_s = max_backoff_s
        self.clock = clock
        self.on_rejected = on_rejected
        self.retry_at = 0.0  # while Alertmanager is unavailable: no post before this (unless forced)
        self._backoff = 1.0
        self.healthy = True

    def _payload(self, rec: AlertRecord, now: float) -> dict[str, object]:
        return payload(rec, now, 4 * self.resend_s)

    def flush(self, books: Iterable[AlertBook], force: bool = False) -> bool:
        """Post every due alert; False if Alertmanager was unavailable (the rest stay due)."""
        books = list(books)
        now = self.clock()
        self.metrics.dropped.inc(bound_ended(books, self.max_ended))
        due = [(b, fp, r) for b in books for fp, r in b.records.items() if r.due(now, self.resend_s)]
        self.metrics.active.set(sum(1 for b in books for r in b.records.values() if r.ends_at is None))
        self.metrics.pending.set(len(due))
        if not due:
            return True
        if not force and now < self.retry_at:
            return False
        for i in range(0, len(due), BATCH):
            left = self._deliver(due[i : i + BATCH], now)
            if left:
                self._unavailable(now, left + max(0, len(due) - i - BATCH))
                return False
        if not self.healthy:
            log.info("Alertmanager is back; buffered alerts delivered")
        self.healthy, self._backoff, self.retry_at = True, 1.0, 0.0
        self.metrics.pending.set(0)
        return True

    def _deliver(self, chunk: list[Due], now: float) -> int:
        """Post `chunk`, splitting a refused one until each bad alert is alone; returns how many of
        its alerts are left undelivered because Alertmanager is unavailable."""
        return post_bisecting(
            self.client,
            chunk,
            lambda d: self._payload(d[2], now),
            lambda ok: self._accepted(ok, now),
            lambda d, detail: self._rejected(d, now, detail),
        )

    def _accepted(self, chunk: Sequence[Due], now: float) -> None:
        self.metrics.sent.inc(len(chunk))
        for book, fp, rec in chunk:
            if rec.ends_at is not None:
                book.records.pop(fp, None)  # Alertmanager has the end; nothing left to say
            else:
                rec.last_sent, rec.dirty = now, False

    def _rejected(self, item: Due, now: float, detail: str) -> None:
        """Alertmanager refuses this alert alone: no retry can help, so it leaves the book."""
        book, fp, rec = item
        reason = reject_reason(detail)
        self.metrics.rejected.labels(reason).inc()
        book.records.pop(fp, None)
        log.error("Alertmanager rejected alert %s (%s): %s; dead-lettered", rec.labels, reason, detail)
        if self.on_rejected is not None:
            self.on_rejected(json.dumps(self._payload(rec, now)).encode(), reason, detail)

    def _unavailable(self, now: float, undelivered: int) -> None:
        self.metrics.failed.inc(undelivered)
        self.metrics.pending.set(undelivered)
        self.retry_at = now + self._backoff
        self._backoff = min(self._backoff * 2, self.max_backoff_s)
        if self.healthy:
            log.warning("buffering %d alerts until Alertmanager answers", undelivered)
        self.healthy = False


@dataclass(frozen=True, slots=True)
class Queued:
    """One alert as queued: the book's record then (its identity and end name the version) and
    copies of what the sender thread reads, so that thread never touches a book."""

    book: AlertBook
    fp: str
    rec: AlertRecord
    ends_at: float | None
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: float
    changed: bool  # a change to deliver (not only a periodic re-send)

    @classmethod
    def of(cls, book: AlertBook, fp: str, rec: AlertRecord) -> Queued:
        return cls(
            book, fp, rec, rec.ends_at, dict(rec.labels), dict(rec.annotations), rec.starts_at, rec.dirty
        )

    def is_version(self, rec: AlertRecord) -> bool:
        return self.rec is rec and self.ends_at == rec.ends_at

    def current(self) -> bool:
        """The book still holds this very version (worker thread only)."""
        rec = self.book.records.get(self.fp)
        return rec is not None and self.is_version(rec)


class AlertSender:
    """Alerts beside the drain path: `flush` (the decision step) only queues, a thread posts.

    Same books, payloads, bisection, dead-lettering and backoff as `Dispatcher`; see the module
    docstring for the queue's bound and what happens to an answer."""

    def __init__(
        self,
        client: AlertmanagerClient,
        resend_s: float = 60.0,
        max_ended: int = 10000,
        max_queued: int = MAX_QUEUED,
        max_backoff_s: float = 60.0,
        clock: Callable[[], float] = time.time,
        on_rejected: OnRejected | None = None,
        start: bool = True,  # False: no thread; nothing is posted but by post_next()
        monotonic: Callable[[], float] = time.monotonic,
        metrics: AlertMetrics | None = None,  # `fleetwatch act`: act_metrics.exported().alerts
    ) -> None:
        self.client = client
        self.metrics = metrics or AlertMetrics()
        self.resend_s = resend_s
        self.max_ended = max_ended
        self.max_queued = max_queued
        self.max_backoff_s = max_backoff_s
        self.clock = clock
        self.on_rejected = on_rejected
        self.monotonic = monotonic
        self.healthy = True
        self._cv = threading.Condition()
        self._queue: OrderedDict[str, Queued] = OrderedDict()  # fingerprint -> latest version
        self._flying: dict[str, Queued] = {}
        self._answers: deque[tuple[Queued, float, str | None, bytes]] = deque()  # (item, at, refusal)
        self._retry_at = 0.0  # monotonic(): no post before this while Alertmanager is unavailable
        self._backoff = 1.0
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="alertmanager-sender", daemon=True)
        if start:
            self._thread.start()

    # ------------------------------------------------------------ worker thread

    def flush(self, books: Iterable[AlertBook], force: bool = False) -> bool:
        """Apply the answers received so far, queue what is due; never waits for Alertmanager.
        `force`: try now even while backing off. False while Alertmanager is unavailable."""
        books = list(books)
        self._apply_answers()
        now = self.clock()
        self.metrics.dropped.inc(bound_ended(books, self.max_ended))
        due = [(b, fp, r) for b in books for fp, r in b.records.items() if r.due(now, self.resend_s)]
        self.metrics.active.set(sum(1 for b in books for r in b.records.values() if r.ends_at is None))
        self.metrics.pending.set(len(due))
        with self._cv:
            # changes first: when the queue is full they may evict re-sends, never the reverse
            for b, fp, r in [d for d in due if d[2].dirty] + [d for d in due if not d[2].dirty]:
                self._enqueue(b, fp, r)
            if force:
                self._retry_at = 0.0
            self.metrics.queued.set(len(self._queue) + len(self._flying))
            self._cv.notify_all()
        return self.healthy

    def queued(self) -> list[Queued]:
        """What waits to be posted, oldest first (not what is in flight)."""
        with self._cv:
            return list(self._queue.values())

    def _enqueue(self, book: AlertBook, fp: str, rec: AlertRecord) -> None:
        held = [q for q in (self._queue.get(fp), self._flying.get(fp)) if q is not None]
        if any(q.is_version(rec) for q in held):
            return  # already on its way
        item = Queued.of(book, fp, rec)
        if fp in self._queue:  # an older version not posted yet: only the latest state matters
            self._queue[fp] = item
            self._queue.move_to_end(fp)
            return
        if len(self._queue) >= self.max_queued:
            victim = next((k for k, q in self._queue.items() if not q.changed), None) if rec.dirty else None
            if victim is None:
                return  # waits in its book, queued once there is room
            del self._queue[victim]
            self.metrics.evicted.inc()
        self._queue[fp] = item

    def _apply_answers(self) -> None:
        with self._cv:
            answers = list(self._answers)
            self._answers.clear()
        for q, at, refusal, raw in answers:
            if refusal is None:
                if q.current():
                    if q.ends_at is not None:
                        q.book.records.pop(q.fp, None)  # Alertmanager has the end; nothing left to say
                    else:
                        q.rec.last_sent, q.rec.dirty = at, False
                continue
            # Refused alone: no retry can help that version, so it leaves the book (a newer one stays).
            reason = reject_reason(refusal)
            self.metrics.rejected.labels(reason).inc()
            if q.current():
                q.book.records.pop(q.fp, None)
            log.error("Alertmanager rejected alert %s (%s): %s; dead-lettered", q.labels, reason, refusal)
            if self.on_rejected is not None:
                self.on_rejected(raw, reason, refusal)

    def close(self, books: Iterable[AlertBook], timeout_s: float = DEFAULT_EXIT_FLUSH_S) -> int:
        """Deliver what is due within `timeout_s`, stop the sender, and apply its answers to the
        books (before their closing snapshot). Returns the alerts left undelivered (logged): they
        stay in the books, so the snapshot keeps them for a restart."""
        books = list(books)
        self.flush(books, force=True)
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while (self._queue or self._flying) and time.monotonic() < deadline:
                self._cv.wait(max(0.0, deadline - time.monotonic()))
            self._stopping = True
            self._cv.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=0.1)  # a post still in flight finishes on its own (daemon)
        self._apply_answers()
        left = sum(1 for b in books for r in b.records.values() if r.dirty or r.last_sent is None)
        self.metrics.queued.set(0)
        if left:
            log.warning(
                "%d alerts not delivered to Alertmanager before exit (waited %.0f s); they are in the "
                "closing snapshot and are sent after a restart",
                left,
                timeout_s,
            )
        return left

    # ------------------------------------------------------------ sender thread

    def retry_in(self) -> float:
        """Seconds until the next post may start (0: now); backoff after an unavailable answer."""
        with self._cv:
            return max(0.0, self._retry_at - self.monotonic())

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stopping and (not self._queue or self.monotonic() < self._retry_at):
                    self._cv.wait(self._retry_at - self.monotonic() if self._queue else None)
                if self._stopping:
                    return
            self.post_next()

    def post_next(self) -> int:
        """Post the next batch of the queue now (the sender thread's step); returns its size."""
        with self._cv:
            batch: list[Queued] = []
            while self._queue and len(batch) < BATCH:
                fp, q = self._queue.popitem(last=False)
                self._flying[fp] = q
                batch.append(q)
        if batch:
            self._post(batch)
        return len(batch)

    def _post(self, batch: list[Queued]) -> None:
        now = self.clock()
        hold = 4 * self.resend_s
        answers: list[tuple[Queued, float, str | None, bytes]] = []

        def stamp(q: Queued) -> dict[str, object]:
            return payload(AlertRecord(q.labels, q.annotations, q.starts_at, q.ends_at), now, hold)

        def accepted(items: Sequence[Queued]) -> None:
            self.metrics.sent.inc(len(items))
            answers.extend((q, now, None, b"") for q in items)

        def rejected(q: Queued, detail: str) -> None:
            answers.append((q, now, detail, json.dumps(stamp(q)).encode()))

        try:
            left = post_bisecting(self.client, batch, stamp, accepted, rejected)
        except Exception:  # the sender must outlive any surprise from the HTTP stack
            log.exception("posting alerts failed")
            left = len(batch) - len(answers)
        ended = self.monotonic()
        with self._cv:
            for q in batch:
                if self._flying.get(q.fp) is q:
                    del self._flying[q.fp]
            self._answers.extend(answers)
            for q in reversed(batch[len(batch) - left :] if left else []):
                if q.fp not in self._queue:  # unless a newer version was queued meanwhile
                    self._queue[q.fp] = q
                    self._queue.move_to_end(q.fp, last=False)
            if left:
                self.metrics.failed.inc(left)
                self._retry_at = ended + self._backoff  # from the end of the failed post
                self._backoff = min(self._backoff * 2, self.max_backoff_s)
                if self.healthy:
                    log.warning("buffering %d alerts until Alertmanager answers", len(self._queue))
                self.healthy = False
            else:
                if not self.healthy:
                    log.info("Alertmanager is back; buffered alerts delivered")
                self.healthy, self._backoff = True, 1.0
            self.metrics.queued.set(len(self._queue) + len(self._flying))
            self._cv.notify_all()
