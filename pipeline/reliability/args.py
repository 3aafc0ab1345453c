"""The command-line arguments of `fleetwatch account` and `fleetwatch report`, and their types
(light: fleetwatch/cli.py builds every command's parser, and only the one run imports its code)."""

from __future__ import annotations

import argparse
import datetime as dt
import re
import time

from fleetwatch.arg_types import nonneg_int, positive_int
from fleetwatch.pipeline.reliability.attribution import Window
from fleetwatch.pipeline.reliability.figures import FigureConfig

_SPAN = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
DEFAULT_DB = "fleetwatch-accounting.sqlite"


MAX_SPAN_S = 100 * 365.25 * 86_400


def span_s(text: str) -> float:
    """'90s', '30m', '12h', '28d', '4w' -> seconds (argparse type)."""
    m = _SPAN.match(text.strip().lower())
    # at most a century: 999...9d was infinite, and a window from minus infinity failed as a NaN
    if m is None or not 0 < float(m.group(1)) * _UNIT_S[m.group(2)] <= MAX_SPAN_S:
        raise argparse.ArgumentTypeError(f"{text!r} is not a span such as 30m, 12h, 28d, 4w (<= 100 years)")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def when(text: str, now: float | None = None) -> float:
    """A point in time: 'now', a span back from now ('7d' = seven days ago), an ISO date or time
    (UTC unless it names a zone), or unix seconds (argparse type)."""
    now = time.time() if now is None else now
    t = text.strip()
    if t == "now":
        return now
    try:
        return now - span_s(t)
    except argparse.ArgumentTypeError:
        pass
    try:
        v = float(t)
        if v >= 0 and v == v and v < 1e11:
            return v
    except ValueError:
        pass
    try:
        d = dt.datetime.fromisoformat(t)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time: use now, a span back (7d), an ISO date (2026-11-01) or unix seconds"
        ) from None
    if d.tzinfo is None:
        d = d.replace(tzinfo=dt.UTC)
    return d.timestamp()


def add_window_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default=DEFAULT_DB, help=f"the accounting store (SQLite; default {DEFAULT_DB})")
    p.add_argument(
        "--window-before",
        type=float,
        default=600.0,
        help="attribution: seconds before a job's end a cause may be seen (default 600)",
    )
    p.add_argument(
        "--window-after",
        type=float,
        default=300.0,
        help="attribution: seconds after a job's end a cause may be seen (default 300)",
    )
    p.add_argument(
        "--min-severity",
        choices=("info", "warning", "critical"),
        default="critical",
        help="attribution: the least severe finding that names a cause (default critical)",
    )
    p.add_argument(
        "--large-gpus",
        type=nonneg_int,
        default=128,
        help="r_f counts jobs of more than this many GPUs (default 128, the paper's rule)",
    )
    p.add_argument(
        "--gpus-per-node",
        type=positive_int,
        default=8,
        help="GPUs of a node whose job/1 lists no gpus (default 8)",
    )
    p.add_argument(
        "--ckpt-interval",
        type=span_s,
        default=3600.0,
        help="checkpoint interval of the ETTR model, and the assumed one of jobs that report none "
        "(default 1h)",
    )
    p.add_argument(
        "--ettr-min",
        type=span_s,
        default=86400.0,
        help="ETTR is measured on jobs at least this long (default 24h)",
    )


def window_config(args: argparse.Namespace) -> tuple[Window, FigureConfig]:
    w = Window(args.window_before, args.window_after, args.min_severity)
    cfg = FigureConfig(
        large_gpus=args.large_gpus,
        gpus_per_node=args.gpus_per_node,
        ckpt_interval_s=args.ckpt_interval,
        ettr_min_hours=args.ettr_min / 3600,
    )
    return w, cfg
