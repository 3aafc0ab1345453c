"""fleetwatch/refusal_log.py: a flood of refused records is counted whole and logged sparsely."""

from __future__ import annotations

import logging
import threading

import pytest

from fleetwatch.refusal_log import LOG_EVERY, RefusalLog


def test_the_first_of_each_reason_and_every_thousandth_are_logged_with_the_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("test.refusals")
    refusals = RefusalLog(log)
    with caplog.at_level(logging.WARNING, logger="test.refusals"):
        for i in range(2 * LOG_EVERY + 500):
            refusals("bad_signature", f"record {i} refused")
        for i in range(3):
            refusals("malformed", f"garbage {i}")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "record 0 refused (bad_signature); 1 so far for this reason",
        "record 999 refused (bad_signature); 1000 so far for this reason",
        "record 1999 refused (bad_signature); 2000 so far for this reason",
        "garbage 0 (malformed); 1 so far for this reason",
    ]
    assert refusals.counts() == {"bad_signature": 2 * LOG_EVERY + 500, "malformed": 3}


def test_followers_on_several_threads_lose_no_count() -> None:
    refusals = RefusalLog(logging.getLogger("test.refusals.threads"))

    def flood() -> None:
        for _ in range(5000):
            refusals("malformed", "x")

    threads = [threading.Thread(target=flood) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert refusals.counts() == {"malformed": 20_000}
