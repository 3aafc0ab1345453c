"""The tables `fleetwatch act` follows (alerts/act.py, follow_tables): every topic whose records act
times by the broker (topics.BROKER_TIMED: a pause's and a Slurm view's clock checks, the order of
the adapter's views and answers) is followed with each record's time, so that reverting one of
them to a plain follower, which hands act's reading time instead, fails here."""

from __future__ import annotations

from fleetwatch import topics
from fleetwatch.alerts.act import follow_tables
from fleetwatch.alerts.drain_log import ResultBook
from fleetwatch.alerts.drain_pause import PauseBook
from fleetwatch.alerts.slurm_nodes import SlurmNodeBook
from fleetwatch.bus.memory import MemoryBus
from fleetwatch.census import Census
from fleetwatch.cli import build_parser
from fleetwatch.follow import BrokerTimedFollower
from fleetwatch.pipeline.job_table import JobTable, JobTableFollower

KEY = b"act-followers-test-key-0123456789"


def test_every_broker_timed_topic_act_follows_is_followed_with_its_records_time() -> None:
    args = build_parser().parse_args(["act", "--bootstrap", "127.0.0.1:1"])
    followers = follow_tables(
        args, MemoryBus(), JobTable(), Census(KEY), ResultBook(KEY), PauseBook(KEY), SlurmNodeBook(KEY)
    )
    timed = {f.topic for f in followers if isinstance(f, BrokerTimedFollower | JobTableFollower)}
    followed = {f.topic for f in followers}
    assert followed & topics.BROKER_TIMED == {
        topics.JOBS,
        topics.DRAIN_RESULTS,
        topics.CONTROL,
        topics.SLURM_NODES,
    }
    assert followed & topics.BROKER_TIMED <= timed


def test_a_dry_run_follows_the_same_tables_but_the_live_adapters_results() -> None:
    # its would-be requests are done at once; the results answer the live act's requests, and its
    # principal may not read them (docs/security.md; tests/integration/test_kafka_acls.py)
    def followed(*argv: str) -> set[str]:
        args = build_parser().parse_args(["act", "--bootstrap", "127.0.0.1:1", *argv])
        tables = (JobTable(), Census(KEY), ResultBook(KEY), PauseBook(KEY), SlurmNodeBook(KEY))
        return {f.topic for f in follow_tables(args, MemoryBus(), *tables)}

    assert followed() - followed("--dry-run") == {topics.DRAIN_RESULTS}
    assert followed("--dry-run") < followed()
