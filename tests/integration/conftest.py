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
    bootstrap = os.environ.get("FLEETWATCH_TEST_BOOTSTRAP", "127.0.0.1:19092")
    if "FLEETWATCH_TEST_BOOTSTRAP" not in os.environ:
        r = subprocess.run(["bash", str(KAFKA_SH), "start"], capture_output=True, text=True, timeout=300)
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


@pytest.fixture(scope="session")
def private_broker(kafka_bootstrap: str) -> Iterator[PrivateBroker]:
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
