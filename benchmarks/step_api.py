"""Per-call latency of fleetwatch.steps.StepReporter.step(), the call training loops make once per
step (issue 16, part 2; target: <= 20 us per call, median and p99).

Every call is timed on its own (time.perf_counter before and after, so each figure includes one
timer call) in a tight loop of --calls calls (200,000), after a warm-up, with the garbage collector
on as in a training job. Baselines measured in the same run, the same way:

- `timer only`: an empty timed region, the cost of the measurement itself;
- `perf_counter()`: one call of time.perf_counter (which step() makes to measure step times);
- `deque.append`: a bare append of a step's tuple (step, time, time.time(), None) to a bounded
  collections.deque, which is what step() does besides checking its arguments.

Cases: step(i) (time measured between calls) and step(i, 0.1) (time given), each with the
reporter's sender thread running against an unreachable broker (127.0.0.1:1: it retries the
connection meanwhile) and, with --bootstrap, against a real broker. With the default
send_interval_s (0.5 s) the sender sleeps through most of a back-to-back run; `paced` calls
step(i, 0.1) every --paced-us microseconds (busy-waiting), slowly enough that every step is
delivered while being timed: the figure with delivery going on. `sender busy` wakes the sender
every 10 ms (send_interval_s=0.01) and calls back to back: steps come ~100x faster than it can
deliver them, so the buffer overflows and drops (counted), and the thread works throughout,
sharing the GIL with the timed loop all the time: the worst case for the tail.

With --bootstrap, also the CPU the reporter costs the training process at 10 and 100 steps/s
(--cpu-seconds each): process CPU time of a loop that sleeps between step() calls, less the
same loop without them (the sender thread and the Kafka client's own threads included).

Exits 1 if any step() case exceeds 20 us at the median or p99.

    python benchmarks/step_api.py [--bootstrap 127.0.0.1:19092] [--calls 200000] [--json]
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import logging
import resource
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from fleetwatch.steps import StepReporter

TARGET_US = 20.0
UNREACHABLE = "127.0.0.1:1"
_perf = time.perf_counter


def timed(call: Callable[[int], Any], n: int) -> np.ndarray:
    """Seconds per call of call(i) for i in range(n), each call timed on its own."""
    out = [0.0] * n
    perf = _perf
    for i in range(n):
        t0 = perf()
        call(i)
        out[i] = perf() - t0
    return np.asarray(out)


def timed_empty(n: int) -> np.ndarray:
    out = [0.0] * n
    perf = _perf
    for i in range(n):
        t0 = perf()
        out[i] = perf() - t0
    return np.asarray(out)


def timed_step(r: StepReporter, n: int, given: bool, start: int = 0) -> np.ndarray:
    # Written out rather than through timed(): a lambda around step() would add its own call.
    out = [0.0] * n
    perf = _perf
    step = r.step
    if given:
        for i in range(n):
            t0 = perf()
            step(start + i, 0.1)
            out[i] = perf() - t0
    else:
        for i in range(n):
            t0 = perf()
            step(start + i)
            out[i] = perf() - t0
    return np.asarray(out)


def timed_paced(r: StepReporter, n: int, every_s: float, start: int) -> np.ndarray:
    out = [0.0] * n
    perf = _perf
    step = r.step
    nxt = perf()
    for i in range(n):
        nxt += every_s
        while perf() < nxt:  # busy-wait: a sleep would hand the GIL to the sender on purpose
            pass
        t0 = perf()
        step(start + i, 0.1)
        out[i] = perf() - t0
    return np.asarray(out)


def summary(name: str, secs: np.ndarray, **extra: Any) -> dict[str, Any]:
    us = secs * 1e6
    return {
        "case": name,
        "calls": int(us.size),
        "median_us": float(np.median(us)),
        "p99_us": float(np.percentile(us, 99)),
        "p999_us": float(np.percentile(us, 99.9)),
        "max_us": float(us.max()),
        **extra,
    }


def connected(bootstrap: str, **kw: Any) -> StepReporter:
    """A reporter whose sender thread has delivered a first step to `bootstrap`."""
    r = StepReporter(bootstrap, job="bench-step-api", rank=0, node="bench-node", **kw)
    deadline = time.monotonic() + 15
    r.step(0, 0.1)
    while r.sent == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    if r.sent == 0:
        raise SystemExit(f"no Kafka broker acknowledged a step at {bootstrap}")
    return r


def settle(r: StepReporter) -> None:
    deadline = time.monotonic() + 20
    while r.pending and time.monotonic() < deadline:
        time.sleep(0.01)


def case_row(name: str, r: StepReporter, before: dict[str, int], secs: np.ndarray) -> dict[str, Any]:
    after = r.stats()
    return summary(
        name, secs, sent=after["sent"] - before["sent"], dropped=after["dropped"] - before["dropped"]
    )


def run_target(
    label: str, bootstrap: str, calls: int, warmup: int, paced: tuple[int, float]
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    live = bootstrap != UNREACHABLE
    r = connected(bootstrap) if live else StepReporter(bootstrap, job="bench-step-api", rank=0, node="n")
    try:
        base = 1
        timed_step(r, warmup, True, base)
        base += warmup
        for given in (False, True):
            r.reset_clock()
            before = r.stats()
            secs = timed_step(r, calls, given, base)
            base += calls
            rows.append(case_row(f"{'step(i, 0.1)' if given else 'step(i)'}, {label}", r, before, secs))
        if live:
            n, every_s = paced
            settle(r)  # the back-to-back cases' leftovers
            before = r.stats()
            secs = timed_paced(r, n, every_s, base)
            settle(r)
            rows.append(case_row(f"step(i, 0.1) every {every_s * 1e6:.0f} us, {label}", r, before, secs))
    finally:
        r.close(2)
    if live:
        # The sender woken every 10 ms instead of every 500: it takes steps out of the buffer
        # while they are being timed, busy throughout (the GIL shared with it all the time).
        r = connected(bootstrap, send_interval_s=0.01)
        try:
            timed_step(r, warmup, True, 1)
            before = r.stats()
            secs = timed_step(r, calls, True, 1 + warmup)
            rows.append(case_row(f"step(i, 0.1), {label}, sender busy", r, before, secs))
        finally:
            r.close(2)
    return rows


def cpu_s() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def paced_loop(call: Callable[[int], Any], rate: float, seconds: float) -> float:
    """Process CPU seconds over `seconds` of call(i) at `rate` per second, sleeping in between."""
    n = int(rate * seconds)
    c0 = cpu_s()
    nxt = time.monotonic()
    for i in range(n):
        call(i)
        nxt += 1.0 / rate
        time.sleep(max(0.0, nxt - time.monotonic()))
    return cpu_s() - c0


def sender_cpu(bootstrap: str, rate: float, seconds: float) -> dict[str, Any]:
    """The CPU a reporter costs the training process at a realistic step rate: process CPU time
    of a loop sleeping between step() calls, less the same loop without them."""
    bare = paced_loop(lambda i: None, rate, seconds)
    r = connected(bootstrap)
    try:
        settle(r)
        before = r.stats()
        c0 = cpu_s()
        paced_loop(lambda i: r.step(i, 0.1), rate, seconds)
        settle(r)  # the last steps' sending counts too
        used = cpu_s() - c0 - bare
        after = r.stats()
    finally:
        r.close(2)
    n = int(rate * seconds)
    return {
        "case": f"{rate:g} steps/s for {seconds:g} s",
        "cpu_ms_per_s": used / seconds * 1e3,
        "cpu_us_per_step": used / n * 1e6,
        "sent": after["sent"] - before["sent"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", default=None, help="a real broker to run against as well (HOST:PORT)")
    ap.add_argument("--calls", type=int, default=200_000, help="timed calls per case (200000)")
    ap.add_argument("--warmup", type=int, default=20_000)
    ap.add_argument("--paced-us", type=float, default=200.0, help="interval of the paced case (200 us)")
    ap.add_argument("--paced-calls", type=int, default=10_000)
    ap.add_argument("--cpu-seconds", type=float, default=3.0, help="per rate of the CPU case (0: skip)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    # the Kafka client logs every refused connection of the unreachable case: not a result.
    logging.basicConfig(level=logging.CRITICAL)

    gc.collect()
    rows: list[dict[str, Any]] = []
    d: collections.deque[tuple[int, float, float, None]] = collections.deque(maxlen=10_000)
    now = time.time
    append = d.append
    n = args.calls
    timed_empty(args.warmup)
    rows.append(summary("timer only", timed_empty(n)))
    rows.append(summary("perf_counter()", timed(lambda i: _perf(), n)))
    # the lambda adds a Python call, as step() is one
    rows.append(
        summary(
            "deque.append((i, 0.1, time.time(), None))", timed(lambda i: append((i, 0.1, now(), None)), n)
        )
    )
    baseline = rows[-1]

    targets = [("unreachable broker", UNREACHABLE)]
    if args.bootstrap:
        targets.append((f"broker {args.bootstrap}", args.bootstrap))
    for label, bootstrap in targets:
        rows.extend(run_target(label, bootstrap, n, args.warmup, (args.paced_calls, args.paced_us / 1e6)))

    cpu_rows: list[dict[str, Any]] = []
    if args.bootstrap and args.cpu_seconds > 0:
        cpu_rows = [sender_cpu(args.bootstrap, rate, args.cpu_seconds) for rate in (10.0, 100.0)]

    failed = []
    for row in rows:
        row["x_deque_append_median"] = row["median_us"] / baseline["median_us"]
        if row["case"].startswith("step(") and (row["median_us"] > TARGET_US or row["p99_us"] > TARGET_US):
            failed.append(row["case"])

    if args.json:
        out = {"target_us": TARGET_US, "rows": rows, "sender_cpu": cpu_rows, "failed": failed}
        print(json.dumps(out, indent=2))
    else:
        head = f"{'case':58s} {'median':>8s} {'p99':>8s} {'p99.9':>8s} {'max':>9s} {'x append':>8s}"
        print(f"{head}  sent/dropped")
        for row in rows:
            extra = f"  {row['sent']}/{row['dropped']}" if "sent" in row else ""
            print(
                f"{row['case']:58s} {row['median_us']:7.2f}u {row['p99_us']:7.2f}u {row['p999_us']:7.2f}u "
                f"{row['max_us']:8.1f}u {row['x_deque_append_median']:8.2f}{extra}"
            )
        for c in cpu_rows:
            print(
                f"sender CPU at {c['case']}: {c['cpu_ms_per_s']:.1f} ms per s "
                f"({c['cpu_us_per_step']:.0f} us per step), {c['sent']} sent"
            )
        print(
            f"target: median and p99 <= {TARGET_US:.0f} us per step() call: {'MISSED' if failed else 'met'}"
        )
        for case in failed:
            print(f"  missed: {case}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
