"""What each message does to the accounting history (pipeline/reliability/ingest.py, store.py):
runs and requeues, idempotence, progress marks, and the data-quality lines for bad inputs."""

from __future__ import annotations

import pytest

from fleetwatch.pipeline.reliability import report
from fleetwatch.pipeline.reliability.ingest import Ingest
from fleetwatch.pipeline.reliability.store import SCHEMA_VERSION, Progress, Store, StoreError
from tests.helpers.reliability import T0, finding, job


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "a.sqlite")
    yield s
    s.close()


def feed(store, *messages, broker_ts=None):
    ing = Ingest(store)
    with store.transaction() as db:
        for m in messages:
            if m["schema"] == "job/1":
                ing.job(db, m, broker_ts)
            else:
                ing.finding(db, m, broker_ts)


def runs(store):
    return store.db.execute(
        "SELECT job, start_ts, end_ts, end_state, n_nodes, gpus, bad FROM runs ORDER BY id"
    ).fetchall()


def quality(store):
    return {
        line["what"]: line["count"]
        for line in report.data_quality(store, _empty(store), T0 - 10 * 86400, T0 + 10 * 86400)
    }


def counted(store):
    """The data-quality counts the stage wrote (not the report's own lines: no_end, unknown_nodes)."""
    return dict(store.db.execute("SELECT what, sum(count) FROM quality GROUP BY what").fetchall())


def _empty(store):
    from fleetwatch.pipeline.reliability.attribution import Window
    from fleetwatch.pipeline.reliability.history import load

    return load(store, 0, 1, Window())


def test_a_start_and_an_end_make_one_run(store):
    feed(
        store, job("j", ["n1", "n2"], "started", T0, gpus=[8, 4]), job("j", ["n1", "n2"], "finished", T0 + 60)
    )
    assert runs(store) == [("j", T0, T0 + 60, "COMPLETED", 2, 12, None)]


def test_a_requeued_job_is_two_runs_of_one_id(store):
    feed(
        store,
        job("j", ["n1"], "started", T0, start_ts=T0),
        job("j", ["n1"], "failed", T0 + 60, end_state="NODE_FAIL", start_ts=T0),
        job("j", ["n2"], "started", T0 + 120, start_ts=T0 + 120),
        job("j", ["n2"], "finished", T0 + 300, end_state="COMPLETED", start_ts=T0 + 120),
    )
    assert [(r[1], r[3]) for r in runs(store)] == [(T0, "NODE_FAIL"), (T0 + 120, "COMPLETED")]


def test_reading_everything_again_counts_nothing_twice(store):
    msgs = [
        job("j", ["n1"], "started", T0),
        job("j", ["n1"], "running", T0 + 30),
        job("j", ["n1"], "failed", T0 + 60, end_state="FAILED"),
        finding("n1", "ecc", T0 + 50),
    ]
    feed(store, *msgs)
    before = (runs(store), store.db.execute("SELECT * FROM findings").fetchall())
    feed(store, *msgs)
    feed(store, *msgs)
    assert (runs(store), store.db.execute("SELECT * FROM findings").fetchall()) == before
    assert quality(store) == {}


def test_an_end_without_a_start_time_closes_the_open_run(store):
    feed(store, job("j", ["n1"], "started", T0), job("j", ["n1"], "failed", T0 + 60))
    assert runs(store) == [("j", T0, T0 + 60, "FAILED", 1, 8, None)]


def test_a_second_different_end_is_a_quality_line_and_the_first_stands(store):
    feed(
        store,
        job("j", ["n1"], "started", T0, start_ts=T0),
        job("j", ["n1"], "finished", T0 + 60, end_state="COMPLETED", start_ts=T0),
        job("j", ["n1"], "failed", T0 + 90, end_state="NODE_FAIL", start_ts=T0),
    )
    assert runs(store)[0][2:4] == (T0 + 60, "COMPLETED")
    assert quality(store) == {"duplicate_end": 1}


def test_an_end_before_its_start_is_kept_out_of_the_figures(store):
    feed(store, job("j", ["n1"], "failed", T0 - 60, end_state="NODE_FAIL", start_ts=T0))
    assert runs(store)[0][-1] == "end_before_start"
    r = report.build(store, T0 - 86400, T0 + 86400)
    assert r["taxonomy"]["runs"] == 0
    assert {q["what"] for q in r["data_quality"]} == {"end_before_start"}


def test_ends_of_jobs_never_started_or_never_seen_are_counted_not_run(store):
    feed(
        store,
        job("pending", [], "finished", T0, end_state="CANCELLED"),
        job("ghost", ["n1"], "failed", T0, end_state="FAILED"),
    )
    assert runs(store) == []
    assert quality(store) == {"never_started": 1, "end_without_start": 1}


def test_a_clock_ahead_of_the_broker_is_clamped_to_the_brokers_time_and_counted(store):
    feed(store, job("j", ["n1"], "started", T0), broker_ts=T0)
    feed(store, job("j", ["n1"], "finished", T0 + 10 * 86400), broker_ts=T0 + 60)
    assert runs(store)[0][2] == T0 + 60
    assert quality(store) == {"clock_ahead": 1}


def test_a_clock_far_behind_the_broker_is_counted_and_its_time_kept(store):
    # a day and more late: a clock far behind, or a publisher that was down; it may be true
    feed(store, job("j", ["n1"], "started", T0, start_ts=T0), broker_ts=T0 + 60)
    feed(store, job("j", ["n1"], "finished", T0 + 3600, start_ts=T0), broker_ts=T0 + 3600 + 1.5 * 86400)
    assert runs(store)[0][1:3] == (T0, T0 + 3600)
    assert quality(store) == {"clock_behind": 1}
    # late by less than a day (a publisher catching up after an outage of hours): nothing to say
    feed(store, job("k", ["n1"], "finished", T0 + 60, start_ts=T0), broker_ts=T0 + 20 * 3600)
    assert quality(store) == {"clock_behind": 1}


def test_a_start_time_ahead_of_the_broker_is_counted_and_kept_as_the_runs_name(store):
    start = T0 + 3600  # slurmctld's clock an hour ahead when the job started
    feed(store, job("j", ["n1"], "started", T0, start_ts=start), broker_ts=T0)
    feed(store, job("j", ["n1"], "finished", start + 60, start_ts=start), broker_ts=start + 60)
    # one run (both records name it by the same start), ended at its own end
    assert runs(store) == [("j", start, start + 60, "COMPLETED", 1, 8, None)]
    assert quality(store) == {"clock_ahead": 1}
    # slurm-jobs' own `started` record stamps its time with the start: one skew, counted once
    feed(store, job("k", ["n1"], "started", start, start_ts=start), broker_ts=T0)
    feed(store, job("k", ["n1"], "finished", start + 60, start_ts=start), broker_ts=start + 60)
    assert quality(store) == {"clock_ahead": 2}


def test_a_run_open_longer_than_any_job_may_run_is_a_quality_line(store):
    # in the range its end was due (7 days after its start), not before
    feed(store, job("j", ["n1"], "started", T0 - 7.5 * 86400))
    lines = report.build(store, T0 - 86400, T0)["data_quality"]
    assert [(q["what"], q["count"], q["examples"]) for q in lines] == [("no_end", 1, ["j"])]
    assert report.build(store, T0 - 3 * 86400, T0 - 86400)["data_quality"] == []


def test_nodes_the_census_never_saw_are_a_quality_line(store):
    feed(store, job("j", ["n1", "nX"], "started", T0), job("j", ["n1", "nX"], "finished", T0 + 60))
    with store.transaction() as db:
        store.upsert_node(db, "n1", T0, T0)
    lines = {q["what"]: q["count"] for q in report.build(store, T0 - 60, T0 + 3600)["data_quality"]}
    assert lines == {"unknown_nodes": 1}


def test_progress_before_its_job_waits_and_joins_the_run(store):
    ing = Ingest(store)
    with store.transaction() as db:
        ing.progress(
            db,
            "j",
            ["n1", "n1"],
            [Progress(T0 + 10, T0 + 10), Progress(T0 + 500, T0 + 500, T0 + 400, 40, 12.0)],
        )
    feed(store, job("j", ["n1"], "started", T0))
    row = store.db.execute(
        "SELECT first_step_ts, last_step_ts, ckpt_ts, ckpt_step, ckpt_write_s FROM runs"
    ).fetchone()
    assert row == (T0 + 10, T0 + 500, T0 + 400, 40, 12.0)
    assert store.db.execute("SELECT count(*) FROM pending_steps").fetchone()[0] == 0


def test_progress_of_a_job_never_seen_is_dropped_an_hour_later_in_the_datas_time_and_counted(store):
    ing = Ingest(store)
    with store.transaction() as db:
        ing.progress(db, "ghost", ["n1"], [Progress(T0, T0)])
        ing.progress(db, "ghost2", ["n1"], [Progress(T0, T0)])
    with store.transaction() as db:
        ing.expire(db, T0 + 3000)  # the data's own time (days old): not yet
    assert store.db.execute("SELECT count(*) FROM pending_steps").fetchone()[0] == 2
    with store.transaction() as db:
        ing.expire(db, T0 + 3601)
    assert store.db.execute("SELECT count(*) FROM pending_steps").fetchone()[0] == 0
    assert quality(store) == {"steps_of_unknown_job": 2}


def test_progress_merges_by_min_and_max_so_a_repeat_changes_nothing(store):
    feed(store, job("j", ["n1"], "started", T0))
    ing = Ingest(store)
    for _ in range(2):
        with store.transaction() as db:
            ing.progress(
                db,
                "j",
                ["n1", "n1"],
                [Progress(T0 + 5, T0 + 100, T0 + 90, 9, 1.5), Progress(T0 + 50, T0 + 60, T0 + 30, 3, 9.0)],
            )
    row = store.db.execute(
        "SELECT first_step_ts, last_step_ts, ckpt_ts, ckpt_step, ckpt_write_s FROM runs"
    ).fetchone()
    assert row == (T0 + 5, T0 + 100, T0 + 90, 9, 1.5)


def test_a_requeued_jobs_steps_go_each_to_its_own_run(store):
    """Steps of run 2 read before run 2's job/1 wait for it; they never land on run 1, which has
    ended, nor move run 1's checkpoint past its end; a batch holding both runs' steps splits."""
    feed(
        store,
        job("j", ["n1"], "started", T0, start_ts=T0),
        job("j", ["n1"], "failed", T0 + 3600, end_state="NODE_FAIL", start_ts=T0),
    )
    ing = Ingest(store)
    with store.transaction() as db:
        ing.progress(db, "j", ["n1", "n1", "n2", "n2"], [
            Progress(T0 + 100, T0 + 100), Progress(T0 + 1800, T0 + 1800, T0 + 1790, 5, None),  # run 1
            Progress(T0 + 4000, T0 + 4000), Progress(T0 + 5000, T0 + 5000, T0 + 4990, 9, None),  # run 2
        ])  # fmt: skip
    feed(store, job("j", ["n2"], "started", T0 + 3900, start_ts=T0 + 3900))
    rows = store.db.execute(
        "SELECT start_ts, first_step_ts, last_step_ts, ckpt_ts FROM runs ORDER BY start_ts"
    ).fetchall()
    assert rows == [(T0, T0 + 100, T0 + 1800, T0 + 1790), (T0 + 3900, T0 + 4000, T0 + 5000, T0 + 4990)]


def test_a_start_given_a_second_apart_is_the_same_run(store):
    feed(
        store,
        job("j", ["n1"], "started", T0, start_ts=T0),
        job("j", ["n1"], "finished", T0 + 60, end_state="COMPLETED", start_ts=T0 + 0.5),
    )
    assert runs(store) == [("j", T0, T0 + 60, "COMPLETED", 1, 8, None)]


def test_a_node_listed_twice_counts_once(store):
    feed(
        store,
        job("j", ["n1", "n1", "n2"], "started", T0, gpus=[4, 4, 8]),
        job("j", ["n1", "n1", "n2"], "finished", T0 + 60, gpus=[4, 4, 8]),
    )
    assert runs(store) == [("j", T0, T0 + 60, "COMPLETED", 2, 16, None)]


def test_a_finding_takes_the_cause_of_a_worse_emission_of_its_burst(store):
    """An XID burst keeps its id while a worse code joins: first the application's XID 13 (no
    cause), then XID 79 (the bus): the row names the bus."""
    first = finding("n1", "xid", T0, severity="warning", evidence={"cause": "application", "worst_xid": 13})
    worse = finding("n1", "xid", T0 + 30, first_seen=T0, evidence={"cause": "hardware", "worst_xid": 79})
    assert first["id"] == worse["id"]
    feed(store, first, worse)
    row = store.db.execute("SELECT severity, domain, component FROM findings").fetchall()
    assert row == [("critical", "hardware", "pcie")]


def test_a_finding_row_keeps_its_opening_its_worst_level_and_its_resolution(store):
    f1 = finding("n1", "ecc", T0, severity="warning")
    f2 = finding("n1", "ecc", T0 + 60, severity="critical", first_seen=T0)
    f3 = finding("n1", "ecc", T0 + 120, severity="warning", first_seen=T0, resolved=True)
    feed(store, f3, f1, f2)  # in any order
    row = store.db.execute("SELECT first_seen, last_ts, resolved_ts, severity FROM findings").fetchall()
    assert row == [(T0, T0 + 120, T0 + 120, "critical")]


def test_a_store_of_another_schema_version_or_not_sqlite_is_refused(tmp_path):
    s = Store(tmp_path / "a.sqlite")
    s.db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    s.close()
    with pytest.raises(StoreError, match="schema 99"):
        Store(tmp_path / "a.sqlite")
    (tmp_path / "junk").write_bytes(b"not a database at all" * 100)
    with pytest.raises(StoreError, match="not a usable"):
        Store(tmp_path / "junk")


def test_a_flood_of_one_bad_kind_adds_to_a_count_not_to_rows(store):
    feed(store, *[job(f"p{i}", [], "finished", T0 + i, end_state="CANCELLED") for i in range(500)])
    assert quality(store) == {"never_started": 500}
    assert store.db.execute("SELECT count(*) FROM quality_examples").fetchone()[0] == 5


def test_a_drains_first_executed_answer_stands_and_no_deferral_or_duplicate_replaces_an_answer(store):
    """The adapter answers a redelivered request `executed` again, later: the drained time counts
    from the first. A deferral (nothing done) or a duplicate never replaces an answer, and an
    answer after a deferral (the request asked again) does."""
    ing = Ingest(store)

    def answer(rid, outcome, ts):
        with store.transaction() as db:
            ing.drain_result(
                db, {"request_id": rid, "node": "n1", "action": "drain", "outcome": outcome, "ts": ts}
            )

    def row(rid):
        return store.db.execute("SELECT outcome, ts FROM drains WHERE request_id = ?", (rid,)).fetchone()

    answer("a" * 32, "executed", T0)
    answer("a" * 32, "executed", T0 + 600)
    answer("a" * 32, "duplicate", T0 + 700)
    answer("a" * 32, "deferred", T0 + 800)
    assert row("a" * 32) == ("executed", T0)
    answer("b" * 32, "deferred", T0)
    answer("b" * 32, "deferred", T0 + 60)
    assert row("b" * 32) == ("deferred", T0)
    answer("b" * 32, "executed", T0 + 120)
    assert row("b" * 32) == ("executed", T0 + 120)
    answer("c" * 32, "rejected_stale", T0)
    answer("c" * 32, "duplicate", T0 + 5)
    assert row("c" * 32) == ("rejected_stale", T0)


def test_a_run_started_with_no_nodes_takes_the_nodes_and_gpus_of_its_end(store):
    # job/1 allows an empty list: stored as 0 nodes and 0 GPUs, the run's node-days were 0 and its
    # size bucket's MTTF projection divided by 0 (the report crashed, the live figures froze)
    feed(
        store,
        job("p", [], "started", T0, start_ts=T0),
        job("p", ["n1", "n2"], "finished", T0 + 60, end_state="COMPLETED", start_ts=T0),
        job("q", [], "started", T0),
        job("q", ["n3"], "running", T0 + 30, gpus=[4]),
        job("q", ["n4"], "finished", T0 + 60),  # a run that has its nodes keeps them
    )
    assert runs(store) == [
        ("p", T0, T0 + 60, "COMPLETED", 2, 16, None),
        ("q", T0, T0 + 60, "COMPLETED", 1, 4, None),
    ]
    assert store.db.execute("SELECT node FROM run_nodes ORDER BY node").fetchall() == [
        ("n1",),
        ("n2",),
        ("n3",),
    ]
    rows = report.build(store, T0 - 86400, T0 + 86400)["mttf_by_gpus"]
    assert [(r["gpus"], r["mean_nodes"]) for r in rows] == [(4, 1.0), (16, 2.0)]


def test_a_run_longer_than_any_job_may_run_is_a_quality_line_and_kept_out_of_the_figures(store):
    feed(
        store,
        job("ok", ["n1"], "started", T0, start_ts=T0),
        job("ok", ["n1"], "finished", T0 + 86400, end_state="COMPLETED", start_ts=T0),
        # one record: a run on 17 nodes that "started" at the epoch (its runtime 56 years)
        job("x", [f"n{i}" for i in range(17)], "finished", T0 + 3600, end_state="COMPLETED", start_ts=0.0),
        # a start record naming such a start: counted at once, and not again at its end
        job("y", ["n1"], "started", T0, start_ts=T0 - 30 * 86400),
        job("y", ["n1"], "failed", T0 + 60, end_state="NODE_FAIL", start_ts=T0 - 30 * 86400),
        # a job may end a little after a 7-day limit: a run
        job("long", ["n2"], "started", T0 - 7 * 86400, start_ts=T0 - 7 * 86400),
        job("long", ["n2"], "finished", T0 + 1800, end_state="TIMEOUT", start_ts=T0 - 7 * 86400),
    )
    assert [(r[0], r[-1]) for r in runs(store)] == [
        ("ok", None),
        ("x", "run_too_long"),
        ("y", "run_too_long"),
        ("long", None),
    ]
    r = report.build(store, T0 - 86400, T0 + 2 * 86400)
    assert r["taxonomy"]["runs"] == 2
    assert r["r_f_per_1000_node_days"]["all_sizes"]["node_days"] == pytest.approx(1 + 7 + 1 / 48, abs=1e-3)
    assert {q["what"]: q["count"] for q in r["data_quality"]} == {"run_too_long": 2}


def test_the_same_end_delivered_twice_with_a_clock_ahead_is_one_end(store):
    """slurmctld's clock 10 minutes ahead: each copy of an end record is bounded by its own broker
    time, so the copies' times differ; the record's own time is the same, and so is the end."""
    feed(store, job("j", ["n1"], "started", T0, start_ts=T0), job("k", ["n1"], "started", T0), broker_ts=T0)
    ends = [
        job("j", ["n1"], "failed", T0 + 4000, end_state="NODE_FAIL", start_ts=T0),
        job("k", ["n1"], "failed", T0 + 4000, end_state="NODE_FAIL"),  # no start_ts: the open run's
    ]
    for broker in (T0 + 3400, T0 + 3402, T0 + 3650):  # a producer's retry, the publisher's re-send
        feed(store, *ends, broker_ts=broker)
    assert [r[2:4] for r in runs(store)] == [(T0 + 3400, "NODE_FAIL")] * 2
    assert quality(store) == {"clock_ahead": 6}
    # an end that differs still counts
    feed(
        store,
        job("j", ["n1"], "finished", T0 + 4100, end_state="COMPLETED", start_ts=T0),
        broker_ts=T0 + 4100,
    )
    assert quality(store) == {"clock_ahead": 6, "duplicate_end": 1}


def test_steps_from_a_node_not_in_the_run_are_counted_and_change_nothing(store):
    """Training code can name any job: one step under another job's id, from a node not in it,
    moved the victim's checkpoint to its end (its lost progress from 1166 GPU-hours to 0.07)."""
    feed(store, job("j", ["n1", "n2"], "started", T0, start_ts=T0))
    ing = Ingest(store)
    with store.transaction() as db:
        ing.progress(
            db,
            "j",
            ["n1", "evil", "n2"],
            [
                Progress(T0 + 600, T0 + 600),
                Progress(T0 + 9000, T0 + 9000, T0 + 8999, 10**9, None),
                Progress(T0 + 4000, T0 + 4000, T0 + 3600, 360, 30.0),
            ],
        )
        ing.progress(db, "j", ["evil"], [Progress(T0 + 9500, T0 + 9500)])  # a batch of foreign steps only
    row = store.db.execute("SELECT first_step_ts, last_step_ts, ckpt_ts, ckpt_step FROM runs").fetchone()
    assert row == (T0 + 600, T0 + 4000, T0 + 3600, 360)
    assert counted(store) == {"steps_not_in_job": 2}


def test_steps_that_waited_for_their_run_are_judged_by_its_nodes_when_it_comes(store):
    ing = Ingest(store)
    with store.transaction() as db:
        ing.progress(
            db,
            "j",
            ["n1", "evil", "evil"],
            [Progress(T0 + 60, T0 + 60), Progress(T0 + 900, T0 + 900, T0 + 899, 99, None), Progress(T0, T0)],
        )
        ing.progress(db, "p", ["n5"], [Progress(T0 + 60, T0 + 60, T0 + 50, 5, None)])
    feed(store, job("j", ["n1"], "started", T0, start_ts=T0), job("p", [], "started", T0, start_ts=T0))
    rows = store.db.execute(
        "SELECT job, first_step_ts, last_step_ts, ckpt_ts FROM runs ORDER BY job"
    ).fetchall()
    # j: only n1's; p, whose job/1 lists no nodes yet, takes every step
    assert rows == [("j", T0 + 60, T0 + 60, None), ("p", T0 + 60, T0 + 60, T0 + 50)]
    assert store.db.execute("SELECT count(*) FROM pending_steps").fetchone()[0] == 0
    assert counted(store) == {"steps_not_in_job": 1}  # one per node that waited


def test_a_store_of_schema_1_is_read_by_the_report_and_upgraded_by_the_stage(tmp_path):
    path = tmp_path / "a.sqlite"
    s = Store(path)
    feed(s, job("j", ["n1"], "started", T0, start_ts=T0), job("j", ["n1"], "finished", T0 + 60, start_ts=T0))
    cols = ", ".join(c[1] for c in s.db.execute("PRAGMA table_info(runs)") if c[1] != "end_given_ts")
    s.db.executescript(  # schema 1: no end_given_ts, progress waiting per job
        f"""CREATE TABLE runs_1 AS SELECT {cols} FROM runs; DROP TABLE runs;
            ALTER TABLE runs_1 RENAME TO runs; DROP TABLE pending_steps;
            CREATE TABLE pending_steps (job TEXT PRIMARY KEY, first_ts REAL NOT NULL, last_ts REAL NOT NULL,
                ckpt_ts REAL, ckpt_step INTEGER, ckpt_write_s REAL);
            INSERT INTO pending_steps VALUES ('k', {T0}, {T0 + 10}, NULL, NULL, NULL);
            UPDATE meta SET value = '1' WHERE key = 'schema_version';"""
    )
    s.close()
    reader = Store(path, create=False)
    assert report.build(reader, T0 - 60, T0 + 3600)["taxonomy"]["runs"] == 1
    reader.close()
    s = Store(path)
    try:
        version = s.db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]
        assert version == str(SCHEMA_VERSION)
        assert "node" in {c[1] for c in s.db.execute("PRAGMA table_info(pending_steps)")}
        # its waiting progress has no node to judge it by: dropped, and said so
        assert s.db.execute("SELECT count(*) FROM pending_steps").fetchone()[0] == 0
        assert quality(s) == {"steps_of_unknown_job": 1}
        # an end stored before the upgrade, read again: the same end
        feed(s, job("j", ["n1"], "finished", T0 + 60, start_ts=T0))
        assert runs(s) == [("j", T0, T0 + 60, "COMPLETED", 1, 8, None)]
        assert quality(s) == {"steps_of_unknown_job": 1}
    finally:
        s.close()
