"""Honest evaluation of the online statistical detector on real labelled server telemetry; the
shared driver of benchmarks/asd_eval.py and benchmarks/smd_eval.py.

Per machine:
1. the pipeline's detector, ``MultivariateScorer`` (detectors/multivariate.py) with the
   configuration the pipeline runs (``MultivariateParams.for_interval`` of the data's sample
   interval: a baseline and relation model remembering a day), one group in one calibration
   pool, its floor the data's resolution: train streamed in order (learning only), then test in order,
   each sample scored before it is learned (no look-ahead), learning going on;
2. flags at a threshold fixed in advance: score (1 - p) >= 0.999 (the primary figure, nominally
   0.1 % of healthy points) and 0.99 beside it: never chosen on labels;
3. the baselines (benchmarks/baselines.py), each at a threshold fixed in advance (the 99.9 %
   quantile of its own train scores) and at an equal alarm budget (exactly as many test points
   flagged as the pipeline's detector flags at 0.999 on that machine, its highest scores);
4. figures, none point-adjusted: point P/R/F1; event P/R/F1 (an event is a contiguous labelled
   segment, detected if any of its points is flagged; a false event is a contiguous flagged
   segment touching no event); `normal_flagged`, the share of normal points flagged; the median
   detection delay in samples over detected events (first flag minus event start); VUS-PR
   (benchmarks/vus.py, threshold-free, TSB-AD's definition and window); PA-F1, the
   point-adjusted F1 the literature quotes, beside them only.

Rows carry ``"pipeline": true`` for the pipeline's configuration: that row is the one judged.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from benchmarks.baselines import BASELINES, Context
from benchmarks.vus import period, vus_pr
from fleetwatch.detectors.multivariate import MultivariateParams, MultivariateScorer

PIPELINE_DETECTOR = "multivariate"
THRESHOLDS = (0.999, 0.99)  # fixed before looking at any test label
BASELINE_QUANTILE = 0.999


@dataclass(frozen=True)
class Dataset:
    name: str
    prefix: str  # machine file prefix: f"{prefix}{machine}_train.csv[.gz]"
    default_dir: Path
    default_machines: str
    resolution: float  # the values' quantum, known without labels (the published precision)
    interval_s: float  # seconds between samples

    @property
    def day(self) -> int:
        return round(86_400 / self.interval_s)

    @property
    def params(self) -> MultivariateParams:
        """The configuration the pipeline runs on samples this far apart."""
        return MultivariateParams.for_interval(self.interval_s)


def _read(path: Path) -> np.ndarray:
    return np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2)  # .gz is read as gzip


def load(ds: Dataset, data_dir: Path, machine: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(train (T1, M), test (T2, M), labels (T2,) int); fails loudly on a missing or odd file."""
    found = []
    for split in ("train", "test"):
        cands = [data_dir / f"{ds.prefix}{machine}_{split}.csv{ext}" for ext in ("", ".gz")]
        path = next((p for p in cands if p.is_file()), None)
        if path is None:
            raise FileNotFoundError(f"{ds.name} file missing: {cands[0]}[.gz]")
        found.append(_read(path))
    train, test = found
    if test.shape[1] != train.shape[1] + 1:
        raise ValueError(
            f"{ds.prefix}{machine}: test needs train's {train.shape[1]} columns + label, has {test.shape[1]}"
        )
    y = test[:, -1]
    if not np.isin(y, (0, 1)).all():
        raise ValueError(f"{ds.prefix}{machine}: labels must be 0 or 1")
    return train, test[:, :-1], y.astype(np.int64)


# -- the pipeline's detector ----------------------------------------------------------------
def online_p(train: np.ndarray, test: np.ndarray, resolution: float,
             params: MultivariateParams) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(train p, test p) of one machine streamed through the scorer one sample per batch, as a
    node's samples reach the pipeline."""
    scorer = MultivariateScorer(train.shape[1], floor=resolution, params=params)
    rows = scorer.add_groups(np.zeros(1, dtype=np.int64))
    data = np.ascontiguousarray(np.vstack([train, test]))
    p = np.full(len(data), np.nan)
    for t in range(len(data)):
        p[t] = scorer.update(rows, data[t : t + 1]).p[0]
    return p[: len(train)], p[len(train) :]


# -- figures --------------------------------------------------------------------------------
def segments(mask: np.ndarray) -> list[tuple[int, int]]:
    """Contiguous True runs as [start, end) pairs."""
    d = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(d == 1).tolist(), np.flatnonzero(d == -1).tolist(), strict=True))


def _prf(tp: float, fp: float, fn: float) -> tuple[float, float, float]:
    p = tp / (tp + fp) if tp + fp else 0.0
    r = tp / (tp + fn) if tp + fn else 0.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def point_prf(y: np.ndarray, flag: np.ndarray) -> tuple[float, float, float]:
    tp = float(np.sum(flag & (y == 1)))
    return _prf(tp, float(np.sum(flag & (y == 0))), float(np.sum(~flag & (y == 1))))


def event_prf(y: np.ndarray, flag: np.ndarray) -> tuple[float, float, float, int, int]:
    """(precision, recall, F1, detected events, false events); see the module docstring."""
    events = segments(y == 1)
    detected = sum(1 for a, b in events if flag[a:b].any())
    false = sum(1 for a, b in segments(flag) if not (y[a:b] == 1).any())
    p, r, f = _prf(detected, false, len(events) - detected)
    return p, r, f, detected, false


def delays(y: np.ndarray, flag: np.ndarray) -> list[int]:
    """Samples from each detected event's start to its first flag."""
    out = []
    for a, b in segments(y == 1):
        hit = np.flatnonzero(flag[a:b])
        if len(hit):
            out.append(int(hit[0]))
    return out


def point_adjusted_f1(y: np.ndarray, flag: np.ndarray) -> float:
    adj = flag.copy()
    for a, b in segments(y == 1):
        if flag[a:b].any():
            adj[a:b] = True
    return point_prf(y, adj)[2]


@dataclass
class Row:
    machine: str
    detector: str
    threshold: str
    budget: str  # "fixed": a threshold fixed in advance; "equal": the pipeline's alarm count
    pipeline: bool
    flagged: float  # share of test points flagged
    normal_flagged: float  # share of normal test points flagged
    p: float
    r: float
    f1: float
    ev_p: float
    ev_r: float
    ev_f1: float
    events: int
    detected: int
    false_events: int
    delay_median: float  # samples; NaN when nothing was detected
    vus_pr: float
    pa_f1: float
    delays: list[int]  # each detected event's delay, in samples


def evaluate(machine: str, detector: str, threshold: str, budget: str, y: np.ndarray, flag: np.ndarray,
             vus: float, pipeline: bool = False) -> Row:  # fmt: skip
    p, r, f = point_prf(y, flag)
    ep, er, ef, det, false = event_prf(y, flag)
    d = delays(y, flag)
    return Row(machine, detector, threshold, budget, pipeline, float(flag.mean()), float(flag[y == 0].mean()),
               p, r, f, ep, er, ef, len(segments(y == 1)), det, false,
               float(np.median(d)) if d else float("nan"), vus, point_adjusted_f1(y, flag), d)  # fmt: skip


def top_k(score: np.ndarray, k: int) -> np.ndarray:
    """Exactly the k highest scores flagged (ties broken by time, earliest first)."""
    flag = np.zeros(len(score), dtype=bool)
    if k > 0:
        order = np.argsort(-np.nan_to_num(score, nan=-np.inf), kind="stable")
        flag[order[:k]] = True
    return flag


def run_machine(ds: Dataset, data_dir: Path, machine: str,
                baselines: dict[str, Callable] | None = None) -> list[Row]:  # fmt: skip
    train, test, y = load(ds, data_dir, machine)
    name = f"{ds.prefix}{machine}"
    window = period(test[:, 0])
    ctx = Context(resolution=ds.resolution, day=ds.day)
    _, p_test = online_p(train, test, ds.resolution, ds.params)
    surprise = -np.log(np.nan_to_num(p_test, nan=1.0))  # the score as a ranking, for VUS-PR
    vus = vus_pr(y, surprise, window)
    rows = []
    for t in THRESHOLDS:
        flag = np.nan_to_num(p_test, nan=1.0) <= 1.0 - t + 1e-12
        rows.append(evaluate(name, PIPELINE_DETECTOR, f"{t}", "fixed", y, flag, vus, pipeline=True))
    budget = int(np.sum(np.nan_to_num(p_test, nan=1.0) <= 1.0 - THRESHOLDS[0] + 1e-12))
    for det, fn in (BASELINES if baselines is None else baselines).items():
        s_train, s_test = fn(train, test, ctx)
        vus_b = vus_pr(y, np.nan_to_num(s_test, nan=np.nanmin(s_test)), window)
        cut = float(np.nanquantile(s_train, BASELINE_QUANTILE))
        rows.append(
            evaluate(
                name,
                det,
                f"train q{BASELINE_QUANTILE}",
                "fixed",
                y,
                np.nan_to_num(s_test, nan=-np.inf) > cut,
                vus_b,
            )
        )
        rows.append(evaluate(name, det, f"top {budget}", "equal", y, top_k(s_test, budget), vus_b))
    return rows


def mean_rows(rows: list[Row]) -> list[Row]:
    """Mean over machines per (detector, threshold kind); counts are totals; the delay is the
    median over every detected event of the machines."""
    groups: dict[tuple[str, str, str], list[Row]] = {}
    for r in rows:
        kind = r.threshold if r.budget == "fixed" else "equal budget"
        groups.setdefault((r.detector, kind, r.budget), []).append(r)
    out = []
    for (det, thr, budget), rs in groups.items():
        means = ("flagged", "normal_flagged", "p", "r", "f1", "ev_p", "ev_r", "ev_f1", "vus_pr", "pa_f1")
        num = {f: float(np.mean([getattr(r, f) for r in rs])) for f in means}
        cnt = {f: int(sum(getattr(r, f) for r in rs)) for f in ("events", "detected", "false_events")}
        ds = [d for r in rs for d in r.delays]
        out.append(Row("MEAN", det, thr, budget, rs[0].pipeline, **num, **cnt,
                       delay_median=float(np.median(ds)) if ds else float("nan"), delays=ds))  # fmt: skip
    return out


def format_table(rows: list[Row]) -> str:
    head = (
        f"{'machine':12} {'detector':18} {'threshold':16} {'flag%':>6} {'norm%':>6} | "
        f"{'P':>5} {'R':>5} {'F1':>5} | {'evP':>5} {'evR':>5} {'evF1':>5} {'det/ev':>7} "
        f"{'falseEv':>7} {'delay':>5} | {'VUS-PR':>6} {'PA-F1':>6}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        mark = "*" if r.pipeline else " "
        lines.append(
            f"{r.machine:12} {mark}{r.detector:17} {r.threshold:16} {100 * r.flagged:6.2f} "
            f"{100 * r.normal_flagged:6.3f} | {r.p:5.3f} {r.r:5.3f} {r.f1:5.3f} | "
            f"{r.ev_p:5.3f} {r.ev_r:5.3f} {r.ev_f1:5.3f} {f'{r.detected}/{r.events}':>7} "
            f"{r.false_events:7d} {r.delay_median:5.1f} | {r.vus_pr:6.3f} {r.pa_f1:6.3f}"
        )
    return "\n".join(lines)


def main(ds: Dataset, argv: list[str] | None = None, doc: str = "") -> int:
    ap = argparse.ArgumentParser(description=(doc or __doc__ or "").splitlines()[0])
    ap.add_argument(
        "--data", type=Path, default=ds.default_dir, help=f"{ds.name} directory (default {ds.default_dir})"
    )
    ap.add_argument("--machines", default=ds.default_machines, help="comma list of machine ids")
    ap.add_argument("--json", action="store_true", help="print JSON instead of tables")
    ap.add_argument("--no-baselines", action="store_true", help="the pipeline's detector only")
    args = ap.parse_args(argv)
    machines = [m.strip() for m in args.machines.split(",") if m.strip()]
    t0 = time.perf_counter()
    rows: list[Row] = []
    for m in machines:
        rows.extend(run_machine(ds, args.data, m, {} if args.no_baselines else None))
    means = mean_rows(rows)
    elapsed = time.perf_counter() - t0
    if args.json:
        doc_rows = {
            "rows": [asdict(r) for r in rows],
            "mean": [asdict(r) for r in means],
            "seconds": round(elapsed, 2),
        }
        print(_dumps(doc_rows))
        return 0
    for m in machines:
        print(format_table([r for r in rows if r.machine == f"{ds.prefix}{m}"]))
        print()
    print("Mean over machines (det/ev and falseEv are totals; delay: the median over their detected events):")
    print(format_table(means))
    print(f"\n* the pipeline's configuration. No point adjustment except PA-F1. ({elapsed:.1f} s)")
    return 0


def _dumps(doc: dict) -> str:
    """JSON with NaN written as null (a delay with no detection), which every reader accepts."""

    def clean(v: object) -> object:
        if isinstance(v, float) and v != v:
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v

    return json.dumps(clean(doc), indent=1)


if __name__ == "__main__":
    sys.exit("run benchmarks.asd_eval or benchmarks.smd_eval")
