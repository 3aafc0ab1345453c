"""(node row, port or interface name) -> entity row: the hardware detector's IB ports and Ethernet
interfaces, each entity a row of its counters' arrays.

Sparse: a sorted array of (node row, name code) keys, so memory follows the entities that exist,
not nodes x every name any node ever sent (a dense table of that shape grew with each new name on
any node). Capped per node (`MAX_PER_NODE`, as many as one sample may list): a node's names come
from its own agent, unsigned, and one node sending new names with every sample must not grow the
worker without bound. A real node has at most 18 HCA ports and a dozen NICs, so only a node whose
names keep changing reaches the cap; the names past it are refused (counted, logged rarely) and
never registered.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from fleetwatch.detectors.rows import Compaction, RowIndex, first_appearances
from fleetwatch.refusal_log import RefusalLog
from fleetwatch.schemas import MAX_PORTS

log = logging.getLogger(__name__)

# entities of one kind (IB ports, or Ethernet interfaces) per node: what one sample may list
MAX_PER_NODE = MAX_PORTS
_SHIFT = 32  # key = node row << _SHIFT | name code


class PortMap:
    """Entities 0..n-1, each a (node row, name) pair: `row_of`, `code_of` its node row and name code,
    `names` the name codes (only names some entity has), `keys` / `order` the sorted keys and the
    entity of each, for vectorised lookups."""

    def __init__(self, what: str, cap: int = MAX_PER_NODE) -> None:
        self.what = what  # "IB port", "Ethernet interface": in the log
        self.cap = cap
        self.names = RowIndex()
        self.row_of = np.empty(0, dtype=np.int64)
        self.code_of = np.empty(0, dtype=np.int64)
        self.keys = np.empty(0, dtype=np.int64)
        self.order = np.empty(0, dtype=np.int64)
        self.refused = 0  # elements refused since start: their node was at the cap
        self._untaken = 0  # ... since the last take_refused()
        self._refusals = RefusalLog(log)

    @property
    def n(self) -> int:
        return len(self.row_of)

    def entities(self, rows: np.ndarray, names: Sequence[str], idx: np.ndarray) -> np.ndarray:
        """Entity row of each element: node row rows[i], name names[idx[i]] (`names`: the batch's
        name list, which may hold a name twice). New pairs get new entities in order of first
        appearance while their node is under the cap; -1 for an element whose pair is refused."""
        # a name not registered yet gets a provisional code past every real one, one per name (a
        # batch's list may hold one name twice: the decoder keeps its list as the message had it)
        held, n_real = self.names.rows, len(self.names)
        unseen: dict[str, int] = {}
        provisional = np.empty(len(names), dtype=np.int64)
        for j, x in enumerate(names):
            c = held.get(x)
            provisional[j] = c if c is not None else n_real + unseen.setdefault(x, len(unseen))
        code = provisional[idx]
        key = (rows << _SHIFT) | code
        ent = self._find(key)
        new = ent < 0
        if not new.any():
            return ent
        first = np.flatnonzero(new)[first_appearances(key[new])]  # each new pair once, in order
        pair_rows = rows[first]
        admit = self._under_cap(pair_rows)
        if not admit.all():
            refused = int(np.isin(key, key[first[~admit]]).sum())
            self.refused += refused
            self._untaken += refused
            self._refusals(
                "cap",
                f"{self.what}s past {self.cap} on one node refused ({refused} in this batch, "
                f"e.g. {names[int(idx[first[~admit][0]])][:64]!r} of node row {int(pair_rows[~admit][0])})",
            )
        first, pair_rows = first[admit], pair_rows[admit]
        if len(first):
            pair_name = idx[first]  # each admitted new pair's name, in order of first appearance
            registered: dict[int, int] = {}  # provisional code -> the real one
            # their new names registered in that order (replays agree): once per name
            for j in pair_name[first_appearances(provisional[pair_name])].tolist():
                c = int(provisional[j])
                if c >= n_real:
                    registered[c] = self.names.row(names[j])
            # -1: a name only refused pairs have, never registered
            real = np.fromiter(
                (c if c < n_real else registered.get(c, -1) for c in provisional.tolist()),
                dtype=np.int64,
                count=len(provisional),
            )
            self._add(pair_rows, real[pair_name])
            code = real[idx]
            ent = np.where(code >= 0, self._find((rows << _SHIFT) | np.maximum(code, 0)), -1)
        return ent

    def unplaced(self) -> bool:
        """Whether some entity's node is not in the index (restored from a snapshot that held it)."""
        return bool((self.row_of < 0).any())

    def take_refused(self) -> int:
        """Elements refused since the last call (the node stage counts them in its metrics)."""
        n, self._untaken = self._untaken, 0
        return n

    def _find(self, key: np.ndarray) -> np.ndarray:
        """The entity of each key (-1: none)."""
        if not len(self.keys):
            return np.full(len(key), -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(self.keys, key), len(self.keys) - 1)
        return np.where(self.keys[at] == key, self.order[at], -1)

    def _under_cap(self, pair_rows: np.ndarray) -> np.ndarray:
        """Whether each new pair (their node rows, in order) fits under its node's cap."""
        have = np.searchsorted(self.keys, (pair_rows + 1) << _SHIFT) - np.searchsorted(
            self.keys, pair_rows << _SHIFT
        )
        # the k-th new pair of a node (k from 0) comes after k others of that node in this batch
        order = np.argsort(pair_rows, kind="stable")
        sorted_rows = pair_rows[order]
        starts = np.searchsorted(sorted_rows, sorted_rows)
        rank = np.empty(len(pair_rows), dtype=np.int64)
        rank[order] = np.arange(len(pair_rows)) - starts
        return have + rank < self.cap

    def _add(self, rows: np.ndarray, codes: np.ndarray) -> None:
        """New entities n.. for these pairs, in order."""
        self.row_of = np.concatenate([self.row_of, rows])
        self.code_of = np.concatenate([self.code_of, codes])
        self._sort()

    def _sort(self) -> None:
        keys = (self.row_of << _SHIFT) | self.code_of
        self.order = np.argsort(keys, kind="stable")
        self.keys = keys[self.order]

    def name_codes(self, ent: np.ndarray) -> np.ndarray:
        """The name code of each entity (for `names.names[code]`)."""
        return self.code_of[ent]

    # ------------------------------------------------------------ state

    def triples(self) -> list[list[Any]]:
        """[node row, name, entity row] of every entity, in entity order: how snapshots keep it."""
        names = self.names.names
        return [
            [r, names[c], e]
            for e, (r, c) in enumerate(zip(self.row_of.tolist(), self.code_of.tolist(), strict=True))
        ]

    def restore(self, triples: list[list[Any]], saved: list[str], at: dict[str, int]) -> None:
        """A snapshot's triples, its node rows (`saved`: their names) placed by this index's rows
        (`at`: name -> row). Entity rows must be 0..n-1, each once, and each node row in range: a
        hostile record on the state topic must not size arrays past the worker's memory. The
        entities of a node this index does not have get row -1 (no node's), for the caller to
        compact away with their counters (HardwareDetector.from_state does)."""
        n = len(triples)
        ents = [int(e) for _r, _k, e in triples]
        if sorted(ents) != list(range(n)) or not all(0 <= int(r) < len(saved) for r, _k, _e in triples):
            raise ValueError(f"{self.what} rows out of range")
        by_ent = sorted(triples, key=lambda t: int(t[2]))
        rows = np.fromiter((at.get(saved[int(r)], -1) for r, _k, _e in by_ent), np.int64, n)
        codes = self.names.lookup([str(k) for _r, k, _e in by_ent])
        placed = rows >= 0  # (a node the index does not have: the detector compacts them away)
        if len(np.unique(((rows << _SHIFT) | codes)[placed])) != int(placed.sum()):
            raise ValueError(f"{self.what} rows name one port twice")
        self.row_of, self.code_of = rows, codes
        self._sort()

    def compact(self, nodes: Compaction | None) -> Compaction:
        """After nodes are forgotten (`nodes`: the node rows that stay; None: none went): the
        entities of nodes that stay, renumbered densely (the Compaction their arrays are rebuilt
        with), and the names no entity has any more dropped."""
        new_rows = nodes.renumber(self.row_of) if nodes is not None else self.row_of
        ents = Compaction.keeping(self.n, np.flatnonzero(new_rows >= 0))
        self.row_of, self.code_of = new_rows[ents.keep], self.code_of[ents.keep]
        unused = np.setdiff1d(np.arange(len(self.names)), self.code_of)
        if len(unused):
            codes = self.names.drop([self.names.names[c] for c in unused.tolist()])
            if codes is not None:
                self.code_of = codes.renumber(self.code_of)
        self._sort()
        return ents
