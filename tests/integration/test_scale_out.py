"""Scale-out (issue 6, item 5): three detect Workers in one consumer group, on the real topics
and their partitions, find exactly the incidents (the same finding ids) that ONE worker of a
second group finds in the same messages, and that the clock-free in-process path (NodeTask and
JobTask driven as pipeline/evaluate.py drives them) finds in the same simulation.

The cluster is 1,024 simulated nodes x 20 ticks with a handful of sudden faults spread over the
node range (so over every partition), one of them a node that goes silent (found only through
the other nodes' event time). Ids are compared, not counts.

The helpers (an in-process detect member, committed start offsets, "drained" checks) are in
tests/integration/scale.py, shared with test_fault_tolerance.py.
"""

from __future__ import annotations

import time
import uuid

from fleetwatch import topics
from fleetwatch.collectors.sim.cli import live_epoch
from tests.integration.scale import (
    Member,
    commit_start,
    describe,
    drain_tail,
    expected_ids,
    first_by_id,
    mine,
    produce,
    scenario,
    sim_ticks,
    wait_balanced,
    wait_drained,
)
from tests.integration.services import APART, TopicTail

pytestmark = APART

# ---------------------------------------------------------------- the test


SILENT_FROM = 4  # the tick at which node 1000 goes down


def test_three_workers_find_what_one_worker_and_the_in_process_path_find(kafka_bootstrap: str) -> None:
    run = uuid.uuid4().hex[:6]
    prefix = f"so{run}-"
    faults = [
        {"kind": "xid79", "node": 5, "gpu": 3, "onset_s": 3},
        {"kind": "sw_crash", "node": 300, "gpu": 0, "onset_s": 4},
        {"kind": "ib_link_down", "node": 517, "onset_s": 6},
        {"kind": "xid48", "node": 777, "gpu": 1, "onset_s": 8},
        {"kind": "node_down", "node": 1000, "onset_s": SILENT_FROM},
    ]
    sc = scenario(prefix, 1024, 20, faults)
    # every tick stamped before it is sent (as `fleetwatch simulate` stamps them: live_epoch), so no
    # sample is ahead of the broker's time, where the node stage would cap its event time
    epoch = float(int(live_epoch(time.time(), 20, 0.0)))
    ticks = sim_ticks(sc, epoch)
    expected = expected_ids(sc, epoch)
    kinds = {(f["node"], f["kind"]) for f in expected.values()}
    # the in-process path finds every injected fault (and nothing on the other 1,019 nodes)
    assert kinds >= {
        (f"{prefix}0005", "xid"),
        (f"{prefix}0300", "xid"),
        (f"{prefix}0517", "ib_link"),
        (f"{prefix}0777", "xid"),
        (f"{prefix}1000", "host"),
    }, describe(expected)
    assert {f["node"] for f in expected.values()} == {f"{prefix}{n:04d}" for n in (5, 300, 517, 777, 1000)}, (
        describe(expected)
    )

    many, one = f"test-scale-many-{run}", f"test-scale-one-{run}"
    commit_start(kafka_bootstrap, many)
    commit_start(kafka_bootstrap, one)

    # Three members in one group, balanced before the stream starts; they process it live.
    tail = TopicTail(kafka_bootstrap, topics.FINDINGS)
    members = [Member(kafka_bootstrap, many, f"m{i}") for i in range(3)]
    try:
        wait_balanced(kafka_bootstrap, members)
        # one tick a second from the silent node's last one on, until its silence is judged (on the
        # broker's clock, detectors/silence.py: silent_after_s of the others' records reaching it)
        produce(kafka_bootstrap, ticks[:SILENT_FROM])
        produce(kafka_bootstrap, ticks[SILENT_FROM : SILENT_FROM + 12], pace_s=1.0)
        produce(kafka_bootstrap, ticks[SILENT_FROM + 12 :])
        wait_drained(kafka_bootstrap, many, 60)
        for m in members:
            m.check()
        recs_many = drain_tail(tail)
    finally:
        for m in members:
            m.close()
        tail.close()
    got_many = first_by_id(mine(recs_many, prefix))

    # One member of a second group over the same messages (a replay from its committed start).
    tail = TopicTail(kafka_bootstrap, topics.FINDINGS)
    single = Member(kafka_bootstrap, one, "solo")
    try:
        wait_drained(kafka_bootstrap, one, 60)
        single.check()
        recs_one = drain_tail(tail)
    finally:
        single.close()
        tail.close()
    got_one = first_by_id(mine(recs_one, prefix))

    assert set(got_many) == set(got_one), (describe(got_many), describe(got_one))
    assert set(got_one) == set(expected), (describe(got_one), describe(expected))
