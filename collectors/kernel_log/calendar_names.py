"""Month and weekday names of any locale, for `dmesg -T` lines (their names follow the locale
dmesg ran in: "Mär", "févr.", "3月").

English is known without a table. Other names come from CLDR through Babel, loaded on first use.
Some abbreviations mean different months in different languages ("mar": March in English and
Spanish, May in another), so a date is accepted only where its month is certain: one candidate,
or one whose date falls on the weekday the line names.
"""

from __future__ import annotations

import datetime as dt
import functools
import re

ENGLISH_MONTHS = {
    m: i
    for i, m in enumerate(
        ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"], 1
    )
}
ENGLISH_DAYS = {d: i for i, d in enumerate(["mon", "tue", "wed", "thu", "fri", "sat", "sun"])}  # Monday = 0
# "3月" (Chinese, Japanese), "3월" (Korean): the month is the number
_NUMBERED = re.compile(r"^(\d{1,2})\s*[月월]$")


def _fold(name: str) -> str:
    return name.casefold().strip().rstrip(".")


@functools.cache
def _cldr() -> tuple[dict[str, frozenset[int]], dict[str, frozenset[int]]]:
    """Every CLDR locale's month (1-12) and weekday (0 = Monday) names, abbreviated and wide."""
    from babel import Locale, localedata

    months: dict[str, set[int]] = {}
    days: dict[str, set[int]] = {}
    for ident in localedata.locale_identifiers():
        try:
            loc = Locale.parse(ident)
        except (ValueError, LookupError):
            continue
        for ctx in ("format", "stand-alone"):
            for width in ("abbreviated", "wide"):
                for number, name in loc.months[ctx][width].items():
                    months.setdefault(_fold(name), set()).add(number)
                for number, name in loc.days[ctx][width].items():
                    days.setdefault(_fold(name), set()).add(number)
    return (
        {k: frozenset(v) for k, v in months.items()},
        {k: frozenset(v) for k, v in days.items()},
    )


def month_candidates(token: str) -> frozenset[int]:
    name = _fold(token)
    if name[:3] in ENGLISH_MONTHS and (len(name) == 3 or name.isascii()):
        return frozenset({ENGLISH_MONTHS[name[:3]]})
    m = _NUMBERED.match(name)
    if m:
        return frozenset({int(m.group(1))}) if 1 <= int(m.group(1)) <= 12 else frozenset()
    return _cldr()[0].get(name, frozenset())


def weekday_candidates(token: str) -> frozenset[int]:
    name = _fold(token)
    if name[:3] in ENGLISH_DAYS and name.isascii():
        return frozenset({ENGLISH_DAYS[name[:3]]})
    return _cldr()[1].get(name, frozenset())


def resolve_date(weekday: str | None, month: str, day: int, year: int) -> dt.date | None:
    """The date a line names, or None where the month is unknown or not certain."""
    dates = []
    for m in month_candidates(month):
        try:
            dates.append(dt.date(year, m, day))
        except ValueError:
            continue
    if len(dates) > 1 and weekday is not None:
        wd = weekday_candidates(weekday)
        dates = [d for d in dates if d.weekday() in wd]
    return dates[0] if len(dates) == 1 else None
