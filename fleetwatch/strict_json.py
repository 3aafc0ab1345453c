"""JSON as every fleetwatch message must be written: UTF-8, no duplicate keys, bounded nesting.

JSON parsers disagree on duplicate keys (orjson and msgspec keep the last, others the first), so a
message {"node": "a", ..., "node": "b"} means different nodes to different readers: one of them can
be made to see a phantom node. Duplicate keys are therefore refused outright, as are invalid UTF-8
anywhere (also inside fields nobody reads) and nesting deeper than MAX_DEPTH (msgspec and the
standard library recurse per level and raise RecursionError, not a decode error).

Cost: orjson parses; if re-encoding the result gives back the input bytes, the input was orjson's
own compact form of an object with no duplicate key (a duplicate would have been dropped, so the
bytes would differ). That holds for everything fleetwatch itself produces, for ~0.3 us. Other input
is parsed a second time by the standard library, which reports duplicates.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

MAX_DEPTH = 64  # telemetry/1 nests 4 deep; extensions get room, a parser's stack does not run out


class JSONRefused(ValueError):
    """`reason` is not_utf8 | not_json | duplicate_key | out_of_range (fleetwatch.schemas.REASONS)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def loads(raw: bytes) -> Any:
    """The parsed value of `raw`, or JSONRefused naming what is wrong."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as u:
            raise JSONRefused("not_utf8", f"invalid UTF-8 at byte {u.start}") from None
        if "depth limit" in str(e):
            raise JSONRefused("out_of_range", f"nested deeper than {MAX_DEPTH} levels") from None
        raise JSONRefused("not_json", str(e)[:200]) from None
    # More opening brackets than MAX_DEPTH is the only way to nest deeper: most messages skip the walk.
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and _depth(value) > MAX_DEPTH:
        raise JSONRefused("out_of_range", f"nested deeper than {MAX_DEPTH} levels")
    if orjson.dumps(value) != raw:
        _refuse_duplicate_keys(raw)
    return value


def _depth(value: Any) -> int:
    """Nesting depth of a parsed value (a scalar is 0), without recursion."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = v.values()
        elif not isinstance(v, list):
            continue
        deepest = max(deepest, d)
        stack.extend((c, d + 1) for c in v if isinstance(c, dict | list))
    return deepest


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise JSONRefused("duplicate_key", f"key {dup[:64]!r} appears twice in one object")
    return d


def _refuse_duplicate_keys(raw: bytes) -> None:
    # The depth was bounded above, so the standard library's recursion stays far from its limit.
    try:
        json.loads(raw, object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError) as e:
        if isinstance(e, JSONRefused):
            raise
        # orjson accepted it; the standard library is laxer nowhere that matters, stricter nowhere
        # we know of: anything else is a disagreement worth naming rather than accepting.
        raise JSONRefused("not_json", f"{type(e).__name__}: {str(e)[:160]}") from None
