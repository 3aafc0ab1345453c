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
"""

from __future__ import annotations

import enum
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge

from fleetwatch.alerts.alert_model import AlertBook, AlertRecord, rfc3339
from fleetwatch.deadletter import send_deadletter

log = logging.getLogger(__name__)

SENT = Counter("fleetwatch_act_alerts_sent_total", "alerts accepted by Alertmanager (incl. re-sends)")
FAILED = Counter(
    "fleetwatch_act_alerts_failed_total", "alerts not delivered because Alertmanager was unavailable"
)
DROPPED = Counter("fleetwatch_act_alerts_dropped_total", "ended alerts dropped from a full buffer")
PENDING = Gauge("fleetwatch_act_alerts_pending", "alerts waiting for Alertmanager to accept them")
ACTIVE = Gauge("fleetwatch_act_alerts_active", "alerts fleetwatch holds active")
REJECTED = Counter(
    "fleetwatch_alerts_rejected", "alerts Alertmanager refused as invalid (dead-lettered)", ["reason"]
)

BATCH = 200
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
for _reason in REASONS:
    REJECTED.labels(_reason)  # exported at 0 from the start, so the first rejection is an increase


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
    def __init__(self, base_url: str, timeout_s: float = 5.0, retries: int = 1) -> None:
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
    ) -> None:
        self.client = client
        self.resend_s = resend_s
        self.max_ended = max_ended
        self.max_backoff_s = max_backoff_s
        self.clock = clock
        self.on_rejected = on_rejected
        self.retry_at = 0.0  # while Alertmanager is unavailable: no post before this (unless forced)
        self._backoff = 1.0
        self.healthy = True

    def _payload(self, rec: AlertRecord, now: float) -> dict[str, object]:
        starts, ends = rec.stamped(now, 4 * self.resend_s)
        return {
            "labels": rec.labels,
            "annotations": rec.annotations,
            "startsAt": rfc3339(starts),
            "endsAt": rfc3339(ends),
        }

    def _bound(self, books: list[AlertBook]) -> None:
        ended = [(r.ends_at, fp, b) for b in books for fp, r in b.records.items() if r.ends_at is not None]
        if len(ended) <= self.max_ended:
            return
        ended.sort(key=lambda e: e[0] or 0.0)
        for _, fp, book in ended[: len(ended) - self.max_ended]:
            del book.records[fp]
            DROPPED.inc()

    def flush(self, books: Iterable[AlertBook], force: bool = False) -> bool:
        """Post every due alert; False if Alertmanager was unavailable (the rest stay due)."""
        books = list(books)
        now = self.clock()
        self._bound(books)
        due = [(b, fp, r) for b in books for fp, r in b.records.items() if r.due(now, self.resend_s)]
        ACTIVE.set(sum(1 for b in books for r in b.records.values() if r.ends_at is None))
        PENDING.set(len(due))
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
        PENDING.set(0)
        return True

    def _deliver(self, chunk: list[Due], now: float) -> int:
        """Post `chunk`, splitting a refused one until each bad alert is alone; returns how many of
        its alerts are left undelivered because Alertmanager is unavailable."""
        result = self.client.post([self._payload(r, now) for _, _, r in chunk])
        if result.outcome is Outcome.ACCEPTED:
            self._accepted(chunk, now)
            return 0
        if result.outcome is Outcome.UNAVAILABLE:
            return len(chunk)
        if len(chunk) == 1:
            self._rejected(chunk[0], now, result.detail)
            return 0
        half = len(chunk) // 2
        left = self._deliver(chunk[:half], now)
        return left + len(chunk) - half if left else self._deliver(chunk[half:], now)

    @staticmethod
    def _accepted(chunk: list[Due], now: float) -> None:
        SENT.inc(len(chunk))
        for book, fp, rec in chunk:
            if rec.ends_at is not None:
                book.records.pop(fp, None)  # Alertmanager has the end; nothing left to say
            else:
                rec.last_sent, rec.dirty = now, False

    def _rejected(self, item: Due, now: float, detail: str) -> None:
        """Alertmanager refuses this alert alone: no retry can help, so it leaves the book."""
        book, fp, rec = item
        reason = reject_reason(detail)
        REJECTED.labels(reason).inc()
        book.records.pop(fp, None)
        log.error("Alertmanager rejected alert %s (%s): %s; dead-lettered", rec.labels, reason, detail)
        if self.on_rejected is not None:
            self.on_rejected(json.dumps(self._payload(rec, now)).encode(), reason, detail)

    def _unavailable(self, now: float, undelivered: int) -> None:
        FAILED.inc(undelivered)
        PENDING.set(undelivered)
        self.retry_at = now + self._backoff
        self._backoff = min(self._backoff * 2, self.max_backoff_s)
        if self.healthy:
            log.warning("buffering %d alerts until Alertmanager answers", undelivered)
        self.healthy = False
