"""Attribution of job ends (pipeline/reliability/attribution.py, taxonomy.py): the window, the
severity floor, the order among several causes, and what never blames anyone."""

from __future__ import annotations

import numpy as np
import pytest

from fleetwatch.pipeline.reliability.attribution import Candidate, Window, attribute, base_category
from fleetwatch.pipeline.reliability.history import load
from fleetwatch.pipeline.reliability.ingest import Ingest
from fleetwatch.pipeline.reliability.store import LASTING_FINDING_S, Store
from fleetwatch.pipeline.reliability.taxonomy import finding_cause
from tests.helpers.reliability import T0, finding, job


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "a.sqlite")
    yield s
    s.close()


def _run(store, name, nodes, end, end_state, start=None):
    ing = Ingest(store)
    with store.transaction() as db:
        ing.job(db, job(name, nodes, "started", start if start is not None else end - 3600), None)
        state = "finished" if end_state in ("COMPLETED", "CANCELLED", "TIMEOUT") else "failed"
        ing.job(db, job(name, nodes, state, end, end_state=end_state), None)


def _finding(store, f):
    with store.transaction() as db:
        Ingest(store).finding(db, f, None)


def _attributed(store, window=None):
    h = load(store, T0 - 86400, T0 + 86400, window or Window())
    return {
        str(j): (c, comp, ev)
        for j, c, comp, ev in zip(h.job, h.category, h.component, h.evidence, strict=True)
    }


@pytest.mark.parametrize(
    ("opened", "resolved", "blamed"),
    [
        (-900, -601, False),  # resolved a second before the window opened
        (-900, -600, True),  # resolved as it opened
        (-600, None, True),
        (0, None, True),
        (300, None, True),  # opened as the window closed
        (301, None, False),
    ],
)
def test_a_cause_counts_from_ten_minutes_before_to_five_after_the_end(store, opened, resolved, blamed):
    _run(store, "j", ["n1", "n2"], T0, "FAILED")
    f = finding("n2", "ecc", T0 + opened)
    _finding(store, f)
    if resolved is not None:
        _finding(store, finding("n2", "ecc", T0 + resolved, first_seen=T0 + opened, resolved=True))
    got = _attributed(store)["j"]
    assert got == (("hardware", "gpu_memory", [f["id"]]) if blamed else ("user", None, []))


def test_a_finding_open_across_the_window_counts_and_one_resolved_before_it_does_not(store):
    _run(store, "a", ["n1"], T0, "FAILED")
    _run(store, "b", ["n2"], T0, "FAILED")
    opened = finding("n1", "pcie", T0 - 7200)  # opened two hours before, still open
    _finding(store, opened)
    old = finding("n2", "pcie", T0 - 7200)
    _finding(store, old)
    _finding(store, finding("n2", "pcie", T0 - 3600, first_seen=T0 - 7200, resolved=True))
    got = _attributed(store)
    assert got["a"] == ("hardware", "pcie", [opened["id"]])
    assert got["b"] == ("user", None, [])


def test_node_fail_is_never_the_users_even_with_nothing_seen(store):
    _run(store, "j", ["n1"], T0, "NODE_FAIL")
    _run(store, "k", ["n2"], T0, "BOOT_FAIL")
    got = _attributed(store)
    assert got["j"] == ("hardware", "node", [])
    assert got["k"] == ("hardware", "node", [])


def test_warnings_do_not_blame_by_default_but_can_be_asked_to(store):
    _run(store, "j", ["n1"], T0, "FAILED")
    f = finding("n1", "thermal", T0 - 60, severity="warning")
    _finding(store, f)
    assert _attributed(store)["j"] == ("user", None, [])
    assert _attributed(store, Window(min_severity="warning"))["j"] == ("hardware", "thermal", [f["id"]])


def test_the_most_specific_cause_wins_and_every_cause_is_kept_as_evidence(store):
    _run(store, "j", ["n1", "n2", "n3"], T0, "FAILED")
    ib = finding("n1", "ib_link", T0 - 300)
    ecc = finding("n2", "ecc", T0 - 100)
    mount = finding("n3", "mount", T0 - 500)
    for f in (ib, ecc, mount):
        _finding(store, f)
    category, component, evidence = _attributed(store)["j"]
    assert (category, component) == ("hardware", "gpu_memory")
    assert evidence[0] == ecc["id"]
    assert set(evidence) == {ib["id"], ecc["id"], mount["id"]}


def test_findings_that_name_no_cause_never_blame(store):
    _run(store, "j", ["n1"], T0, "FAILED")
    for kind in ("statistical", "straggler", "lemon", "kernel_log"):
        _finding(store, finding("n1", kind, T0 - 60))
    _finding(store, finding("n1", "host", T0 - 60, rule="clock_skew"))
    # an application's XID (13, graphics engine exception: the program's own fault)
    _finding(store, finding("n1", "xid", T0 - 60, evidence={"cause": "application", "worst_xid": 13}))
    assert _attributed(store)["j"] == ("user", None, [])


def test_findings_on_other_nodes_or_of_a_completed_job_blame_nothing(store):
    _run(store, "failed", ["n1"], T0, "FAILED")
    _run(store, "done", ["n2"], T0, "COMPLETED")
    _run(store, "cancelled", ["n2"], T0, "CANCELLED")
    _finding(store, finding("n2", "ecc", T0 - 60))
    got = _attributed(store)
    assert got["failed"] == ("user", None, [])
    assert got["done"] == ("completed", None, [])
    assert got["cancelled"] == ("other", None, [])


@pytest.mark.parametrize(
    ("evidence", "expected"),
    [
        ({"cause": "hardware", "worst_xid": 94}, ("hardware", "gpu_memory")),
        ({"cause": "hardware", "worst_xid": 79}, ("hardware", "pcie")),
        ({"cause": "driver", "worst_xid": 119}, ("system_software", "driver")),
        ({"cause": "hardware", "worst_xid": 74}, ("hardware", "gpu")),
        ({"cause": "unknown", "worst_xid": 999}, ("hardware", "gpu")),
        ({}, ("hardware", "gpu")),
    ],
)
def test_an_xid_blames_what_its_catalogued_cause_names(evidence, expected):
    cause = finding_cause("xid", "xid_burst", evidence)
    assert cause is not None
    assert (cause.domain, cause.component) == expected


def test_a_missing_adapter_blames_what_is_missing():
    gpu = finding_cause("device_count", "gpu_count", {})
    hca = finding_cause("device_count", "hca_count", {})
    assert gpu is not None and (gpu.domain, gpu.component) == ("hardware", "gpu")
    assert hca is not None and (hca.domain, hca.component) == ("hardware", "ib_link")


def test_hostile_evidence_never_raises():
    for ev in ({"cause": ["x"], "worst_xid": "79"}, {"worst_xid": 10**30}, {"cause": None}):
        assert finding_cause("xid", None, ev) is not None


def test_the_same_inputs_always_give_the_same_winner():
    cands = [Candidate(0, f"f{i}", "critical", "hardware", "gpu", 2, 100.0) for i in (3, 1, 2)]
    a = attribute(["FAILED"], cands, Window())[0]
    b = attribute(["FAILED"], list(reversed(cands)), Window())[0]
    assert a.evidence == b.evidence == ["f1", "f2", "f3"]


@pytest.mark.parametrize(
    ("state", "category"),
    [
        ("COMPLETED", "completed"),
        ("FAILED", "user"),
        ("OUT_OF_MEMORY", "user"),
        ("NODE_FAIL", "hardware"),
        ("TIMEOUT", "other"),
        ("PREEMPTED", "other"),
        ("SOMETHING_NEW", "other"),
    ],
)
def test_end_states_before_any_finding(state, category):
    assert base_category(state) == category


def test_a_window_must_make_sense():
    with pytest.raises(ValueError):
        Window(before_s=-1)
    with pytest.raises(ValueError):
        Window(min_severity="fatal")


def _raw_findings(store, rows):
    """Cause-naming critical findings on `rows` of (id, node, first_seen, resolved_ts or None)."""
    with store.transaction() as db:
        db.executemany(
            "INSERT INTO findings VALUES (?, ?, NULL, 'ecc', 'r', 'critical', 's', ?, ?, ?, "
            "'hardware', 'gpu_memory', 1)",
            [
                (fid, node, first, first if resolved is None else resolved, resolved)
                for fid, node, first, resolved in rows
            ],
        )


def _failed_runs(store, runs):
    """Failed runs of (job, nodes, end), an hour long."""
    with store.transaction() as db:
        for name, nodes, end in runs:
            rid = store.insert_run(db, name, end - 3600, "failed", nodes, 8 * len(nodes), True)
            store.end_run(db, rid, end, "failed", "FAILED", 1, None)


def test_the_join_finds_exactly_the_findings_open_in_each_runs_window(store):
    """Against the definition, on findings of every duration (open ones, those lasting about
    LASTING_FINDING_S, where the join's two parts meet) and times on the window's edges."""
    rng = np.random.default_rng(7)
    w = Window()
    nodes = ["n1", "n2", "n3"]
    runs = [
        (f"j{i}", list(rng.choice(nodes, rng.integers(1, 3), replace=False)), T0 + i * 7200.0)
        for i in range(40)
    ]
    durations = [
        0.0,
        60.0,
        3600.0,
        LASTING_FINDING_S - 1,
        LASTING_FINDING_S,
        LASTING_FINDING_S + 1,
        3 * 86400.0,
    ]
    rows = []
    for k in range(600):
        first = T0 + rng.uniform(-4 * 86400, 5 * 86400)
        d = durations[k % len(durations)] if k % 8 else None
        rows.append((f"r{k}", str(rng.choice(nodes)), first, None if d is None else first + d))
    end = runs[5][2]  # the edges: opening where the parts meet, resolving as the window opens
    for k, first in enumerate((end - w.before_s - LASTING_FINDING_S, end + w.after_s)):
        for dt in (-1.0, 0.0, 1.0):
            rows.append((f"e{k}{dt}", runs[5][1][0], first + dt, None))
            rows.append((f"s{k}{dt}", runs[5][1][0], first + dt, end - w.before_s + dt))
    _failed_runs(store, runs)
    _raw_findings(store, rows)
    h = load(store, T0 - 3600, T0 + 40 * 7200.0, w)
    got = {str(j): set(ev) for j, ev in zip(h.job, h.evidence, strict=True)}
    want = {
        name: {
            fid
            for fid, node, first, resolved in rows
            if node in set(on)
            and first <= e + w.after_s
            and (resolved if resolved is not None else np.inf) >= e - w.before_s
        }
        for name, on, e in runs
    }
    assert got == want
    assert sum(map(len, want.values())) > 40  # the draw gave the join work to do


def _vm_steps(store, fn) -> int:
    """SQLite virtual-machine steps (in thousands) that fn's queries on the store take."""
    steps = [0]

    def tick() -> int:
        steps[0] += 1
        return 0

    store.db.set_progress_handler(tick, 1000)
    try:
        fn()
    finally:
        store.db.set_progress_handler(None, 0)
    return steps[0]


def test_the_join_does_not_scan_the_nodes_findings_long_before_or_after_the_range(store):
    """The join looked at every finding of a run's node opened before its end: 40,000 old findings
    on a node of 1,000 failed runs took 5.6 s. Its cost must not grow with the node's history."""
    _failed_runs(store, [(f"j{i}", ["n1"], T0 + i * 2400.0) for i in range(300)])
    since, until = T0 - 3600, T0 + 300 * 2400.0

    def attribute_range() -> None:
        load(store, since, until, Window())

    alone = _vm_steps(store, attribute_range)
    year = 365 * 86400.0
    _raw_findings(
        store,
        [(f"old{i}", "n1", T0 - year + i * 600.0, T0 - year + i * 600.0 + 60) for i in range(5000)]
        + [(f"new{i}", "n1", until + i * 600.0, until + i * 600.0 + 60) for i in range(5000)]
        + [(f"open{i}", "n1", T0 - year + i, None) for i in range(3)],  # open: the cause of every failure
    )
    with_history = _vm_steps(store, attribute_range)
    assert with_history < 3 * alone + 100, (alone, with_history)
    assert all(len(ev) == 3 for ev in load(store, since, until, Window()).evidence)
