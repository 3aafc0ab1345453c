"""Refused records logged so that a flood of them cannot flood the log: the first of each reason,
then every LOG_EVERY-th, with the count so far. The readers' metrics count every one; the log only
has to say that it is happening and what it looks like."""

from __future__ import annotations

import logging
import threading

LOG_EVERY = 1000


class RefusalLog:
    """`refusal(reason, what)` from any thread: counts it, and logs `what` (one line, bounded by
    the caller) when the count is 1 or a multiple of LOG_EVERY."""

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, reason: str, what: str) -> int:
        with self._lock:
            n = self._counts[reason] = self._counts.get(reason, 0) + 1
        if n == 1 or n % LOG_EVERY == 0:
            self._log.warning("%s (%s); %d so far for this reason", what, reason, n)
        return n

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)
