"""Moves spooled records to Kafka in order, deleting each only after the broker acknowledged it.

Delivery is at-least-once: after a failure the forwarder starts a fresh producer and resends
from the oldest unacknowledged record, so a record acknowledged late may arrive twice.
Consumers drop duplicates by (node, seq). A fresh producer per outage also resets the
idempotent producer's sequence state, which expired batches would otherwise wedge.

The producer is the bus's (fleetwatch/bus/kafka.py, librdkafka): send() queues locally and never
waits on a dead broker, a record not acknowledged within DELIVERY_TIMEOUT_S fails, and a producer
given up on is stopped through the client's public API (its queue purged).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from fleetwatch.bus import Delivery, RecordTooLarge, SendError
from fleetwatch.bus.config import BrokerUnavailable
from fleetwatch.bus.kafka import KafkaBus
from fleetwatch.collectors.spool import Spool

log = logging.getLogger(__name__)

ProducerFactory = Callable[[], Any]
DELIVERY_TIMEOUT_S = 15.0  # then the record is retried from the spool by a fresh producer
REFUSED = "refused"  # a record Kafka refused for its size, dropped (the agent's spool drop reason)


class SpoolForwarder:
    def __init__(
        self,
        spool: Spool,
        topic: str,
        bootstrap: str,
        *,
        max_in_flight: int = 2000,
        retry_backoff_s: float = 1.0,
        producer_factory: ProducerFactory | None = None,
    ) -> None:
        self.spool = spool
        self.topic = topic
        self.max_in_flight = max_in_flight
        self.retry_backoff_s = retry_backoff_s
        self._factory = producer_factory or (lambda: self._default_producer(bootstrap))
        self._producer: Any = None
        self._in_flight: deque[tuple[int, Delivery]] = deque()
        self._last_sent_id = 0
        self._retry_at = 0.0
        self.broker_up = False
        self.sent_total = 0
        self.outages = 0
        # records the client refused for their size (past its message.max.bytes), dropped: sending one again
        # never helps, and the resend from the oldest record would send it first for ever, every
        # good record behind it stuck in the spool
        self.refused_total = 0
        self._refused_id: int | None = None  # one refused by send(): dropped once all before it are acked

    @staticmethod
    def _default_producer(bootstrap: str) -> Any:
        # a dead broker is found within 2 s at connect; after that send() only queues
        return KafkaBus(bootstrap, connect_timeout_s=2.0).producer(
            linger_ms=5, delivery_timeout_s=DELIVERY_TIMEOUT_S
        )

    # ------------------------------------------------------------ one round of work

    def pump(self, budget_s: float, until: Callable[[], bool] | None = None) -> None:
        """Send what is spooled and collect acknowledgements for at most ~budget_s seconds, or
        until `until()` says the caller has other work (checked between flushes of at most 0.2 s)."""
        deadline = time.monotonic() + max(0.0, budget_s)
        if self._producer is None and not self._connect():
            return
        try:
            self._send_more()
            while self._in_flight and time.monotonic() < deadline and not (until is not None and until()):
                # serves the acknowledgements; what is not acknowledged yet stays in flight
                self._producer.flush(max(0.01, min(0.2, deadline - time.monotonic())))
                if not self._retire():
                    return
                self._send_more()
        except SendError as e:
            if self._producer is not None:
                self._fail(e)
            return
        self._retire()

    def drain(self, timeout_s: float) -> bool:
        """Try to empty the spool before exiting; True if everything was acknowledged."""
        deadline = time.monotonic() + timeout_s
        while len(self.spool) and time.monotonic() < deadline:
            self.pump(min(1.0, deadline - time.monotonic()))
            if not self.broker_up:
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        return len(self.spool) == 0

    # ------------------------------------------------------------ internals

    def _connect(self) -> bool:
        now = time.monotonic()
        if now < self._retry_at:
            return False
        try:
            self._producer = self._factory()
        except (BrokerUnavailable, OSError) as e:
            self._mark_down(f"cannot connect: {e}")
            return False
        except Exception as e:  # the client could not be made (no thread or memory to be had): retried
            self._mark_down(f"cannot create a producer: {type(e).__name__}: {e}")
            return False
        if not self.broker_up:
            log.info("broker reachable; forwarding %d spooled samples", len(self.spool))
        self.broker_up = True
        return True

    def _send_more(self) -> None:
        if self._refused_id is not None and not self._drop_refused():
            return  # the records before the refused one are still in flight
        room = self.max_in_flight - len(self._in_flight)
        if room <= 0:
            return
        for rec in self.spool.peek(after_id=self._last_sent_id, limit=room):
            try:
                delivery = self._producer.send(self.topic, key=rec.key, value=rec.value)
            except RecordTooLarge as e:
                self._refused(rec.id, len(rec.value), e)
                self._last_sent_id = rec.id
                self._refused_id = rec.id
                self._drop_refused()
                return
            self._in_flight.append((rec.id, delivery))
            self._last_sent_id = rec.id

    def _refused(self, rec_id: int, size: int, err: BaseException) -> None:
        self.refused_total += 1
        log.error("dropping spooled record %d (%d bytes): refused for its size: %s", rec_id, size, err)

    def _drop_refused(self) -> bool:
        """The record send() refused leaves the spool once every record before it is acknowledged
        (the spool is acknowledged up to an id); True once it has."""
        if self._in_flight or self._refused_id is None:
            return self._refused_id is None
        self.spool.ack(self._refused_id)
        self._refused_id = None
        return True

    def _retire(self) -> bool:
        """Acknowledge the completed head of the in-flight queue; False after a failure."""
        acked = None
        while self._in_flight and self._in_flight[0][1].done:
            rec_id, delivery = self._in_flight[0]
            if delivery.error is not None:  # (the broker's size refusal is its batch's: retried)
                self._fail(delivery.error)
                return False
            self._in_flight.popleft()
            acked = rec_id
            self.sent_total += 1
        if acked is not None:
            self.spool.ack(acked)
        return True

    def _fail(self, err: BaseException | None) -> None:
        self._mark_down(f"delivery failed: {err}")
        self._in_flight.clear()
        self._last_sent_id = 0  # resend from the oldest record still in the spool
        self._refused_id = None  # (a refused one among them is refused again, and dropped then)
        if self._producer is not None:
            try:
                self._producer.close(0)  # its queue purged: these records are resent from the spool
            except Exception:  # closing a producer whose broker is gone may raise anything
                log.debug("error closing producer", exc_info=True)
            self._producer = None

    def _mark_down(self, why: str) -> None:
        if self.broker_up or self.outages == 0:
            log.warning("broker unreachable (%s); spooling to %s", why, self.spool.path)
            self.outages += 1
        self.broker_up = False
        self._retry_at = time.monotonic() + self.retry_backoff_s

    def close(self) -> None:
        if self._producer is not None:
            try:
                self._producer.close(5)
            except Exception:
                log.debug("error closing producer", exc_info=True)
            self._producer = None
