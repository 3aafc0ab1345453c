"""Workers on the real broker for the integration tests: Detect (the stages `fleetwatch detect`
runs, on a thread, positioned at the end of its inputs), and a small per-node counting stage for
the worker mechanism's own tests (CountingTask, counting_stage, produce)."""

from __future__ import annotations

import threading
import time

from fleetwatch.bus.kafka import KafkaBus
from fleetwatch.pipeline import fleet_metrics
from fleetwatch.pipeline.detect import stages
from fleetwatch.pipeline.job_stage import JobTaskConfig
from fleetwatch.pipeline.job_table import JobTable, JobTableFollower
from fleetwatch.pipeline.worker import Worker
from fleetwatch.runtime import StopFlag
from tests.helpers.counting import CountingTask, counting_stage  # noqa: F401  (used by the tests)
from tests.integration.services import send


class Detect:
    """A detect worker (the stages `fleetwatch detect` runs) in its own group, positioned at the end
    of every input partition before the test produces anything, running on a thread."""

    def __init__(
        self,
        bootstrap: str,
        run: str,
        census_key: bytes | None = None,
        job_config: JobTaskConfig | None = None,
    ) -> None:
        self.jobs = JobTable()
        self.follower = JobTableFollower(self.jobs, KafkaBus(bootstrap))
        self.follower.start()
        self.worker = Worker(
            bootstrap,
            f"test-hostile-{run}",
            # the tasks export to this process's /metrics, as `fleetwatch detect` wires them
            stages(self.jobs, census_key=census_key, job_config=job_config, metrics=fleet_metrics.exported()),
            snapshot_every_s=3600,
            start_at="latest",
        )
        expected = sum(self.worker.consumer.partition_count(t) for s in stages(self.jobs) for t in s.inputs)
        deadline = time.monotonic() + 60
        while len(self.worker.consumer.assignment()) < expected and time.monotonic() < deadline:
            self.worker.step(timeout_ms=200)
        assert len(self.worker.consumer.assignment()) == expected, "the worker never got all its partitions"
        self.stop = StopFlag(install=False)
        self.thread = threading.Thread(target=self.worker.run, args=(self.stop,))
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        self.worker.close()
        self.follower.stop()


def produce(bootstrap: str, topic: str, values: list[tuple[str, bytes]]) -> None:
    """(key, value) records on `topic`, each acknowledged by the broker before this returns. Values
    up to 1 MiB (kafka-python's limit, which these tests were written against; librdkafka's default
    is 1,000,000 bytes): the worker's guard is tested with records just under what the broker takes."""
    send(bootstrap, topic, ((key.encode(), value) for key, value in values), max_message_bytes=1 << 20)
