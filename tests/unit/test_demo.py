"""The demo console's one clock (fleetwatch/demo.py): drains printed on the simulated clock. The
demo end to end, and its storm line from a real Alertmanager: tests/integration/test_demo.py."""

from __future__ import annotations

import pytest

from fleetwatch.demo import SimClock


def test_drains_are_printed_on_the_simulated_clock() -> None:
    speed, started = 10.0, 1_700_000_000.0  # the demo spawns the simulator at `started` ...
    epoch = started - 270.0  # ... with this simulated second 0 (the simulation trails the wall clock)
    wall0 = started + 1.7  # the simulator's loop starts once its process is up
    clock = SimClock(epoch, started, speed)
    assert clock.at(started + 1.0) == pytest.approx(epoch + 10.0)  # no record yet: a first guess
    clock.observe(epoch - 5000, started - 100)  # a record of an earlier run on the same broker
    for k in range(0, 50, 5):  # the simulator's records, sent on time or a little late
        clock.observe(epoch + k, wall0 + k / speed + (0.05 if k % 2 else 0.0))
    # A drain issued 3 wall seconds into the simulation happened at simulated second 30.
    assert clock.at(wall0 + 3.0) == pytest.approx(epoch + 30.0, abs=1e-3)
