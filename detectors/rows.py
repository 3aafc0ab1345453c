"""Dense rows: per-entity state (a node, a GPU of a node, an IB port, a statistical series) lives
in numpy arrays indexed by a row number, so a batch updates it with whole-array operations.

- `RowIndex`: names -> rows, appended as names arrive; dropping names renumbers the rest densely
  and returns the `Compaction` that every array indexed by those rows is rebuilt with.
- `grow`: an array with room for more rows (doubling).
- `Compaction`: dense rows after some are dropped.

The node stage keeps one index of its nodes (detectors/node_index.NodeIndex) that every detector's
per-node arrays are indexed by; a detector keeps its own `RowIndex` only for what it alone has
(the hardware detector's IB port names).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def known_rows(rows: dict[str, int], names: Sequence[str]) -> np.ndarray | None:
    """Rows of `names` in a name -> row table if every one is in it (the usual batch: one C-level
    pass), else None."""
    try:
        return np.fromiter(map(rows.__getitem__, names), dtype=np.int64, count=len(names))
    except KeyError:
        return None


class RowIndex:
    """Name -> dense row number. Names are appended as they arrive (in the order given, so replays
    agree); `drop` removes some and renumbers the rest in their order."""

    def __init__(self, names: Iterable[str] = ()) -> None:
        self.names: list[str] = list(dict.fromkeys(names))  # a name once, at its first place
        self.rows: dict[str, int] = dict(zip(self.names, range(len(self.names)), strict=True))

    def __len__(self) -> int:
        return len(self.names)

    def row(self, name: str) -> int:
        r = self.rows.get(name)
        if r is None:
            r = self.rows[name] = len(self.names)
            self.names.append(name)
        return r

    def lookup(self, names: Sequence[str]) -> np.ndarray:
        """Rows of `names`, registering the new ones."""
        known = known_rows(self.rows, names)
        if known is not None:
            return known
        return np.fromiter((self.row(n) for n in names), dtype=np.int64, count=len(names))

    def drop(self, names: Iterable[str]) -> Compaction | None:
        """Remove these names (unknown ones are ignored); the Compaction of the rows that stay,
        or None if none of them was here (nothing moves)."""
        gone = [self.rows[n] for n in names if n in self.rows]
        if not gone:
            return None
        rows = Compaction.dropping(len(self.names), np.array(gone, dtype=np.int64))
        self.names = [self.names[r] for r in rows.keep.tolist()]
        self.rows = dict(zip(self.names, range(len(self.names)), strict=True))
        return rows

    def sources(self, saved: Sequence[str]) -> np.ndarray:
        """For each row here, the position of its name in `saved` (-1: not there): where to read
        this index's rows in arrays a snapshot laid out in the order `saved`."""
        at = {n: i for i, n in enumerate(saved)}
        return np.fromiter((at.get(n, -1) for n in self.names), dtype=np.int64, count=len(self.names))


def grow(a: np.ndarray, n: int, fill: Any) -> np.ndarray:
    """Return `a` with at least n rows (doubling, so appends stay amortised O(1))."""
    if len(a) >= n:
        return a
    cap = max(n, 2 * len(a), 16)
    out = np.full((cap, *a.shape[1:]), fill, dtype=a.dtype)
    out[: len(a)] = a
    return out


@dataclass(frozen=True, slots=True)
class Compaction:
    """Dense rows after some are dropped (forgotten nodes and their GPUs, ports, series): `keep`
    holds the surviving old rows in order, `new` maps an old row to its new one (-1: dropped).

    Every array indexed by those rows is rebuilt with `take`, every array that holds such rows as
    values is renumbered with `renumber`."""

    keep: np.ndarray
    new: np.ndarray

    @classmethod
    def keeping(cls, n: int, keep: np.ndarray) -> Compaction:
        """Rows `keep` (ascending) of n."""
        new = np.full(n, -1, dtype=np.int64)
        new[keep] = np.arange(len(keep))
        return cls(np.asarray(keep, dtype=np.int64), new)

    @classmethod
    def referenced(cls, n: int, rows: np.ndarray) -> Compaction:
        """The rows of n that `rows` (any shape; -1 = none) refer to: the entities still owned."""
        alive = np.zeros(n, dtype=bool)
        alive[rows[rows >= 0]] = True
        return cls.keeping(n, np.flatnonzero(alive))

    @classmethod
    def dropping(cls, n: int, drop: np.ndarray) -> Compaction:
        """Every row of n except `drop`, in their order."""
        alive = np.ones(n, dtype=bool)
        alive[drop] = False
        return cls.keeping(n, np.flatnonzero(alive))

    def take(self, a: np.ndarray, fill: Any, size: int | None = None) -> np.ndarray:
        """The kept rows of `a` in their new places, `fill` in every row after them.

        `a` is an owner's whole array, spare rows included (`grow` doubles it). It keeps its size
        while the kept rows fill more than a quarter of it (the rows move in place); below that it
        is replaced by an array of twice the kept rows, so memory follows the nodes down by halves
        while a partition that keeps forgetting and meeting nodes does not reallocate each time.
        `size`: the rows of the result instead (a new array unless it is len(a)). Rows past the end
        of `a` (an owner that grows it lazily) were never written: they get `fill`."""
        k = len(self.keep)
        if size is None:
            size = len(a) if 4 * k > len(a) else 2 * k
        have = self.keep[self.keep < len(a)]  # ascending, so the first len(have) of keep
        if max(size, k) == len(a):
            a[: len(have)] = a[have]  # the right side is a copy: overlapping moves are safe
            a[len(have) :] = fill
            return a
        out = np.full((max(size, k), *a.shape[1:]), fill, dtype=a.dtype)
        out[: len(have)] = a[have]
        return out

    def renumber(self, rows: np.ndarray) -> np.ndarray:
        """Old row numbers (any shape; -1 = none) -> new ones (-1: none, or dropped)."""
        return np.where(rows >= 0, self.new[np.maximum(rows, 0)], -1)


def first_appearances(key: np.ndarray) -> np.ndarray:
    """Index of each distinct key's first occurrence, in order of first occurrence."""
    _, first_ix = np.unique(key, return_index=True)
    return np.sort(first_ix)
