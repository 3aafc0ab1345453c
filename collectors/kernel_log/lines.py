"""Kernel log lines in the forms SREs save them, each taken apart into its time and its message.

Forms, recognised line by line (a saved file may mix them):

- /dev/kmsg records: `PRIORITY,SEQ,TIMESTAMP_us,FLAGS[,...];MESSAGE`, then optional dictionary
  lines that start with a space (` SUBSYSTEM=pci`, ` DEVICE=+pci:0000:3b:00.0`), which belong to
  the record above (Documentation/ABI/testing/dev-kmsg). The time is microseconds since boot.
- `dmesg`: `[  1234.567890] MESSAGE`, optionally after a `<N>` level (`dmesg -r`) or a
  `kern  :warn  : ` prefix (`dmesg -x`); seconds since boot.
- `dmesg -T`: `[Tue Mar  5 10:11:12 2024] MESSAGE`, names in the locale dmesg ran in
  (calendar_names.py), local time of the machine that printed it (taken as UTC unless told).
- `dmesg --time-format iso` and `journalctl -k -o short-iso[-precise]`, and rsyslog's high-precision
  files: `2024-03-05T10:11:12[.,]123456+00:00 [HOST kernel: ]MESSAGE`.
- `journalctl -k` (short, short-precise) and classic syslog files (`/var/log/kern.log`):
  `Mar  5 10:11:12[.123456] HOST kernel: MESSAGE` (no year: given, or the current one).
- `journalctl -k -o json`: one object per line, `MESSAGE` (a string, or bytes as a list of
  integers), `__REALTIME_TIMESTAMP` (microseconds), `_BOOT_ID`, `_SOURCE_MONOTONIC_TIMESTAMP`.
- A bare message (`NVRM: Xid ...`, what `grep` leaves): no time.

A syslog line's message may still carry the kernel's own `[ 1234.567890] ` stamp; it is taken off.
Anything else is not a kernel log line: counted by the caller, never guessed at.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field

import orjson

from fleetwatch.collectors.kernel_log.calendar_names import resolve_date

MAX_LINE = 8192  # the kernel's own record limit is 1024 bytes of text (LOG_LINE_MAX): more is not its

_KMSG = re.compile(r"^(\d{1,4}),(\d{1,20}),(\d{1,20}),([^;]*);(.*)$", re.S)
_LEVEL = r"(?:<\d{1,4}>)?"
_FACILITY = r"(?:[a-z]+\s*:[a-z]+\s*: )?"  # dmesg -x: "kern  :warn  : "
_CALLER = re.compile(r"^\[\s*[TC]\d{1,10}\]\s")  # CONFIG_PRINTK_CALLER: "[  T291] "
_DMESG = re.compile(rf"^{_LEVEL}{_FACILITY}\[\s*(\d{{1,12}})\.(\d{{1,9}})\]\s?(.*)$", re.S)
_DMESG_T = re.compile(
    rf"^{_LEVEL}\[(?:(\S+)\s+)?(\S+)\s+(\d{{1,2}})\s+(\d{{1,2}}):(\d{{2}}):(\d{{2}})\s+(\d{{4}})\]\s?(.*)$",
    re.S,
)
_ISO = re.compile(
    rf"^{_FACILITY}(\d{{4}})-(\d{{2}})-(\d{{2}})[T ](\d{{2}}):(\d{{2}}):(\d{{2}})(?:[.,](\d{{1,9}}))?"
    r"(Z|[+-]\d{2}:?\d{2})?\s+(.*)$",
    re.S,
)
_SYSLOG = re.compile(r"^(\S+)\s+(\d{1,2})\s+(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?\s+(.*)$", re.S)
_KERNEL_TAG = re.compile(r"^\S+\s+kernel:\s?(.*)$", re.S)  # "HOST kernel: MESSAGE"
_INNER_STAMP = re.compile(r"^\[\s*\d{1,12}\.\d{1,9}\]\s?")
_DELTA = re.compile(r"^\[\s*\+\s*\d{1,12}\.\d{1,9}\]\s?")  # dmesg -d / --reltime: no time of its own
_DICT_KEY = re.compile(r"^[A-Z][A-Z0-9_]{0,31}$")


@dataclass(slots=True)
class LogLine:
    text: str  # the message, without any time or prefix
    form: str  # kmsg | dmesg | dmesg_t | iso | syslog | journal_json | bare
    ts: float | None = None  # wall clock (unix seconds), where the line gives it
    since_boot_s: float | None = None  # where the line gives the kernel's own clock
    seq: int | None = None  # /dev/kmsg's sequence number
    priority: int | None = None  # syslog level 0-7 (kmsg, dmesg -r)
    boot_id: str | None = None  # journald's _BOOT_ID
    meta: dict[str, str] = field(default_factory=dict)  # a kmsg record's dictionary (SUBSYSTEM, DEVICE)


def _frac(digits: str | None) -> float:
    return int(digits) / 10 ** len(digits) if digits else 0.0


_OFFSET = re.compile(r"^([+-])(\d{2}):?(\d{2})$")


def utc_offset(text: str) -> dt.timezone | None:
    """`Z`, `+0200`, `-05:30` as a timezone; None for anything else, or an offset past a day."""
    if text == "Z":
        return dt.UTC
    m = _OFFSET.match(text)
    if m is None or int(m.group(2)) > 23 or int(m.group(3)) > 59:
        return None
    sign = -1 if m.group(1) == "-" else 1
    return dt.timezone(sign * dt.timedelta(hours=int(m.group(2)), minutes=int(m.group(3))))


class LineReader:
    """Parses lines one at a time; a kmsg dictionary line is attached to the record before it,
    which is why this holds the last record. year: for syslog lines, which carry none; tz: for the
    forms that give local time without an offset (dmesg -T, syslog)."""

    def __init__(self, year: int | None = None, tz: dt.tzinfo = dt.UTC) -> None:
        self.year = year if year is not None else dt.datetime.now(dt.UTC).year
        self.tz = tz
        self.last: LogLine | None = None
        self.unknown = 0  # lines that are none of the forms (or too long)

    def parse(self, raw: str) -> LogLine | None:
        """The line as a LogLine; None for a kmsg dictionary line (attached to the record before
        it), a blank line, or one that is none of the forms (counted in `unknown`)."""
        line = raw.rstrip("\r\n")
        if not line.strip():
            return None
        if len(line) > MAX_LINE or "\x00" in line:
            self.unknown += 1
            return None
        if line.startswith(" ") and self.last is not None and self.last.form == "kmsg":
            key, eq, value = line.strip().partition("=")
            if eq and _DICT_KEY.match(key):
                if len(self.last.meta) < 16:
                    self.last.meta[key] = value[:256]
                return None
        parsed = self._parse(line)
        if parsed is None:
            self.unknown += 1
        self.last = parsed
        return parsed

    def _parse(self, line: str) -> LogLine | None:
        if line.startswith("{"):
            return self._json(line)
        m = _KMSG.match(line)
        if m:
            prio, seq, usec, _flags, text = m.groups()
            return LogLine(
                _unescape(text), "kmsg", since_boot_s=int(usec) / 1e6, seq=int(seq), priority=int(prio) & 7
            )
        m = _DMESG.match(line)
        if m:
            sec, frac, text = m.groups()
            prio = _level(line)
            return LogLine(
                _CALLER.sub("", text, count=1), "dmesg", since_boot_s=int(sec) + _frac(frac), priority=prio
            )
        m = _DMESG_T.match(line)
        if m:
            weekday, month, day, hh, mi, ss, year, text = m.groups()
            date = resolve_date(weekday, month, int(day), int(year))
            ts = None if date is None else _timestamp(date.year, date.month, date.day, hh, mi, ss, self.tz)
            if ts is None:
                return None
            return LogLine(text, "dmesg_t", ts=ts, priority=_level(line))
        m = _ISO.match(line)
        if m:
            y, mo, d, hh, mi, ss, frac, tz, rest = m.groups()
            zone = utc_offset(tz) if tz else self.tz
            ts = None if zone is None else _timestamp(int(y), int(mo), int(d), hh, mi, ss, zone)
            if ts is None:
                return None
            return LogLine(_kernel_message(rest), "iso", ts=ts + _frac(frac))
        m = _SYSLOG.match(line)
        if m:
            month, day, hh, mi, ss, frac, rest = m.groups()
            tagged = _KERNEL_TAG.match(rest)
            date = resolve_date(None, month, int(day), self.year) if tagged else None
            ts = None if date is None else _timestamp(date.year, date.month, date.day, hh, mi, ss, self.tz)
            if ts is None or tagged is None:
                return None
            return LogLine(_INNER_STAMP.sub("", tagged.group(1), count=1), "syslog", ts=ts + _frac(frac))
        # a bare message, as grep or a paste leaves it: without the `kernel: ` tag of a journal
        # line whose time was cut, the indentation of a multi-line record's later lines, or a
        # relative dmesg stamp
        text = _DELTA.sub("", line.strip(), count=1).removeprefix("kernel: ")
        return LogLine(text, "bare")

    def _json(self, line: str) -> LogLine | None:
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(obj, dict):
            return None
        message = obj.get("MESSAGE")
        if isinstance(message, list):  # journald gives a message that is not UTF-8 as its bytes
            try:
                message = bytes(message).decode("utf-8", "backslashreplace")
            except (TypeError, ValueError):
                return None
        if not isinstance(message, str):
            return None
        out = LogLine(message, "journal_json")
        realtime = obj.get("__REALTIME_TIMESTAMP")
        if isinstance(realtime, str) and realtime.isdigit() and len(realtime) <= 20:
            out.ts = int(realtime) / 1e6
        mono = obj.get("_SOURCE_MONOTONIC_TIMESTAMP")
        if isinstance(mono, str) and mono.isdigit() and len(mono) <= 20:
            out.since_boot_s = int(mono) / 1e6
        boot = obj.get("_BOOT_ID")
        if isinstance(boot, str) and len(boot) <= 64:
            out.boot_id = boot
        prio = obj.get("PRIORITY")
        if isinstance(prio, str) and prio.isdigit() and len(prio) == 1:
            out.priority = int(prio)
        return out


def _timestamp(year: int, month: int, day: int, hh: str, mi: str, ss: str, tz: dt.tzinfo) -> float | None:
    """Unix seconds of a line's wall-clock time; None for a time that is none (hour 25, 30 February,
    an offset past a day): the line is then of no known form, never a crash."""
    try:
        return dt.datetime(year, month, day, int(hh), int(mi), int(ss), tzinfo=tz).timestamp()
    except ValueError:
        return None


def _level(line: str) -> int | None:
    if line.startswith("<"):
        end = line.find(">")
        return int(line[1:end]) & 7
    return None


def _kernel_message(rest: str) -> str:
    """An ISO line's message: after `HOST kernel: ` where journald or rsyslog put one (dmesg's iso
    form has none), without the kernel's own `[ 123.456] ` stamp."""
    tagged = _KERNEL_TAG.match(rest)
    text = tagged.group(1) if tagged else rest
    return _INNER_STAMP.sub("", text, count=1)


_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")


def _unescape(text: str) -> str:
    """kmsg writes non-printable bytes as \\xNN; a tab or newline inside a message is shown as a
    space (the record is one line either way)."""
    if "\\x" not in text:
        return text
    return _ESCAPE.sub(lambda m: " " if m.group(1) in ("09", "0a", "0A") else m.group(0), text)
