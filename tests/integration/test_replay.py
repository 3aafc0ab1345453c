"""`fleetwatch replay` against the real broker: valid lines land on their topics keyed as
docs/contract.md says; malformed lines go to the dead-letter topic with their reason, bytes intact."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from fleetwatch import schemas, topics
from tests.helpers.messages import GOOD, telemetry
from tests.helpers.paths import REPO


def test_replay_routes_and_dead_letters(kafka_bootstrap: str, topic_tail: Any, tmp_path: Path) -> None:
    node = "replay-node-1"
    good = [schemas.encode(telemetry(node=node, seq=i)) for i in range(5)]
    job = schemas.encode({**GOOD["job/1"], "job": "replay-job-1"})
    bad = {
        b'{"schema": "telemetry/1", "node": "replay-node-1"': "not_json",
        b'{"schema": "telemetry/9", "node": "replay-node-1"}': "unknown_schema",
        schemas.encode(telemetry(node=node, seq=-1)): "out_of_range",
        b"\xc3\x28 not utf-8": "not_utf8",
    }
    lines = [good[0], good[1], *bad, good[2], job, good[3], good[4]]
    f = tmp_path / "recorded.jsonl"
    f.write_bytes(b"\n".join(lines) + b"\n")

    tel, jobs, dlq = topic_tail(topics.TELEMETRY), topic_tail(topics.JOBS), topic_tail(topics.DEADLETTER)
    r = subprocess.run(
        [sys.executable, "-m", "fleetwatch.cli", "replay", str(f), "--bootstrap", kafka_bootstrap],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr
    assert "replayed 6 messages, rejected 4" in r.stderr

    tel_recs = tel.collect(lambda rs: sum(x.key == node.encode() for x in rs) >= 5, 20)
    assert [x.value for x in tel_recs if x.key == node.encode()] == good  # in order, bytes intact
    job_recs = jobs.collect(lambda rs: any(x.key == b"replay-job-1" for x in rs), 20)
    assert [x.value for x in job_recs if x.key == b"replay-job-1"] == [job]

    dl = dlq.collect(lambda rs: sum(b"replay:" in dict(x.headers).get("source", b"") for x in rs) >= 4, 20)
    dl = [x for x in dl if str(f).encode() in dict(x.headers).get("source", b"")]
    assert {x.value: dict(x.headers)["reason"].decode() for x in dl} == bad
    assert all(dict(x.headers)["detail"] for x in dl)
