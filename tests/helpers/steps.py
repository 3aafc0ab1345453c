"""Shared by the StepReporter's tests of both tiers: a job name of the test's own, and a script
that reports 5,000 steps from a child process, then exits (waiting first, with "wait", until they
are all delivered, and stepping on after a line on stdin)."""

from __future__ import annotations

import textwrap
import uuid


def new_job() -> str:
    return f"steps-{uuid.uuid4().hex[:12]}"


EXIT_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from fleetwatch.steps import StepReporter
    r = StepReporter(sys.argv[1], job="exit-test", rank=0, node="n1")
    for i in range(5000):
        r.step(i)
    if sys.argv[2] == "wait":
        deadline = time.monotonic() + 20
        while r.sent < 4999 and time.monotonic() < deadline:  # connected, all delivered
            time.sleep(0.01)
    print(json.dumps(r.stats()), flush=True)
    if sys.argv[2] == "wait":
        sys.stdin.readline()  # the test stops the broker, then lets us go on
        for i in range(5000, 5100):
            r.step(i, 0.01)
    print(json.dumps(r.stats()), flush=True)
    """
)
