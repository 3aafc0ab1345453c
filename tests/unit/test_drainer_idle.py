"""slurm-drainer's --idle-exit counts from the last record or the last assignment: a group join that
takes longer than the idle time (librdkafka's first rebalance waits ~3 s) must not make the drainer
give up before it has read anything."""

import time

from fleetwatch.alerts.slurm_drainer import JOIN_WAIT_S, idle_for


def test_before_the_first_assignment_idle_time_starts_only_after_the_join_wait() -> None:
    started = time.monotonic() - 5.0  # five seconds of joining, no assignment yet
    assert idle_for(started, []) < 0  # an --idle-exit of 2 s does not fire
    assert idle_for(started - JOIN_WAIT_S, []) >= 5.0  # a join that never comes still ends


def test_after_an_assignment_idle_time_counts_from_the_later_of_it_and_the_last_record() -> None:
    now = time.monotonic()
    assert 0.0 <= idle_for(now - 60.0, [now - 1.0]) < 2.0  # assigned 1 s ago: 1 s idle, not 60
    assert 3.0 <= idle_for(now - 3.0, [now - 60.0]) < 5.0  # last record 3 s ago
