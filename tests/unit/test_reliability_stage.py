"""The accounting stage (pipeline/reliability/stage.py) on the in-memory bus: what it applies,
what it refuses (dead letter, count, no change), and that a restart or a re-read counts nothing
twice."""

from __future__ import annotations

import threading
import time

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from fleetwatch import topics
from fleetwatch.bus import Record
from fleetwatch.bus.memory import MemoryBus
from fleetwatch.pipeline.reliability import report
from fleetwatch.pipeline.reliability.ingest import Ingest
from fleetwatch.pipeline.reliability.stage import Accounting, partitions, run_loop
from fleetwatch.pipeline.reliability.store import Store
from tests.helpers.reliability import CENSUS_KEY, DRAIN_KEY, T0, census, finding, job, result, step


def enc(m) -> bytes:
    return orjson.dumps(m)


def stage(bus: MemoryBus, path) -> Accounting:
    store = Store(path)
    return Accounting(store, Ingest(store), CENSUS_KEY, DRAIN_KEY, bus.producer())


def new_bus() -> MemoryBus:
    """A bus whose broker clock is past every event of these histories (the stage bounds a
    message's time by the broker's)."""
    return MemoryBus(clock_ms=lambda: int((T0 + 7200) * 1000))


def drain(bus: MemoryBus, acc: Accounting) -> None:
    """Run the stage's loop until every record on the bus is applied."""
    run_loop(bus, acc, threading.Event(), idle_exit_s=0.0)


def apply_all(bus: MemoryBus, acc: Accounting) -> None:
    """Every record in one batch, as one poll would hand them over (no loop: fast)."""
    reader = bus.reader()
    tps = partitions(reader, acc.t.all())
    reader.assign(tps, "beginning")
    acc.apply(reader.poll(0.0, max_records=10_000), T0 + 7200)


def reference(tmp_path) -> Accounting:
    """The stage after the clean history alone: what the figures must be when bad input is added."""
    clean = new_bus()
    history(clean)
    ref = stage(clean, tmp_path / "ref.sqlite")
    drain(clean, ref)
    return ref


def history(bus: MemoryBus) -> None:
    nodes = ["n1", "n2"]
    bus.append(topics.NODES, b"n1", enc(census("n1", T0)))
    bus.append(topics.NODES, b"n2", enc(census("n2", T0)))
    bus.append(topics.JOBS, b"j", enc(job("j", nodes, "started", T0, start_ts=T0, gpus=[8, 8])))
    bus.append(topics.STEPS, b"j", enc(step("j", "n1", T0 + 60, 1)))
    bus.append(
        topics.STEPS, b"j", enc(step("j", "n1", T0 + 3000, 50, checkpoint_step=49, checkpoint_ts=T0 + 2990))
    )
    bus.append(topics.FINDINGS, b"n2", enc(finding("n2", "ecc", T0 + 3500)))
    bus.append(topics.JOBS, b"j", enc(job("j", nodes, "failed", T0 + 3600, end_state="FAILED", start_ts=T0)))
    bus.append(topics.DRAIN_RESULTS, b"n2", enc(result("n2", "drain", T0 + 3700, "a" * 32)))


UNTIL = time.time() + 86400


def figures(acc: Accounting) -> dict:
    # to now: a refused record's data-quality line is dated when it was read
    r = report.build(acc.store, T0 - 86400, UNTIL)
    r.pop("compute_s")
    return r


def test_the_stage_turns_the_topics_into_attributed_history(tmp_path):
    bus = new_bus()
    history(bus)
    acc = stage(bus, tmp_path / "a.sqlite")
    drain(bus, acc)
    r = figures(acc)
    assert r["taxonomy"]["by_category"] == {"hardware": 1}
    (row,) = r["failures"]
    assert (row["component"], row["node"], len(row["evidence"])) == ("gpu_memory", "n2", 1)
    # 610 s since the checkpoint, on 16 GPUs
    assert r["lost_gpu_hours_by_cause"]["lost_progress"] == {
        "hardware:gpu_memory": pytest.approx(610 * 16 / 3600, abs=1e-3)
    }
    assert r["lost_gpu_hours_by_cause"]["drained"] > 0
    assert r["data_quality"] == []


def test_a_restart_resumes_after_its_last_commit_and_a_full_reread_changes_nothing(tmp_path):
    bus = new_bus()
    history(bus)
    acc = stage(bus, tmp_path / "a.sqlite")
    drain(bus, acc)
    before = figures(acc)
    stored = acc.store.offsets()
    assert sum(stored.values()) == 8
    acc.store.close()
    again = stage(bus, tmp_path / "a.sqlite")  # a restart: reads nothing new
    drain(bus, again)
    assert figures(again) == before
    # an operator resets the offsets: everything is read again, nothing counted twice
    again.store.db.execute("DELETE FROM offsets")
    drain(bus, again)
    assert figures(again) == before


BAD = [
    (topics.JOBS, b"j", b"{not json"),
    (topics.JOBS, b"other", enc(job("j", ["n1"], "started", T0))),  # key is not the job
    (topics.JOBS, b"j", enc({"schema": "job/1", "job": "j", "nodes": ["n1"], "state": "exploded", "ts": T0})),
    (
        topics.STEPS,
        b"j",
        enc(
            {"schema": "step/1", "job": "j", "node": "n1", "rank": 0, "step": 1, "step_time_s": -1, "ts": T0}
        ),
    ),
    (topics.STEPS, b"j", enc({**step("j", "n1", T0, 1), "checkpoint_step": 3})),  # a mark without its time
    (topics.FINDINGS, b"n1", enc({**finding("n1", "ecc", T0), "sig": "0" * 64})),  # forged
    (topics.FINDINGS, b"n1", enc(finding("n1", "ecc", T0, key=b"x" * 32))),  # another key
    (topics.DRAIN_RESULTS, b"n1", enc(result("n1", "drain", T0, "b" * 32, key=b"x" * 32))),
    (topics.NODES, b"n9", enc(census("n9", T0, key=b"x" * 32))),
    (topics.JOBS, b"j", b"x" * (2 << 20)),
]


def test_bad_records_go_to_the_dead_letter_topic_are_counted_and_change_nothing(tmp_path):
    ref = reference(tmp_path)
    bus = new_bus()
    for topic, key, value in BAD:  # before, between and after the good records
        bus.append(topic, key, value)
    history(bus)
    for topic, key, value in BAD:
        bus.append(topic, key, value)
    acc = stage(bus, tmp_path / "a.sqlite")
    drain(bus, acc)
    got, want = figures(acc), figures(ref)
    refused = {q["what"]: q["count"] for q in got.pop("data_quality")}
    want.pop("data_quality")
    assert got == want
    assert sum(refused.values()) == 2 * len(BAD)
    assert all(what.startswith("refused:") for what in refused)
    dead = bus.records(topics.DEADLETTER)
    assert len(dead) == 2 * len(BAD)
    assert all(dict(d.headers)["source"].startswith(b"account:") for d in dead)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(
            st.sampled_from([topics.JOBS, topics.STEPS, topics.FINDINGS, topics.DRAIN_RESULTS, topics.NODES]),
            st.one_of(st.none(), st.binary(max_size=8)),
            st.one_of(
                st.binary(max_size=200),
                st.builds(
                    lambda m: enc(m),
                    st.dictionaries(
                        st.sampled_from(["schema", "job", "nodes", "state", "ts", "id", "node"]),
                        st.one_of(
                            st.integers(-(2**63), 2**63 - 1),
                            st.text(max_size=5),
                            st.floats(),
                            st.lists(st.text(max_size=3), max_size=3),
                        ),
                    ),
                ),
            ),
        ),
        max_size=20,
    )
)
def test_any_bytes_on_any_topic_never_stop_the_stage_nor_touch_the_figures(tmp_path_factory, hostile):
    bus = new_bus()
    for topic, key, value in hostile:
        bus.append(topic, key, value)
    history(bus)
    acc = stage(bus, tmp_path_factory.mktemp("h") / "a.sqlite")
    apply_all(bus, acc)
    r = figures(acc)
    assert r["taxonomy"]["by_category"] == {"hardware": 1}
    assert r["failures"][0]["component"] == "gpu_memory"


def test_a_ranks_clock_ahead_is_bounded_and_one_far_behind_is_kept_and_both_are_counted(tmp_path):
    broker_now = [T0 + 7200]
    bus = MemoryBus(clock_ms=lambda: int(broker_now[0] * 1000))
    bus.append(topics.JOBS, b"j", enc(job("j", ["n1"], "started", T0, start_ts=T0)))
    bus.append(topics.STEPS, b"j", enc(step("j", "n1", T0 + 7200 + 3600, 1)))  # an hour ahead
    broker_now[0] = T0 + 3 * 86400
    bus.append(topics.STEPS, b"j", enc(step("j", "n1", T0 + 600, 2)))  # published 3 days late
    acc = stage(bus, tmp_path / "a.sqlite")
    drain(bus, acc)
    first, last = acc.store.db.execute("SELECT first_step_ts, last_step_ts FROM runs").fetchone()
    # the mark ahead bounded by the broker's time (plus the allowed lead), the late one as stamped
    assert (first, last) == (T0 + 600, T0 + 7200 + 300)
    rows = acc.store.db.execute("SELECT what, sum(count) FROM quality GROUP BY what")
    quality = {what: n for what, n in rows}
    assert quality == {"clock_ahead": 1, "clock_behind": 1}


def test_a_producers_timestamp_neither_expires_waiting_steps_nor_dates_a_quality_line(tmp_path):
    """The findings topic keeps the writer's CreateTime, which any writer sets: one garbage record
    stamped 2100 was the batch's data time, expired every waiting step and dated its own line."""
    store = Store(tmp_path / "a.sqlite")
    acc = Accounting(store, Ingest(store), CENSUS_KEY, DRAIN_KEY, None)

    def rec(topic, offset, key, value, ts, log_append):
        return Record(topic, 0, offset, key, value, int(ts * 1000), log_append)

    # a job's steps come before its job/1: they wait
    acc.apply([rec(topics.STEPS, 0, b"j", enc(step("j", "n1", T0 + 60, 1)), T0 + 60, True)], T0 + 60)
    year_2100 = 4102444800.0
    acc.apply(
        [
            rec(topics.FINDINGS, 0, b"n9", b"garbage", year_2100, False),
            rec(topics.JOBS, 0, b"k", enc(job("k", ["n2"], "started", T0 + 120)), T0 + 120, True),
        ],
        T0 + 121,
    )
    assert store.db.execute("SELECT job, last_ts FROM pending_steps").fetchall() == [("j", T0 + 60)]
    days = store.db.execute("SELECT what, day FROM quality").fetchall()
    assert days == [("refused:fleet.findings.v1:not_json", int((T0 + 121) // 86400))]  # the reader's clock
    # the run comes: it has its steps
    acc.apply([rec(topics.JOBS, 1, b"j", enc(job("j", ["n1"], "started", T0)), T0 + 180, True)], T0 + 181)
    assert store.db.execute("SELECT first_step_ts FROM runs WHERE job = 'j'").fetchone() == (T0 + 60,)


def test_a_step_from_a_node_not_in_its_job_is_counted_and_changes_nothing(tmp_path):
    ref = reference(tmp_path)
    bus = new_bus()
    history(bus)
    # another job's rank, on its own node, posts under j's id: a checkpoint at j's end
    bus.append(
        topics.STEPS,
        b"j",
        enc(step("j", "evil", T0 + 3599, 10**9, checkpoint_step=10**9, checkpoint_ts=T0 + 3599)),
    )
    acc = stage(bus, tmp_path / "a.sqlite")
    drain(bus, acc)
    got, want = figures(acc), figures(ref)
    assert [(q["what"], q["count"]) for q in got.pop("data_quality")] == [("steps_not_in_job", 1)]
    want.pop("data_quality")
    assert got == want


def test_without_the_drain_key_drain_results_are_left_for_when_it_is_given(tmp_path):
    bus = new_bus()
    history(bus)
    path = tmp_path / "a.sqlite"
    store = Store(path)
    acc = Accounting(store, Ingest(store), CENSUS_KEY, None, bus.producer())
    drain(bus, acc)
    assert figures(acc)["lost_gpu_hours_by_cause"]["drained"] == 0
    apply_all(bus, acc)  # handed the topic anyway: its offsets are not kept either
    assert topics.DRAIN_RESULTS not in {t for t, _ in store.offsets()}
    store.close()
    again = stage(bus, path)  # restarted with the key: the results are read
    drain(bus, again)
    assert figures(again)["lost_gpu_hours_by_cause"]["drained"] > 0


def after_history(tmp_path, *extra: tuple[str, bytes, bytes]) -> Accounting:
    """The stage after the clean history and then `extra` (topic, key, value) records."""
    bus = new_bus()
    history(bus)
    for topic, key, value in extra:
        bus.append(topic, key, value)
    acc = stage(bus, tmp_path / "a.sqlite")
    drain(bus, acc)
    return acc


def view(node: str, state: str, ts: float, key: bytes = DRAIN_KEY) -> bytes:
    """The adapter's slurm_node/1 record of a node, signed with the drain key as it signs them."""
    from fleetwatch.alerts.slurm import NodeInfo
    from fleetwatch.alerts.slurm_nodes import make_record

    return enc(make_record(NodeInfo(node, state, ""), (), False, ts, key))


def drained_gpu_hours(acc: Accounting) -> float:
    return figures(acc)["lost_gpu_hours_by_cause"]["drained"]


@pytest.mark.parametrize("view_first", [False, True])
def test_a_drain_lifted_by_hand_ends_where_slurms_view_shows_the_node_back_in_service(tmp_path, view_first):
    """n2, drained by the adapter at T0 + 3700 and resumed by an operator with scontrol, never
    through act: its drain counted as drained GPU time for ever (a probe's find). Slurm's view,
    which the adapter publishes, ends it at T0 + 5000, whichever topic the stage reads first."""
    bus = new_bus()
    views = [
        view("n2", "idle", T0 + 3650),  # before the drain
        view("n2", "drained", T0 + 3710),
        view("n2", "unknown", T0 + 4000),  # a state the adapter could not name: says nothing
        view("n1", "idle", T0 + 4500),  # another node's return: nothing of n2's
        view("n2", "idle", T0 + 5000),  # the operator's RESUME
        view("n2", "idle", T0 + 5300),  # the same view again (a refresh): no second row
    ]
    if view_first:  # the stage may read the view's topic before the results' (a backlog)
        for v in views:
            bus.append(topics.SLURM_NODES, orjson.loads(v)["node"].encode(), v)
    history(bus)
    if not view_first:
        for v in views:
            bus.append(topics.SLURM_NODES, orjson.loads(v)["node"].encode(), v)
    acc = stage(bus, tmp_path / "a.sqlite")
    drain(bus, acc)
    r = figures(acc)
    assert r["lost_gpu_hours_by_cause"]["drained"] == pytest.approx(1300 * 8 / 3600, abs=1e-3)
    assert r["data_quality"] == []
    assert acc.store.rows("SELECT count(*) FROM node_service WHERE node = 'n2'") == [(3,)]


def test_a_view_that_does_not_verify_or_comes_without_the_key_ends_no_drain(tmp_path):
    acc = after_history(
        tmp_path,
        (topics.SLURM_NODES, b"n2", view("n2", "idle", T0 + 5000, key=CENSUS_KEY)),  # not the adapter's
        (topics.SLURM_NODES, b"n2", view("n2", "down+drain", T0 + 5100)),  # still out
    )
    open_drain = drained_gpu_hours(acc)
    assert open_drain > 1300 * 8 / 3600  # counted until the report's end
    assert [(q["what"], q["count"]) for q in figures(acc)["data_quality"]] == [
        (f"refused:{topics.SLURM_NODES}:bad_signature", 1)
    ]
    bus2 = new_bus()
    history(bus2)
    bus2.append(topics.SLURM_NODES, b"n2", view("n2", "idle", T0 + 5000))
    store = Store(tmp_path / "b.sqlite")
    keyless = Accounting(store, Ingest(store), CENSUS_KEY, None, bus2.producer())
    assert topics.SLURM_NODES not in keyless.topics_read()
    apply_all(bus2, keyless)  # handed the topic anyway: neither applied nor its offset kept
    assert store.rows("SELECT count(*) FROM node_service") == [(0,)]
    assert topics.SLURM_NODES not in {t for t, _ in store.offsets()}


def test_a_report_reads_a_store_written_before_slurms_view_was_kept(tmp_path):
    acc = after_history(tmp_path)
    before = drained_gpu_hours(acc)
    acc.store.db.execute("DROP TABLE node_service")  # as the release before wrote it
    assert drained_gpu_hours(acc) == before > 0


@pytest.mark.parametrize(("escalated_s", "blamed"), [(3600.0, False), (120.0, True)])
def test_a_failure_is_blamed_on_what_a_finding_was_by_its_window_not_on_what_it_became(
    tmp_path, escalated_s, blamed
):
    """A warning beside job j's failure that became critical an hour later blamed the failure on it:
    the store kept a finding's worst severity only (a probe's find). Escalated within the window's
    300 s after the end, it was a critical finding in the window, and is the cause."""
    bus = new_bus()
    bus.append(topics.NODES, b"n1", enc(census("n1", T0)))
    bus.append(topics.JOBS, b"j", enc(job("j", ["n1"], "started", T0, start_ts=T0, gpus=[8])))
    opened, end = T0 + 3500, T0 + 3600
    bus.append(
        topics.FINDINGS, b"n1", enc(finding("n1", "ecc", opened, severity="warning", first_seen=opened))
    )
    late = finding("n1", "ecc", end + escalated_s, severity="critical", first_seen=opened)
    bus.append(topics.FINDINGS, b"n1", enc(late))
    bus.append(topics.JOBS, b"j", enc(job("j", ["n1"], "failed", end, end_state="FAILED", start_ts=T0)))
    acc = stage(bus, tmp_path / "a.sqlite")
    drain(bus, acc)
    r = figures(acc)
    assert r["taxonomy"]["by_category"] == ({"hardware": 1} if blamed else {"user": 1})
    # a store written before the levels were kept judges by the worst, as before
    acc.store.db.execute("DROP TABLE finding_levels")
    assert figures(acc)["taxonomy"]["by_category"] == {"hardware": 1}


def test_a_findings_severity_by_a_time_is_the_worst_it_had_been_emitted_at_by_then() -> None:
    from fleetwatch.pipeline.reliability.history import severity_by

    levels = [(100.0, "warning"), (200.0, "critical")]
    assert [severity_by(levels, t, "critical") for t in (150.0, 200.0, 50.0)] == [
        "warning",
        "critical",
        "warning",
    ]
    assert severity_by(None, 50.0, "critical") == "critical"  # kept no levels: the worst


def test_a_node_under_its_validation_or_seen_back_only_after_compaction_counts_as_drained_until_then(
    tmp_path,
):
    """A review's finds: the adapter's validation lifts its drain inside a maintenance reservation
    while it tests (Slurm shows `mixed+maint`), which ended the drain at the test's start and lost
    the time of a node that failed it and was drained again; and a view topic read from its start
    (compacted: each node's latest view only) showed the node in service before the drain and after
    it, no change, and the drain counted for ever."""
    tested = [("idle", T0 + 3650), ("mixed+maint", T0 + 3800), ("drained", T0 + 4100)]  # failed, drained
    acc = after_history(  # n2 drained at T0 + 3700
        tmp_path,
        *[(topics.SLURM_NODES, b"n2", view("n2", state, at)) for state, at in tested],
        (topics.SLURM_NODES, b"n1", view("n1", "idle", T0 + 3600)),
        (topics.DRAIN_RESULTS, b"n1", enc(result("n1", "drain", T0 + 3700, "b" * 32))),
        (topics.SLURM_NODES, b"n1", view("n1", "idle", T0 + 4700)),  # its drained view compacted away
    )
    r = report.build(acc.store, T0, T0 + 7200)
    # n2 drained from 3700 to the report's end (7200), n1 from 3700 to 4700, on 8 GPUs each
    assert r["lost_gpu_hours_by_cause"]["drained"] == pytest.approx((3500 + 1000) * 8 / 3600, abs=1e-3)


def test_a_batch_whose_dead_letters_kafka_does_not_take_is_read_again_not_lost(tmp_path):
    """The stage committed a batch's offsets while its dead letters were still queued: a stage
    killed then, or a broker that refused them, lost them for good (the integration test's dead
    letters came up short under load). Now they are acknowledged first, or the batch is read again."""
    bus = new_bus()
    history(bus)
    bus.append(topics.JOBS, b"x", b"{not json")
    acc = stage(bus, tmp_path / "a.sqlite")
    bus.fail_next = 1  # the dead letter's send fails once
    refused = {"topic": topics.JOBS, "outcome": "refused"}
    before = REGISTRY.get_sample_value("fleetwatch_accounting_records_total", refused) or 0.0
    drain(bus, acc)
    assert len(bus.records(topics.DEADLETTER)) == 1  # sent again, and taken
    assert REGISTRY.get_sample_value("fleetwatch_accounting_records_total", refused) == before + 1
    assert [(q["what"], q["count"]) for q in figures(acc)["data_quality"]] == [
        (f"refused:{topics.JOBS}:not_json", 1)
    ]  # counted once: the first try's count rolled back with its batch


def test_a_drain_read_after_the_views_that_came_later_still_ends_at_one_of_them(tmp_path):
    """The stage may read the view topic ahead of the results' (a backlog; the memory bus always
    reads results first, so this test hands the batches over in the other order itself): the view
    in service after the drain was kept as no change, and the drain counted for ever (a review's
    find). The latest view in service after it ends it."""
    views = new_bus()
    for state, at in (("idle", T0 + 3650), ("idle", T0 + 5000)):  # its drained view compacted away
        views.append(topics.SLURM_NODES, b"n2", view("n2", state, at))
    results = new_bus()
    history(results)  # n2 drained at T0 + 3700
    acc = stage(results, tmp_path / "a.sqlite")
    for bus in (views, results):
        reader = bus.reader()
        reader.assign(partitions(reader, acc.t.all()), "beginning")
        acc.apply(reader.poll(0.0, max_records=10_000), T0 + 7200)
    r = report.build(acc.store, T0, T0 + 7200)
    assert r["lost_gpu_hours_by_cause"]["drained"] == pytest.approx(1300 * 8 / 3600, abs=1e-3)
