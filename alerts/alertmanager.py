"""Sending alerts to Alertmanager's API v2 (POST /api/v2/alerts) with stdlib urllib.

Active alerts carry endsAt = now + 4 x the re-send period, the way Prometheus does it: if
fleetwatch stops re-sending (crash, partition) Alertmanager resolves them by itself soon after,
instead of paging forever about a state nobody confirms. Ended alerts carry endsAt = the time the
finding resolved.

An Alertmanager outage never stops the pipeline: a failed post leaves the records due (they are
the tasks' state, which is snapshotted, so a restart re-sends them too), retries back off
exponentially, and the number of ENDED alerts waiting is bounded: dropping the oldest of those
is safe because the active version Alertmanager already holds expires at its own endsAt.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable

from prometheus_client import Counter, Gauge

from alerts.alert_model import AlertBook, AlertRecord

log = logging.getLogger(__name__)

SENT = Counter("fleetwatch_act_alerts_sent_total", "alerts accepted by Alertmanager (incl. re-sends)")
FAILED = Counter("fleetwatch_act_alerts_failed_total", "alerts whose post to Alertmanager failed")
DROPPED = Counter("fleetwatch_act_alerts_dropped_total", "ended alerts dropped from a full buffer")
PENDING = Gauge("fleetwatch_act_alerts_pending", "alerts waiting for Alertmanager to accept them")
ACTIVE = Gauge("fleetwatch_act_alerts_active", "alerts fleetwatch holds active")

BATCH = 200


def rfc3339(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class AlertmanagerClient:
    def __init__(self, base_url: str, timeout_s: float = 5.0, retries: int = 1) -> None:
        self.url = base_url.rstrip("/") + "/api/v2/alerts"
        self.timeout_s = timeout_s
        self.retries = retries

    def post(self, alerts: list[dict[str, object]]) -> bool:
        """True if Alertmanager accepted the batch. A 4xx is logged and reported as False too."""
        body = json.dumps(alerts).encode()
        for attempt in range(self.retries + 1):
            req = urllib.request.Request(
                self.url, data=body, method="POST", headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    resp.read()
                return True
            except urllib.error.HTTPError as e:
                detail = e.read()[:300].decode("utf-8", "replace")
                log.warning("Alertmanager refused %d alerts: HTTP %d %s", len(alerts), e.code, detail)
                if 400 <= e.code < 500:
                    return False  # the same bytes will be refused again
            except (urllib.error.URLError, OSError, TimeoutError) as e:
                if attempt == self.retries:
                    log.warning("Alertmanager at %s unreachable: %s", self.url, getattr(e, "reason", e))
            if attempt < self.retries:
                time.sleep(0.2 * (attempt + 1))
        return False


class Dispatcher:
    """Sends what is due from a set of AlertBooks, re-sends active alerts every `resend_s`."""

    def __init__(
        self,
        client: AlertmanagerClient,
        resend_s: float = 60.0,
        max_ended: int = 10000,
        max_backoff_s: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.resend_s = resend_s
        self.max_ended = max_ended
        self.max_backoff_s = max_backoff_s
        self.clock = clock
        self._retry_at = 0.0
        self._backoff = 1.0
        self.healthy = True

    def _payload(self, rec: AlertRecord, now: float) -> dict[str, object]:
        ends = rec.ends_at if rec.ends_at is not None else now + 4 * self.resend_s
        return {
            "labels": rec.labels,
            "annotations": rec.annotations,
            "startsAt": rfc3339(rec.starts_at),
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
        """Post every due alert; False if Alertmanager did not take them (they stay due)."""
        books = list(books)
        now = self.clock()
        self._bound(books)
        due = [(b, fp, r) for b in books for fp, r in b.records.items() if r.due(now, self.resend_s)]
        ACTIVE.set(sum(1 for b in books for r in b.records.values() if r.ends_at is None))
        PENDING.set(len(due))
        if not due:
            return True
        if not force and now < self._retry_at:
            return False
        for i in range(0, len(due), BATCH):
            chunk = due[i : i + BATCH]
            if not self.client.post([self._payload(r, now) for _, _, r in chunk]):
                FAILED.inc(len(due) - i)
                self._retry_at = now + self._backoff
                self._backoff = min(self._backoff * 2, self.max_backoff_s)
                if self.healthy:
                    log.warning("buffering %d alerts until Alertmanager answers", len(due) - i)
                self.healthy = False
                return False
            SENT.inc(len(chunk))
            for book, fp, rec in chunk:
                if rec.ends_at is not None:
                    book.records.pop(fp, None)  # Alertmanager has the end; nothing left to say
                else:
                    rec.last_sent, rec.dirty = now, False
        if not self.healthy:
            log.info("Alertmanager is back; buffered alerts delivered")
        self.healthy, self._backoff, self._retry_at = True, 1.0, 0.0
        PENDING.set(0)
        return True
