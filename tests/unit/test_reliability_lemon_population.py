"""The lemon test's population (pipeline/reliability/report.py, _nodes_seen): the nodes seen in
the report's range, not every name the history ever held. A job/1 can name any node: one old record
naming 20,000 invented nodes lowered the fleet's rate and made a real node a lemon."""

from __future__ import annotations

import pytest

from fleetwatch.pipeline.reliability import report
from fleetwatch.pipeline.reliability.ingest import Ingest
from fleetwatch.pipeline.reliability.store import Store
from tests.helpers.reliability import T0, job

DAY = 86400.0
NODES = [f"n{i:02d}" for i in range(50)]


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "a.sqlite")
    yield s
    s.close()


def _run(store, name, nodes, start, end_state="COMPLETED", length=3600.0):
    ing = Ingest(store)
    state = "finished" if end_state == "COMPLETED" else "failed"
    with store.transaction() as db:
        ing.job(db, job(name, nodes, "started", start, start_ts=start, gpus=[8] * len(nodes)), None)
        ing.job(db, job(name, nodes, state, start + length, end_state=end_state, start_ts=start), None)


def _fleet(store):
    """50 nodes; one NODE_FAIL on each of ten, days apart, and three on n00: no lemon among 50."""
    for i in range(1, 11):
        _run(store, f"a{i}", [NODES[i]], T0 + i * 2 * DAY, "NODE_FAIL")
    for d in (3, 10, 20):
        _run(store, f"b{d}", ["n00"], T0 + d * DAY, "NODE_FAIL")
    _run(store, "all", NODES, T0 + DAY)


def _lemons(store):
    got = report.build(store, T0, T0 + 28 * DAY)["lemons"]
    return got["nodes"], [x["node"] for x in got["lemons"]]


@pytest.mark.parametrize("census", [True, False])
def test_nodes_named_only_outside_the_range_are_not_the_fleet(store, census):
    if census:
        with store.transaction() as db:
            for n in NODES:
                store.upsert_node(db, n, T0 - 30 * DAY, T0 + 27 * DAY)
            store.upsert_node(db, "retired", T0 - 400 * DAY, T0 - 200 * DAY)  # not seen in the range
    _fleet(store)
    assert _lemons(store) == (50, [])
    _run(store, "ghost", [f"ghost{i}" for i in range(20000)], T0 - 365 * DAY, length=1.0)
    assert _lemons(store) == (50, [])


def test_with_a_census_names_it_never_saw_are_not_the_fleet_even_in_the_range(store):
    with store.transaction() as db:
        for n in NODES:
            store.upsert_node(db, n, T0 - 30 * DAY, T0 + 27 * DAY)
    _fleet(store)
    _run(store, "ghost", [f"ghost{i}" for i in range(20000)], T0 + 5 * DAY, length=1.0)
    assert _lemons(store) == (50, [])
