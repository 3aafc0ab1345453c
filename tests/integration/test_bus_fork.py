"""Kafka clients of the bus inherited through os.fork() (a PyTorch DataLoader worker forked from a
training rank that reports steps): librdkafka's threads stay in the parent, so in the child the
inherited producer and reader go inert. The child sends nothing through them, does not block on
them, does not crash, and leaves through a normal interpreter exit (finalisers and atexit run, which
would otherwise destroy the parent's handle and hang); a StepReporter it inherited reports through
a producer of its own. The parent's clients are untouched."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid

from fleetwatch import schemas
from fleetwatch.bus import TopicPart
from fleetwatch.bus.admin import ensure_topics
from fleetwatch.bus.kafka import KafkaBus
from tests.helpers.paths import REPO

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    from fleetwatch.bus import SendError
    from fleetwatch.bus.kafka import KafkaBus
    from fleetwatch.steps import StepReporter

    bootstrap, topic, steps_topic, child_reports = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "yes"
    bus = KafkaBus(bootstrap)
    producer = bus.producer()
    reader = bus.reader()
    r = StepReporter(bootstrap, job="fork-test", rank=0, node="n1", topic=steps_topic)
    r.step(0, 0.5)
    deadline = time.monotonic() + 20
    while r.sent < 1 and time.monotonic() < deadline:  # the reporter has a connected producer
        time.sleep(0.01)
    producer.send(topic, key=b"parent", value=b"before the fork")
    pid = os.fork()
    if pid == 0:
        out = {}
        try:
            producer.send(topic, key=b"child", value=b"from the child")
            out["send"] = "sent"
        except SendError:
            out["send"] = "refused"
        producer.flush(5)
        producer.close(5)
        reader.close()
        if child_reports:
            for i in range(100, 105):
                r.step(i, 0.25)
        out["accepted"] = r.accepted
        print(json.dumps(out), flush=True)
        sys.exit(0)  # a normal exit: atexit closes the reporter, finalisers run
    _pid, status = os.waitpid(pid, 0)
    unacked = producer.flush(20)
    producer.close(5)
    reader.close()
    closed = r.close(20)
    print(json.dumps({"child_exit": os.waitstatus_to_exitcode(status), "unacked": len(unacked),
                      "closed": closed, "sent": r.sent}), flush=True)
    """
)


def _read_all(bootstrap: str, topic: str) -> list[bytes | None]:
    bus = KafkaBus(bootstrap)
    reader = bus.reader()
    try:
        parts = [TopicPart(topic, p) for p in reader.partitions(topic, wait_s=10)]
        reader.assign(parts)
        end = reader.end_offsets(parts)
        values: list[bytes | None] = []
        while any(reader.position(tp) < end[tp] for tp in parts):
            values += [r.value for r in reader.poll(0.5)]
        return values
    finally:
        reader.close()


def _run(bootstrap: str, child_reports: bool) -> tuple[dict[str, object], dict[str, object], str, str]:
    topic, steps_topic = f"fork-{uuid.uuid4().hex[:8]}", f"fork-steps-{uuid.uuid4().hex[:8]}"
    ensure_topics(bootstrap, [topic, steps_topic])
    p = subprocess.run(
        [sys.executable, "-c", SCRIPT, bootstrap, topic, steps_topic, "yes" if child_reports else "no"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=90,  # a child hung in an inherited handle fails here
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    child, parent = (json.loads(line) for line in p.stdout.splitlines())
    return child, parent, topic, steps_topic


def test_a_child_never_uses_the_parents_clients_and_exits_normally(kafka_bootstrap: str) -> None:
    child, parent, topic, steps_topic = _run(kafka_bootstrap, child_reports=False)
    assert child == {"send": "refused", "accepted": 0}
    assert parent == {"child_exit": 0, "unacked": 0, "closed": True, "sent": 1}
    # the parent's record once (the child neither resent it nor sent its own), the parent's step
    assert _read_all(kafka_bootstrap, topic) == [b"before the fork"]
    assert len(_read_all(kafka_bootstrap, steps_topic)) == 1


def test_a_child_that_reports_delivers_through_its_own_producer_at_exit(kafka_bootstrap: str) -> None:
    child, parent, _topic, steps_topic = _run(kafka_bootstrap, child_reports=True)
    assert child == {"send": "refused", "accepted": 5}
    assert parent == {"child_exit": 0, "unacked": 0, "closed": True, "sent": 1}
    steps = [schemas.decode(v, schemas.STEP) for v in _read_all(kafka_bootstrap, steps_topic) if v]
    assert sorted(m["step"] for m in steps) == [0, 100, 101, 102, 103, 104]
