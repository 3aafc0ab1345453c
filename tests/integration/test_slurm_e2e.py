"""Real Slurm jobs end to end (issue 16, part 4): `fleetwatch slurm-jobs` publishes the jobs of the
real slurmctld on fleet.jobs.v1 and the detectors and the drain policy act on them.

- A real 4-node sbatch job runs tests/jobs/train_steps.py on every node with srun; each rank
  reports its steps with fleetwatch.steps and the rank on one node is slowed: a real detect worker
  names that node, and that job, a straggler, and no other node.
- Two critical nodes of one real running job: the drain policy, its job table filled from the
  topic by the follower every act process runs, drains one and refuses the other ("job").
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetwatch import schemas, topics
from fleetwatch.bus.kafka import KafkaBus
from fleetwatch.pipeline.job_table import JobTableFollower
from tests.helpers.act import Rig
from tests.helpers.findings import T0, finding
from tests.helpers.paths import REPO
from tests.integration.services import USES_SLURM, Jobs, Slurm, TopicTail
from tests.integration.workers import Detect

pytestmark = USES_SLURM

TRAIN = REPO / "tests" / "jobs" / "train_steps.py"


@pytest.fixture
def jobs(slurm: Slurm, kafka_bootstrap: str, tmp_path: Path) -> Iterator[Jobs]:
    """The publisher on the real jobs topic, which the worker's job table follows."""
    j = Jobs(slurm, kafka_bootstrap, tmp_path, topic=topics.JOBS)
    j.start()
    yield j
    j.stop()
    j.tail.close()
    # The topic is shared with other tests that use the same node names: forget this test's jobs
    # (as the publisher does a week after they end), so none is left running there if a test
    # stopped before its job's end was published.
    producer = KafkaBus(kafka_bootstrap).producer()
    for job in {r.key for r in j.records if r.key is not None}:
        producer.send(topics.JOBS, key=job, value=None)
    assert not producer.flush(30), "tombstones not acknowledged"
    producer.close()


def test_a_slowed_rank_of_a_real_job_is_named_a_straggler_with_its_job(
    jobs: Jobs, kafka_bootstrap: str
) -> None:
    detect = Detect(kafka_bootstrap, f"e2e{time.time_ns() % 10**6}")
    findings = TopicTail(kafka_bootstrap, topics.FINDINGS)
    try:
        job = jobs.sbatch(
            "-N",
            "4",
            "-c",
            "1",
            script=f"srun --mpi=none {sys.executable} {TRAIN} 100 0.25 gpu-node-03 1.6",
            env={"FLEETWATCH_BOOTSTRAP": kafka_bootstrap, "PYTHONPATH": str(REPO)},
        )
        jobs.wait(jobs.started(job))
        assert sorted(jobs.messages(job)[0]["nodes"]) == [f"gpu-node-0{i}" for i in range(1, 5)]

        def straggler(records: list) -> bool:
            return any(
                f["kind"] == "straggler" and f.get("job") == job
                for f in (schemas.decode(r.value) for r in records if r.value is not None)
            )

        got = findings.collect(straggler, timeout_s=120)
        named = {
            f["node"]
            for f in (schemas.decode(r.value) for r in got if r.value is not None)
            if f["kind"] == "straggler" and f.get("job") == job and not f["resolved"]
        }
        assert named == {"gpu-node-03"}, jobs.log.read_text()[-2000:]
        # found while the job still runs: end it now rather than wait for its last steps
        subprocess.run(["scancel", job], env=jobs.slurm.env, check=True)
        jobs.wait(jobs.ended(job), timeout_s=120)
        assert next(m["end_state"] for m in jobs.messages(job) if m["state"] != "started") == "CANCELLED"
    finally:
        findings.close()
        detect.close()


def test_two_critical_nodes_of_one_real_job_drain_only_one(jobs: Jobs, kafka_bootstrap: str) -> None:
    job = jobs.sbatch("-N", "2", "-w", "gpu-node-[01-02]", "-c", "1", script="sleep 300")
    try:
        jobs.wait(jobs.started(job))
        # act's job table, filled from the topic by the follower `fleetwatch act` runs
        rig = Rig({f"gpu-node-0{i}" for i in range(1, 5)}, fleet_size=100, budget_min_nodes=4)
        follower = JobTableFollower(rig.jobs, KafkaBus(kafka_bootstrap))
        follower.start()
        assert follower.caught_up.wait(60)
        deadline = time.monotonic() + 30
        while set(rig.jobs.nodes_of(job)) != {"gpu-node-01", "gpu-node-02"} and time.monotonic() < deadline:
            time.sleep(0.2)
        follower.stop()
        # critical findings that do not name the job: only the table knows the two share it
        out = rig.feed(finding("gpu-node-01", ts=T0), finding("gpu-node-02", ts=T0 + 1))
        assert [(m["action"], m["node"]) for m in out] == [("drain", "gpu-node-01")]
        assert rig.refusals() == {"gpu-node-02": "job"}
    finally:
        subprocess.run(["scancel", job], env=jobs.slurm.env, check=False)
        jobs.wait(jobs.ended(job))
