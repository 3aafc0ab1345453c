"""The real services the integration tests run against, as classes the fixtures in
tests/integration/conftest.py and the tests themselves use: the local Kafka broker
(services/kafka/kafka.sh) read through TopicTail and written and inspected with small helpers on
fleetwatch.bus (the project's one Kafka client: tests use no other), a PrivateBroker to stop and restart,
Alertmanager (services/alertmanager/alertmanager.sh), Slurm (services/slurm/slurm.sh) and the
`fleetwatch slurm-jobs` publisher with its sbatch jobs (Jobs). Every start fails loudly when a
service cannot start: these tests are about the real thing, so there is nothing to skip to."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from fleetwatch import schemas
from fleetwatch.bus import Reader, Record, TopicPart
from fleetwatch.bus.admin import Admin, ensure_topics, wait_for_broker
from fleetwatch.bus.kafka import KafkaBus
from tests.helpers.paths import REPO

KAFKA_SH = REPO / "services" / "kafka" / "kafka.sh"
AM_SH = REPO / "services" / "alertmanager" / "alertmanager.sh"
SLURM_SH = REPO / "services" / "slurm" / "slurm.sh"
AM_PORT = int(os.environ.get("FLEETWATCH_TEST_AM_PORT", "19094"))
# `pytestmark = USES_SLURM` in every file whose tests use the one Slurm cluster (or `@USES_SLURM` on
# each such test, where others of the file do not use it): scripts/test.sh runs them in a pytest of
# their own, one after the other, beside the rest of the tier (tests/integration/conftest.py)
USES_SLURM = pytest.mark.slurm
# A long file that uses no shared service runs in that pytest too (`pytestmark = BESIDE_SLURM`): it
# balances the two processes' times, which the slower one decides
BESIDE_SLURM = pytest.mark.beside_slurm
# Long files that use no shared service but Alertmanager run in a third pytest of their own
# (`pytestmark = APART`), with a broker of its own: the tier mostly waits on its services (paced
# producers, session timeouts), so three processes side by side end sooner than two
APART = pytest.mark.apart
SLURM_NODES = [f"gpu-node-{i:02d}" for i in range(1, 5)]


def topic_parts(bootstrap: str, names: Sequence[str], wait_s: float = 10.0) -> list[TopicPart]:
    """Every partition of these topics (each waited for up to wait_s, as a topic just created)."""
    reader = KafkaBus(bootstrap).reader()
    try:
        parts = [TopicPart(t, p) for t in names for p in reader.partitions(t, wait_s=wait_s)]
    finally:
        reader.close()
    return parts


def partition_count(bootstrap: str, topic: str) -> int:
    with Admin(bootstrap) as admin:
        return admin.partition_count(topic)


def end_offsets(bootstrap: str, names: Sequence[str]) -> dict[TopicPart, int]:
    """Where each partition of these topics ends now: a test reads only what comes after."""
    reader = KafkaBus(bootstrap).reader()
    try:
        return reader.end_offsets([TopicPart(t, p) for t in names for p in reader.partitions(t, wait_s=10)])
    finally:
        reader.close()


def reader_at(bootstrap: str, start: Mapping[TopicPart, int]) -> Reader:
    """A reader of these partitions from these offsets on (the caller closes it)."""
    reader = KafkaBus(bootstrap).reader()
    reader.assign(list(start), start)
    return reader


def read_quiet(reader: Reader, quiet_s: float, timeout_s: float) -> list[Record]:
    """What `reader` returns until nothing new arrives for quiet_s (or timeout_s passes)."""
    records: list[Record] = []
    deadline = time.monotonic() + timeout_s
    last_new = time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - last_new < quiet_s:
        got = reader.poll(0.2)
        if got:
            records += got
            last_new = time.monotonic()
    return records


def commit_offsets(bootstrap: str, group: str, offsets: Mapping[TopicPart, int]) -> None:
    """Commit `offsets` for `group` (one with no member now), as a member that never joins would."""
    member = KafkaBus(bootstrap).group_consumer(group, client_id=f"{group}-offsets")
    try:
        member.commit(offsets, asynchronous=False)
    finally:
        member.close()


def send(
    bootstrap: str,
    topic: str,
    records: Iterable[tuple[bytes | None, bytes | None]],
    *,
    partition: int | None = None,
    timeout_s: float = 30.0,
    **producer: Any,
) -> None:
    """Produce (key, value) records (None value: a tombstone) and wait until the broker has every
    one of them; `producer`: KafkaBus.producer()'s settings."""
    p = KafkaBus(bootstrap).producer(**producer)
    try:
        for key, value in records:
            p.send(topic, key=key, value=value, partition=partition)
        failed = p.flush(timeout_s)
        assert not failed, f"{len(failed)} records to {topic} were not acknowledged"
    finally:
        p.close(5)


class TopicTail:
    """A reader placed at the current end of a topic: it sees only what a test produces next."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.reader = KafkaBus(bootstrap).reader()
        parts = self.reader.partitions(topic, wait_s=10)
        assert parts, f"topic {topic} has no partitions"
        self.tps = [TopicPart(topic, p) for p in parts]
        # the end as offsets taken now, before the test produces anything (not "end", which the
        # client would resolve later, possibly past a record produced meanwhile)
        self.reader.assign(self.tps, self.reader.end_offsets(self.tps))

    def rewind(self) -> None:
        """Read the topic again from its beginning."""
        self.reader.assign(self.tps, "beginning")

    def poll(self, timeout_s: float = 0.2) -> list[Record]:
        return self.reader.poll(timeout_s)

    def collect(self, until: Callable[[list[Record]], bool], timeout_s: float = 30.0) -> list[Record]:
        """Poll records until `until(records)` holds or the timeout passes."""
        records: list[Record] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not until(records):
            records += self.reader.poll(0.2)
        return records

    def messages(self, records: list[Record]) -> list[dict[str, Any]]:
        return [schemas.decode(r.value) for r in records]

    def close(self) -> None:
        self.reader.close()


class PrivateBroker:
    """A second local broker on its own ports, for tests that stop and restart Kafka without
    disturbing the shared one. For the tests of authenticated clients it also listens with
    SASL_PLAINTEXT (PLAIN, user "fleetwatch", password SASL_PASSWORD) on port + 2, and with SSL
    requiring a client certificate on port + 3 (CA and client certificate in tls_dir)."""

    SASL_PASSWORD = "fleetwatch-test-only"

    def __init__(self, port: int) -> None:
        self.port = port
        self.bootstrap = f"127.0.0.1:{port}"
        self.sasl_bootstrap = f"127.0.0.1:{port + 2}"
        self.ssl_bootstrap = f"127.0.0.1:{port + 3}"
        home = Path(os.environ.get("FLEETWATCH_HOME", REPO / ".fleetwatch"))
        self.tls_dir = home / f"kafka-{port}" / "tls"
        self.env = {
            **os.environ,
            "KAFKA_PORT": str(port),
            "KAFKA_CONTROLLER_PORT": str(port + 1),
            "KAFKA_SASL_PORT": str(port + 2),
            "KAFKA_SASL_PASSWORD": self.SASL_PASSWORD,
            "KAFKA_SSL_PORT": str(port + 3),
        }

    def _sh(self, verb: str) -> None:
        r = subprocess.run(
            ["bash", str(KAFKA_SH), verb], env=self.env, capture_output=True, text=True, timeout=300
        )
        if r.returncode != 0:
            pytest.fail(f"kafka.sh {verb} on port {self.port} failed: {r.stderr.strip()[-2000:]}")

    def start(self) -> None:
        self._sh("start")
        wait_for_broker(self.bootstrap, timeout_s=60)

    def stop(self) -> None:
        self._sh("stop")


class AclBroker(PrivateBroker):
    """A private broker that enforces ACLs (Kafka's StandardAuthorizer; what no ACL allows is
    denied), with a SASL/PLAIN user of each name in `users` (password SASL_PASSWORD). Its PLAINTEXT
    listener (`bootstrap`) is the Kafka admin, a super user. start_fresh() starts it on empty
    storage: only the ACLs and topics its test makes are there."""

    def __init__(self, port: int, users: Iterable[str]) -> None:
        super().__init__(port)
        self.env["KAFKA_ACL_USERS"] = " ".join(users)
        home = Path(os.environ.get("FLEETWATCH_HOME", REPO / ".fleetwatch"))
        self.data_dir = home / f"kafka-{port}"

    def start_fresh(self) -> None:
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)
        self.start()

    def client_env(self, user: str, **more: str) -> dict[str, str]:
        """The environment of a fleetwatch command that connects as `user` (sasl_bootstrap)."""
        return {
            **os.environ,
            "FLEETWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "FLEETWATCH_KAFKA_SASL_MECHANISM": "PLAIN",
            "FLEETWATCH_KAFKA_SASL_USERNAME": user,
            "FLEETWATCH_KAFKA_SASL_PASSWORD": self.SASL_PASSWORD,
            **more,
        }


@contextlib.contextmanager
def one_at_a_time(name: str) -> Iterator[None]:
    """Held by one test process at a time (the tier runs in two, scripts/test.sh): two `start`s
    of one service at once would both find it down and both launch it."""
    lock_dir = Path(os.environ.get("FLEETWATCH_HOME", REPO / ".fleetwatch"))
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f"{name}.test-lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def service(script: Path, verb: str, **env: str) -> str:
    with one_at_a_time(f"{script.stem}-{'-'.join(env.values())}"):
        r = subprocess.run(
            ["bash", str(script), verb], env={**os.environ, **env}, capture_output=True, text=True, timeout=60
        )
    if r.returncode != 0:
        pytest.fail(f"{script.name} {verb} failed (rc {r.returncode}): {r.stderr.strip()[-2000:]}")
    return r.stdout


class Alertmanager:
    """An Alertmanager on a loopback port, started (or reused) with alertmanager.sh."""

    def __init__(self, port: int, config: Path | None = None) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.env = {"ALERTMANAGER_PORT": str(port)}
        if config is not None:
            self.env["ALERTMANAGER_CONFIG"] = str(config)

    def start(self) -> None:
        service(AM_SH, "start", **self.env)

    def stop(self) -> None:
        service(AM_SH, "stop", **self.env)

    def alerts(self, **labels: str) -> list[dict[str, Any]]:
        """GET /api/v2/alerts?filter=k="v"... (active, silenced and inhibited ones; not resolved)."""
        q = urllib.parse.urlencode([("filter", f'{k}="{v}"') for k, v in labels.items()])
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts?{q}", timeout=5) as r:
            return json.load(r)

    def wait_for(
        self, until: Callable[[list[dict[str, Any]]], bool], timeout_s: float = 20.0, **labels: str
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        got = self.alerts(**labels)
        while not until(got) and time.monotonic() < deadline:
            time.sleep(0.1)
            got = self.alerts(**labels)
        return got


class Slurm:
    def __init__(self, conf: str) -> None:
        self.conf = conf
        self.env = {**os.environ, "SLURM_CONF": conf}

    def state(self, node: str) -> tuple[str, str]:
        """(state, reason) as sinfo -h -N -n NODE -o '%T|%E' prints them."""
        r = subprocess.run(
            ["sinfo", "-h", "-N", "-n", node, "-o", "%T|%E"],
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
        )
        state, _, reason = r.stdout.strip().partition("|")
        return state, reason

    def reset(self, *nodes: str) -> None:
        """Put nodes back to service: no job left on them (an earlier test's, or one a restarted
        slurmctld recovered from its state), and not drained (a test may leave them so)."""
        if nodes:
            subprocess.run(
                ["scancel", "--nodelist", ",".join(nodes)], env=self.env, capture_output=True, check=False
            )
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                left = subprocess.run(
                    ["squeue", "-h", "-w", ",".join(nodes), "-o", "%i"],
                    env=self.env,
                    capture_output=True,
                    text=True,
                    check=False,
                ).stdout.split()
                if not left:
                    break
                time.sleep(0.2)
        for n in nodes:
            subprocess.run(
                ["scontrol", "update", f"NodeName={n}", "State=RESUME"],
                env=self.env,
                capture_output=True,
                check=False,
            )


class Jobs:
    """One test's publisher (the real CLI, as a process), topic and sbatch jobs."""

    def __init__(self, slurm: Slurm, bootstrap: str, tmp: Path, topic: str | None = None) -> None:
        self.slurm = slurm
        self.bootstrap = bootstrap
        self.tmp = tmp
        self.topic = topic or f"test.jobs.{uuid.uuid4().hex[:10]}"
        ensure_topics(bootstrap, [self.topic])
        self.tail = TopicTail(bootstrap, self.topic)
        self.records: list[Record] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.env = dict(slurm.env)
        self.jobcomp = str(Path(slurm.conf).parent / "jobcomp.log")
        self.metrics_port: int | None = None
        self.log = tmp / "slurm-jobs.log"

    def start(self, *extra: str, env: dict[str, str] | None = None) -> None:
        argv = [sys.executable, "-m", "fleetwatch.cli", "slurm-jobs", "--bootstrap", self.bootstrap]
        argv += ["--topic", self.topic, "--interval", "1", "--jobcomp", self.jobcomp, *extra]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, env=env or self.env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT
            )

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None

    def sbatch(self, *args: str, script: str = "sleep 3", env: dict[str, str] | None = None) -> str:
        r = subprocess.run(
            ["sbatch", "--parsable", "--output=/dev/null", *args, "--wrap", script],
            env={**self.slurm.env, **(env or {})},
            cwd=self.tmp,
            capture_output=True,
            text=True,
            check=True,
        )
        return r.stdout.strip().split(";")[0]

    def scontrol_job(self, job: str) -> dict[str, str]:
        out = subprocess.run(
            ["scontrol", "show", "job", job], env=self.slurm.env, capture_output=True, text=True, check=True
        ).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def wait_state(self, job: str, states: set[str], timeout_s: float = 60.0) -> dict[str, str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            info = self.scontrol_job(job)
            if info.get("JobState") in states:
                return info
            time.sleep(0.2)
        pytest.fail(f"job {job} never reached {states}: {self.scontrol_job(job)}")

    def messages(self, job: str) -> list[dict[str, Any]]:
        return [
            schemas.decode(r.value, schemas.JOB, key=r.key)
            for r in self.records
            if r.value is not None and r.key == job.encode()
        ]

    def states(self, job: str) -> list[str]:
        return [m["state"] for m in self.messages(job)]

    def wait(self, until: Callable[[], bool], timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not until() and time.monotonic() < deadline:
            self.records += self.tail.collect(lambda rs: bool(rs), timeout_s=0.5)
        assert until(), f"timed out; publisher log:\n{self.log.read_text()[-3000:]}"

    def ended(self, *jobs: str) -> Callable[[], bool]:
        return lambda: all({"finished", "failed"} & set(self.states(j)) for j in jobs)

    def started(self, *jobs: str) -> Callable[[], bool]:
        return lambda: all("started" in self.states(j) for j in jobs)
