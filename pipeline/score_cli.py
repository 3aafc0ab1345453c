"""``fleetwatch score --csv FILE --column value [--timestamp timestamp]``.

Streams a univariate series, in file order, through the online detector the pipeline's
statistical detector runs (``detectors.multivariate.MultivariateScorer`` with one metric: a robust
baseline with point, 3-sample, drift and step statistics, each calibrated online with a tail
that is not capped at 1 / history, their smallest p calibrated, combined and calibrated again) and writes
``timestamp,value,anomaly_score`` to stdout. Nothing looks ahead: the score of a row depends only
on the rows before it and on itself.

- ``anomaly_score`` in [0, 1]: ``1 - p`` with ``p`` the online conformal tail probability of the
  row's deviation against the series' own past, so a threshold ``t`` flags at most about
  ``1 - t`` of the points of a stationary healthy series (0.999 -> 0.1 %). See
  ``detectors.calibration``.
- empty score: the value is missing (blank, ``nan``, ``NA``, ``null``; the row is echoed and the
  detector state is untouched) or the detector is still warming up (the first 20 values build
  the baseline, then about 60 more the calibrations of its statistics and of their combination:
  the first score comes with the 83rd value; scores can exceed ``t`` only after ~``1 / (1 - t)``
  values).
- blank lines are skipped, except in a one-column CSV, where a blank line is a missing value.
- ``timestamp``: echoed as written; the 0-based data row number if the column is absent.
- errors (one line on stderr, exit 2 via ``fleetwatch.cli``): missing file, empty input (no
  header), missing ``--column``, a non-numeric or infinite value or one beyond ±1e150 (with its
  row number), a read error part way through. The output is a stream: the rows before the error
  stand, the exit status says they are not all. Output cut off by its reader (``| head``) ends
  the command quietly, status 141 as a shell reports a pipe's SIGPIPE.

The input is read and written in chunks of rows, each chunk one compiled sequential pass (every
value scored against the calibration as it was just before it, exactly as one value at a time).
Progress (rows, rows/s) goes to stderr at the end.
"""

from __future__ import annotations

import argparse
import csv
import logging
import math
import sys
import time
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import TextIO

import numpy as np

from fleetwatch.detectors.multivariate import MultivariateScorer
from fleetwatch.text_input import read_lines

log = logging.getLogger("fleetwatch.score")

CHUNK_ROWS = 8192
MISSING = frozenset(("", "nan", "na", "n/a", "null", "none"))
# The scorer squares deviations (its covariance): past this a square overflows float64 and the
# detector's state turns infinite (numba's matrix inverse then raised out of the pass). No reading
# of anything measured comes near it.
MAX_ABS = 1e150


def _parse(text: str, row: int, column: str) -> float:
    """Float of a cell; NaN for a missing one; ValueError (with row) for anything else."""
    t = text.strip()
    if t.lower() in MISSING:
        return math.nan
    try:
        if "_" in t:  # float() takes Python's digit grouping ("1_0" is 10); a CSV value does not
            raise ValueError(t)
        v = float(t)
    except ValueError:
        raise ValueError(f"row {row}: column {column!r} is not numeric: {text[:40]!r}") from None
    if math.isinf(v):
        raise ValueError(f"row {row}: column {column!r} is not finite: {text[:40]!r}")
    if abs(v) > MAX_ABS:
        raise ValueError(f"row {row}: column {column!r} is beyond ±{MAX_ABS:g}: {text[:40]!r}")
    return v


def _columns(header: list[str], column: str, timestamp: str) -> tuple[int, int | None]:
    names = [h.strip() for h in header]
    if column not in names:
        raise ValueError(f"column {column!r} not in CSV header (have: {', '.join(names)[:200]})")
    ts = names.index(timestamp) if timestamp in names else None
    return names.index(column), ts


def _chunks(reader: Iterator[list[str]]) -> Iterator[tuple[list[list[str]], ValueError | None]]:
    """Rows in chunks, each with the error that cut it short (None: whole): the rows read before a
    read error or an unreadable CSV record are scored and written before the command stops."""
    while True:
        chunk: list[list[str]] = []
        try:
            chunk.extend(islice(reader, CHUNK_ROWS))
        except csv.Error as e:
            yield chunk, ValueError(f"not a readable CSV: {e}")
            return
        except ValueError as e:  # a read error part way (fleetwatch.text_input), bytes not UTF-8
            yield chunk, e
            return
        if not chunk:
            return
        yield chunk, None


def score_stream(src: Iterable[str], out: TextIO, column: str, timestamp: str) -> int:
    """Score ``src`` into ``out``; returns the number of data rows. What the csv module cannot
    read (a field past its 128 KiB limit) is a ValueError, not a traceback; every row before the
    first that cannot be read or scored is written first."""
    try:
        return _score_stream(src, out, column, timestamp)
    except csv.Error as e:  # the header's
        raise ValueError(f"not a readable CSV: {e}") from None


def _score_stream(src: Iterable[str], out: TextIO, column: str, timestamp: str) -> int:
    reader = csv.reader(src)
    header = next(reader, None)
    if header is None or not any(h.strip() for h in header):
        raise ValueError("empty input: no CSV header")
    vi, ti = _columns(header, column, timestamp)
    need = max(vi, ti if ti is not None else 0)
    single = len(header) == 1
    scorer = MultivariateScorer(1)
    scorer.add_groups(np.zeros(1, dtype=np.int64))
    # rows written through the csv module: a timestamp with a comma or a newline in it comes out
    # quoted, one field, as it came in
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(("timestamp", "value", "anomaly_score"))
    r = 0  # data row number
    for chunk, bad in _chunks(reader):
        raws, stamps, values = [], [], []
        for rec in chunk:
            if not rec:
                if not single:
                    continue  # a blank line between rows
                rec = [""]  # one-column CSV: a blank line is a missing value
            try:
                if len(rec) <= need:
                    short = column if len(rec) <= vi else timestamp  # the one of the two the row lacks
                    at = vi if short == column else ti
                    raise ValueError(f"row {r}: has {len(rec)} fields, column {short!r} is field {at + 1}")
                raw = rec[vi]
                values.append(_parse(raw, r, column))
            except ValueError as e:
                bad = e
                break
            raws.append(raw.strip())
            stamps.append(rec[ti] if ti is not None else str(r))
            r += 1
        if values:
            x = np.array(values).reshape(-1, 1)
            scores = scorer.update(np.zeros(len(x), dtype=np.int64), x, sequential=True).score.tolist()
            writer.writerows(
                (ts, raw, "" if s != s else f"{s:.6f}")
                for ts, raw, s in zip(stamps, raws, scores, strict=True)
            )
        if bad is not None:
            raise bad
    return r


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    with read_lines(args.csv, newline="") as lines:  # the csv module's newlines; unreadable: exit 2
        rows = score_stream(lines, sys.stdout, args.column, args.timestamp)
    sys.stdout.flush()
    dt = time.perf_counter() - t0
    log.info("scored %d rows in %.2f s (%.0f rows/s)", rows, dt, rows / dt if dt > 0 else 0.0)
    return 0
