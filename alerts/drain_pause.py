"""The fleet-wide drain pause: `fleetwatch pause` and `fleetwatch resume-drains` (docs/contract.md,
"control/1").

An operator's switch, not a detector's: while a pause is in force every `fleetwatch act` holds its
automatic drains AND resumes (fleetwatch changes nothing in Slurm), and goes on alerting. The
switch is one signed control/1 record on fleet.control.v1 (key `drain_pause`; kept 8 days, not
compacted: compaction would keep only the switch's last offset, which could be a replayed old pause
written after the lift):

    {"schema": "control/1", "control": "drain_pause", "paused": true|false, "reason": one line,
     "by": "user@host", "issued_at": unix s, "until": unix s, "signature": HMAC-SHA256 hex}

- Every act follows the whole topic (fleetwatch/follow.py), so every instance obeys within a
  follower's poll (a fraction of a second), and a restarted act reads the record back before it
  decides anything: the pause survives restarts.
- It lasts as long as asked (`until - issued_at`) from when the broker took it (at most
  MAX_PAUSE_S: a pause somebody forgot must not switch the safety net off for good), so that an
  operator's clock behind does not end it early, but never past its own `until` + MAX_BEHIND_S (a
  record a day older than the broker's time is a replay of one gone from the topic, not a clock:
  honoured from the broker's time it would pause drains anew); or it ends at a `paused: false`
  record (resume-drains).
- Signed with the control key (FLEETWATCH_CONTROL_KEY or --control-key-file; the drain key where
  none is set). A site gives on-call a control key of its own, so that the hosts that may pause
  drains cannot sign a drain/1 (HMAC keys cannot separate signing from verifying).
  Unsigned or forged records are refused and counted: a forged pause would switch fleetwatch off,
  a forged lift would drain during a human's freeze. A replayed older record changes nothing: the
  record with the latest `issued_at` is the switch's state, whatever order records arrive in.
  Operators' clocks differ, so `fleetwatch pause` / `resume-drains` read the switch first and
  issue after its latest record (`next_issued_at`); a record issued more than MAX_AHEAD_S ahead of
  the time the broker took it is refused (a wrong clock must not make a pause nobody can lift), and
  a pause never lasts past MAX_PAUSE_S after the broker took it. fleet.control.v1 is a
  LogAppendTime topic (topics.BROKER_TIMED), and every reader of it (act, and the commands
  themselves) checks against that time, not its own clock: a reader's clock behind or ahead
  changes nothing, a restarted act decides on each record as it did before, and the commands take
  the latest record that act takes. On a topic that keeps the producer's time (one a site made
  itself) the reader's clock is the reference instead.
"""

from __future__ import annotations

import getpass
import logging
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleetwatch import schemas, signing
from fleetwatch.plain_text import plain_line
from fleetwatch.refusal_log import RefusalLog

log = logging.getLogger(__name__)

CONTROL = schemas.CONTROL
SWITCH = "drain_pause"
MAX_PAUSE_S = schemas.MAX_PAUSE_S
MAX_AHEAD_S = 60.0
MAX_BEHIND_S = 86_400.0  # an operator's clock behind by this much is a replay, not a clock
NOT_READ = "the control topic has not been read yet (fleetwatch.control.v1 unreachable, or its ACL missing)"
validate_control = schemas.validate_control
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd]?)")  # of the stripped text: linear (no \s* at both ends)
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


CONTROL_KEY_ENV = "FLEETWATCH_CONTROL_KEY"


def load_control_key(control_key_file: str | None, drain_key_file: str | None) -> bytes:
    """The control key: its file, else $FLEETWATCH_CONTROL_KEY, else the drain key (a site without a
    separate control key)."""
    import os

    from fleetwatch.alerts import drain_request

    if control_key_file or os.environ.get(CONTROL_KEY_ENV, "").strip():
        return signing.load_key("control", CONTROL_KEY_ENV, control_key_file, os.environ)
    return drain_request.load_key(drain_key_file)


def parse_duration(text: str) -> float:
    """'90s', '30m', '2h', '1d' or plain seconds -> seconds; ValueError for anything else."""
    m = _DURATION.fullmatch(text.lower().strip())
    if m is None:
        raise ValueError(f"{text!r} is not a duration (e.g. 30m, 2h, 1d)")
    seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    if not 0 < seconds <= MAX_PAUSE_S:
        raise ValueError(f"a pause lasts more than 0 s and at most {MAX_PAUSE_S / 86400:.0f} days")
    return seconds


def operator() -> str:
    """Who runs the command, as user@host (the record's `by`)."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name for this uid (a container): still say where it came from
        user = "unknown"
    return f"{user}@{socket.gethostname()}"[: schemas.MAX_ID_LEN]


def make_control(
    *, paused: bool, reason: str, by: str, issued_at: float, until: float, key: bytes
) -> dict[str, Any]:
    from fleetwatch.alerts.drain_request import one_line

    msg: dict[str, Any] = {
        "schema": CONTROL,
        "control": SWITCH,
        "paused": paused,
        "reason": one_line(reason),
        "by": one_line(by, schemas.MAX_ID_LEN),
        "issued_at": float(issued_at),
        "until": float(until),
    }
    msg["signature"] = signing.mac(msg, key, "signature")
    validate_control(msg)
    return msg


@dataclass(frozen=True)
class Pause:
    """The pause in force: why, who, since and until when (unix s)."""

    reason: str
    by: str
    since: float
    until: float

    def note(self) -> str:
        """One line for alerts and logs, plain: the operator's reason and name are text the control
        record's schema holds to one line only (an escape sequence or chat markup in them reached
        the pause alert's summary and every alert's drains_paused annotation)."""
        from fleetwatch.alerts.alert_model import EVIDENCE_MAX, event_time

        return plain_line(
            f"drains paused until {event_time(self.until)} by {self.by}: {self.reason}", EVIDENCE_MAX
        )


class PauseBook:
    """The switch's state as read from fleet.control.v1: `apply` is a TopicFollower's callback
    (a background thread), `active(now)` is asked by the decision step."""

    def __init__(
        self,
        key: bytes,
        on_refused: Callable[[str], None] = lambda _why: None,
        read: Callable[[], bool] | None = None,
    ) -> None:
        """`read`: whether the control topic has been read to its end once (act: its follower's
        caught_up); by default, whether read_up() was called."""
        self._key = key
        self._on_refused = on_refused
        self._lock = threading.Lock()
        self._refusals = RefusalLog(log)  # a flood of them must not flood the log
        self._latest: dict[str, Any] | None = None
        self._ready = threading.Event()
        self._read = read or self._ready.is_set

    def apply(
        self, key: bytes | None, value: bytes | None, now: float | None = None, _broker: bool = False
    ) -> None:
        """One record of the control topic; `now`: the time its `issued_at` is checked against and
        its week counted from (the broker's, from follow.BrokerTimedFollower; the reader's clock
        where none is given), whichever clock that is."""
        now = time.time() if now is None else now
        if value is None:
            return  # a tombstone unsigned: it lifts nothing (an operator lifts with resume-drains)
        msg, why, detail = signing.decode_verified(value, CONTROL, key, self._key)
        if msg is None:
            self._refuse(why, detail)
            return
        if msg["issued_at"] > now + MAX_AHEAD_S:
            self._refuse("clock_skew", f"issued {msg['issued_at'] - now:.0f} s ahead of the broker")
            return
        with self._lock:
            if self._latest is not None and msg["issued_at"] <= self._latest["issued_at"]:
                return  # a replay of an older record: the latest switch stands
            # As long as the operator asked (`until - issued_at`), from when the broker took it, and
            # never longer than a week: `until` on the operator's own clock ended a pause from a host
            # an hour behind at once, while the command said "paused until" a time already past. Not
            # past its own `until` by more than MAX_BEHIND_S: a signed pause replayed once the original
            # has left the topic (8 days) must not pause drains anew, as it did not before.
            asked = max(0.0, msg["until"] - msg["issued_at"])
            until = min(now + min(asked, MAX_PAUSE_S), msg["until"] + MAX_BEHIND_S)
            self._latest = {**msg, "until": until}
        what = "paused" if msg["paused"] else "lifted"
        log.warning("drains %s by %s: %s", what, msg["by"], msg["reason"])

    def _refuse(self, why: str, detail: str) -> None:
        self._refusals(why, f"control record refused: {detail[:200]}")
        self._on_refused(why)

    def latest_issued_at(self) -> float:
        with self._lock:
            return self._latest["issued_at"] if self._latest is not None else 0.0

    def read_up(self) -> None:
        """The control topic has been read to its end once (the follower caught up): from now on
        an absent record means no pause."""
        self._ready.set()

    def active(self, now: float) -> Pause | None:
        """The pause in force at wall time `now`, or None. Until the topic has been read to its
        end once, drains are held (fail closed): an act that cannot read the switch yet must not
        drain during a pause it has not seen."""
        if not self._read():
            return Pause(NOT_READ, "fleetwatch", now, now + MAX_AHEAD_S)
        with self._lock:
            m = self._latest
        if m is None or not m["paused"] or now >= m["until"]:
            return None
        return Pause(m["reason"], m["by"], m["issued_at"], m["until"])
