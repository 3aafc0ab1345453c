"""The ACLs docs/security.md recommends, on a real broker that enforces them (Kafka's
StandardAuthorizer; what no ACL allows is denied), read from the doc's own block: every fleetwatch
service runs as its own principal with exactly those rights, does its work, and is refused nothing;
a principal gets no more than the doc grants it; a service started without its rights says in one
line which topics and where to look, and exits.

(Before this test, detect and act asked to create every fleetwatch topic at start, including those
their principals may not see, and stopped with a traceback on the broker's refusal: the hardened
deployment the doc describes did not start.)"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetwatch import schemas, topics
from fleetwatch.bus.admin import Admin, ensure_topics
from fleetwatch.bus.kafka import KafkaBus
from tests.helpers.kafka_acls import apply_grants, recommended_grants
from tests.helpers.paths import REPO
from tests.integration.services import USES_SLURM, AclBroker, Slurm

pytestmark = USES_SLURM  # slurm-jobs and slurm-drainer need the real Slurm

ACL_PORT = 18692  # its own ports (+1 controller, +2 SASL, +3 TLS): no other test's broker
KEYS = {
    "FLEETWATCH_CENSUS_KEY": f"census-{uuid.uuid4().hex}",
    "FLEETWATCH_DRAIN_KEY": f"drain-{uuid.uuid4().hex}",
    "FLEETWATCH_CONTROL_KEY": f"control-{uuid.uuid4().hex}",
}
DOC = REPO / "docs" / "security.md"


@pytest.fixture(scope="module")
def broker() -> Iterator[AclBroker]:
    grants = recommended_grants(DOC)
    b = AclBroker(ACL_PORT, sorted({g.principal.removeprefix("User:") for g in grants}))
    b.start_fresh()
    apply_grants(b.bootstrap, grants)
    ensure_topics(b.bootstrap)  # as the Kafka admin, before any service starts (deploy.md 1.4)
    yield b
    b.stop()


def fleetwatch(broker: AclBroker, user: str, *argv: str, status: int = 0) -> str:
    """Run a fleetwatch command as `user` against the broker's SASL listener; its output."""
    r = subprocess.run(
        [sys.executable, "-m", "fleetwatch.cli", argv[0], "--bootstrap", broker.sasl_bootstrap, *argv[1:]],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
        env=broker.client_env(user, **KEYS),
    )
    out = r.stdout + r.stderr
    assert r.returncode == status, f"{user}: {argv}: status {r.returncode}\n{out[-3000:]}"
    assert "Traceback" not in out, out[-3000:]
    return out


def refused(out: str) -> list[str]:
    """The lines in which the broker refused something (an ACL the doc does not grant)."""
    return [line for line in out.splitlines() if "AUTHORIZATION" in line.upper()]


def records(broker: AclBroker, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    """(key, value) of every record of the topic, read as the Kafka admin."""
    bus = KafkaBus(broker.bootstrap)
    got: list[tuple[bytes | None, bytes | None]] = []
    with Admin(broker.bootstrap) as admin:
        parts = list(range(admin.partition_count(topic)))
    left = bus.read_to_end(topic, parts, lambda _p, k, v: got.append((k, v)), timeout_s=30)
    assert not left, f"{topic}: partitions {left} not read to their end"
    return got


def test_a_principal_sees_no_more_than_the_doc_grants(
    broker: AclBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as m:
        for name, value in broker.client_env("agent").items():
            if name.startswith("FLEETWATCH_KAFKA_"):
                m.setenv(name, value)
        with Admin(broker.sasl_bootstrap) as admin:
            seen = admin.list_topics()
    # every topic exists (the admin made them), but the agent may see only what it writes
    assert seen == {topics.TELEMETRY, topics.DEADLETTER}, seen
    with Admin(broker.bootstrap) as admin:
        assert set(topics.ALL) <= admin.list_topics()


def test_every_service_does_its_work_with_the_recommended_rights(
    broker: AclBroker, slurm: Slurm, tmp_path: Path
) -> None:
    node = f"acl-{uuid.uuid4().hex[:8]}"
    # a node agent sends its samples
    out = fleetwatch(
        broker,
        "agent",
        "collect",
        "--source",
        "host",
        "--node",
        node,
        "--count",
        "3",
        "--interval",
        "0.5",
        "--spool-dir",
        str(tmp_path / "spool"),
        "--metrics-port",
        "0",
    )
    assert not refused(out), refused(out)
    # detect reads them, and publishes the node in the census and its state as snapshots
    out = fleetwatch(broker, "detect", "detect", "--idle-exit", "3", "--metrics-port", "0")
    assert not refused(out), refused(out)
    census = [json.loads(v) for k, v in records(broker, topics.NODES) if k == node.encode() and v]
    assert census and census[-1]["schema"] == schemas.NODE and census[-1]["node"] == node, census
    assert any(k and k.startswith(b"fleetwatch-detect/") for k, _v in records(broker, topics.STATE))
    # act (live and a shadow --dry-run) follows its tables and its findings, and snapshots
    for user, more in (("act", ()), ("act-dry-run", ("--dry-run",))):
        out = fleetwatch(
            broker,
            user,
            "act",
            *more,
            "--alertmanager",
            "http://127.0.0.1:1",
            "--idle-exit",
            "2",
            "--metrics-port",
            "0",
        )
        assert not refused(out), refused(out)
        assert "control topic" not in out, out[-3000:]  # read to its end: drains not held for it
    # on-call pauses and resumes; both act and the adapter may read the switch
    out = fleetwatch(broker, "oncall", "pause", "--reason", "acl test", "--for", "1m", "--by", "test")
    out += fleetwatch(broker, "oncall", "resume-drains", "--by", "test")
    assert not refused(out), refused(out)
    # the Slurm job publisher, the Slurm adapter and the accounting stage
    out = fleetwatch(
        broker, "slurm-jobs", "slurm-jobs", "--slurm-conf", slurm.conf, "--once", "--metrics-port", "0"
    )
    out += fleetwatch(
        broker,
        "slurm-drainer",
        "slurm-drainer",
        "--slurm-conf",
        slurm.conf,
        "--idle-exit",
        "2",
        "--state-dir",
        str(tmp_path / "drainer"),
        "--validate",
        "none",
        "--metrics-port",
        "0",
    )
    assert not refused(out), refused(out)
    assert any(
        v and json.loads(v)["schema"] == schemas.SLURM_NODE for _k, v in records(broker, topics.SLURM_NODES)
    )
    out = fleetwatch(
        broker,
        "account",
        "account",
        "--db",
        str(tmp_path / "acct.sqlite"),
        "--idle-exit",
        "2",
        "--metrics-port",
        "0",
    )
    assert not refused(out), refused(out)
    assert records(broker, topics.DEADLETTER) == []  # nothing of it was bad input


def test_a_service_without_its_rights_names_the_topics_and_stops(broker: AclBroker) -> None:
    # detect started with the agent's credentials: it may see only telemetry and the dead letters
    out = fleetwatch(broker, "agent", "detect", "--idle-exit", "3", "--metrics-port", "0", status=3)
    line = out.strip().splitlines()[-1]
    assert line.startswith("fleetwatch detect: topic(s) ") and "docs/security.md" in line, out[-2000:]
    for topic in (topics.FINDINGS, topics.STATE, topics.NODES):
        assert topic in line
