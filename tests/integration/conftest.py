"""The integration tier's fixtures: the real services, each started (idempotently) by the repo's
own scripts, failing loudly if it cannot start. `kafka_bootstrap` is the local broker
(services/kafka/kafka.sh); `topic_tail` reads what a test produces next; `private_broker` is a
second broker to stop and restart; `alertmanager` and `slurm` are the local Alertmanager and
Slurm cluster (tests/integration/services.py has the classes); `rig` is one act test's ActRig
(tests/integration/act_rig.py)."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fleetwatch.bus.admin import ensure_topics, wait_for_broker
from tests.integration.act_rig import ActRig
from tests.integration.services import (
    AM_PORT,
    KAFKA_SH,
    SLURM_NODES,
    SLURM_SH,
    Alertmanager,
    PrivateBroker,
    Slurm,
    TopicTail,
    one_at_a_time,
    service,
)
from tests.integration.workers import Detect


@pytest.fixture(scope="session", autouse=True)
def census_key() -> str:
    """The census key (fleetwatch/census.py) every `fleetwatch detect` and `act` the tests start
    inherits from the environment, unless a test gives its own: both refuse to start without one."""
    os.environ.setdefault("FLEETWATCH_CENSUS_KEY", f"test-census-{uuid.uuid4().hex}")
    return os.environ["FLEETWATCH_CENSUS_KEY"]


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """The broker this test process's tests share: FLEETWATCH_TEST_BOOTSTRAP where given (not
    started here), else the local one on FLEETWATCH_TEST_KAFKA_PORT (19092), started by kafka.sh.
    scripts/test.sh gives each of its three integration processes a broker of its own: tests read
    and write the pipeline's own topics (fleet.telemetry.v1, fleet.findings.v1, fleet.nodes.v1),
    and a detect or act of one process would otherwise take the other's records for its own."""
    port = int(os.environ.get("FLEETWATCH_TEST_KAFKA_PORT", "19092"))
    bootstrap = os.environ.get("FLEETWATCH_TEST_BOOTSTRAP", f"127.0.0.1:{port}")
    if "FLEETWATCH_TEST_BOOTSTRAP" not in os.environ:
        env = {**os.environ, "KAFKA_PORT": str(port), "KAFKA_CONTROLLER_PORT": str(port + 1)}
        with one_at_a_time(f"kafka-shared-{port}"):
            r = subprocess.run(
                ["bash", str(KAFKA_SH), "start"], capture_output=True, text=True, timeout=300, env=env
            )
        if r.returncode != 0:
            pytest.fail(f"could not start the local Kafka broker: {r.stderr.strip()[-2000:]}")
    wait_for_broker(bootstrap, timeout_s=60)
    ensure_topics(bootstrap)
    return bootstrap


@pytest.fixture
def topic_tail(kafka_bootstrap: str) -> Iterator[Callable[[str], TopicTail]]:
    tails: list[TopicTail] = []

    def make(topic: str) -> TopicTail:
        t = TopicTail(kafka_bootstrap, topic)
        tails.append(t)
        return t

    yield make
    for t in tails:
        t.close()


def pytest_itemcollected(item: pytest.Item) -> None:
    """scripts/test.sh runs the tier as three pytest processes side by side (it mostly waits on
    the services): the files that use the one Slurm cluster (`pytestmark = USES_SLURM`, marker
    `slurm`), one after the other, since each resets the nodes and expects them idle; long files
    that need no shared service (`pytestmark = APART`); and the rest. Each process has a broker of
    its own (FLEETWATCH_TEST_KAFKA_PORT, see kafka_bootstrap), and a private broker that its tests
    stop and restart (FLEETWATCH_TEST_PRIVATE_PORT); what they share, Alertmanager, is safe side by
    side by each test's own cluster labels. A test
    that uses the Slurm cluster without the mark would run beside the others: refused here."""
    if "slurm" in getattr(item, "fixturenames", ()) and item.get_closest_marker("slurm") is None:
        raise pytest.UsageError(
            f"{item.nodeid} uses the slurm fixture: it (or its file) needs the USES_SLURM mark"
        )


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each failure written as it happens to $FLEETWATCH_TEST_FAILURE_LOG (scripts/test.sh sets
    it): pytest prints its failures only at the end, so a test process that dies (a native crash
    in a client library) would take the reports of every earlier failure with it."""
    path = os.environ.get("FLEETWATCH_TEST_FAILURE_LOG")
    if path and report.failed:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"=== FAILED {report.nodeid} ({report.when})\n{report.longreprtext[-6000:]}\n")


@pytest.fixture(scope="session")
def private_broker(kafka_bootstrap: str) -> Iterator[PrivateBroker]:
    # one per pytest process (scripts/test.sh gives each its port): a test stops and restarts it,
    # which must not cut the other process's tests off
    broker = PrivateBroker(int(os.environ.get("FLEETWATCH_TEST_PRIVATE_PORT", "19192")))
    broker.start()
    ensure_topics(broker.bootstrap)
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def alertmanager() -> Alertmanager:
    """The shared test Alertmanager, running the shipped alertmanager.yml."""
    am = Alertmanager(AM_PORT)
    am.start()
    return am


@pytest.fixture
def cluster() -> str:
    """A cluster label of this test's own: the shared Alertmanager holds other tests' alerts too."""
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def rig(kafka_bootstrap: str, alertmanager: Alertmanager, cluster: str, tmp_path: Path) -> Iterator[ActRig]:
    """Private topics and group on the broker for one act test, and its act / slurm-drainer
    processes (tests/integration/act_rig.py), stopped after the test."""
    r = ActRig(kafka_bootstrap, alertmanager, cluster, tmp_path)
    yield r
    r.close()


@pytest.fixture(scope="session")
def slurm() -> Iterator[Slurm]:
    service(SLURM_SH, "start")
    conf = service(SLURM_SH, "env").strip().partition("=")[2]
    s = Slurm(conf)
    s.reset(*SLURM_NODES)
    yield s
    s.reset(*SLURM_NODES)


@pytest.fixture
def detect(kafka_bootstrap: str) -> Iterator[tuple[Detect, str]]:
    """A detect worker on a thread in a group of its own, at the end of its inputs, and a node
    name prefix of this run's (the shared topics carry other tests' nodes too)."""
    run = uuid.uuid4().hex[:6]
    d = Detect(kafka_bootstrap, run)
    yield d, f"d{run}-"
    d.close()
