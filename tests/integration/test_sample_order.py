"""A node's samples are ordered by its agent's numbering, not by its clock (issue 23, item 1),
through the real broker into a real detect worker.

A clock that jumps ahead (inside the 60 s the worker accepts) or back must not make the node's
next real sample look old: its XID is found, and the jump is reported. A reinstalled agent (a new
instance, its seq from 0 again) is a new sequence, not old samples; and a late copy of the old
instance's sample is still a duplicate.
"""

from __future__ import annotations

import time
from typing import Any

from fleetwatch import schemas, topics
from tests.helpers.messages import gpu, sample
from tests.integration.services import TopicTail
from tests.integration.workers import Detect, produce


def test_a_jumping_clock_hides_no_xid_and_is_reported(
    kafka_bootstrap: str, detect: tuple[Detect, str]
) -> None:
    d, p = detect
    ahead, behind, reinstalled, spoofed, quiet = (
        f"{p}{name}" for name in ("ahead", "behind", "reinstalled", "spoofed", "quiet")
    )
    now = time.time()
    old, new = {"instance": "5f0c1a2b3c4d5e6f"}, {"instance": "a0b1c2d3e4f50617"}
    records = [
        # a clock 50 s ahead (accepted: under 60 s), then the right clock with the next seq: XID 79
        (ahead, sample(ahead, now - 3, 1)),
        (ahead, sample(ahead, now + 50, 2)),
        (ahead, sample(ahead, now - 1, 3, [gpu(0, xids=[79])])),
        # a clock stepped back 40 s: the next seq still counts, XID 79 with it
        (behind, sample(behind, now - 2, 1)),
        (behind, sample(behind, now - 42, 2, [gpu(0, xids=[79])])),
        # an agent reinstalled (a new instance: seq from 0 again) after seq 100-102 of the old one
        *[(reinstalled, sample(reinstalled, now - 6 + k, 100 + k, agent=old)) for k in range(3)],
        (reinstalled, sample(reinstalled, now - 2, 0, [gpu(0, xids=[79])], agent=new)),
        # ... and a late copy of an old instance's sample, with an XID it never had: a duplicate
        (reinstalled, sample(reinstalled, now - 1, 101, [gpu(0, xids=[48])], agent=old)),
        # a record under another instance (forged or stray) between the agent's own samples: the
        # agent's next sample and its XID 79 still count
        (spoofed, sample(spoofed, now - 4, 500, agent=old)),
        (spoofed, sample(spoofed, now - 3, 0, agent={"instance": "f0f0f0f0f0f0f0f0"})),
        (spoofed, sample(spoofed, now - 2, 501, [gpu(0, xids=[79])], agent=old)),
        # a node with a good clock and nothing to find (the worker got this far)
        (quiet, sample(quiet, now - 1, 1)),
        (quiet, sample(quiet, now, 2, [gpu(0, xids=[13])])),
    ]
    findings = TopicTail(kafka_bootstrap, topics.FINDINGS)
    produce(kafka_bootstrap, topics.TELEMETRY, records)

    def mine(recs: list[Any]) -> list[dict[str, Any]]:
        return [schemas.decode(r.value) for r in recs if r.key and r.key.startswith(p.encode())]

    wanted = {(ahead, "xid"), (behind, "xid"), (reinstalled, "xid"), (spoofed, "xid"), (quiet, "xid")}
    wanted |= {(ahead, "host"), (behind, "host")}
    got = mine(findings.collect(lambda rs: {(f["node"], f["kind"]) for f in mine(rs)} >= wanted, 60))
    assert d.thread.is_alive(), "the worker died"

    xids = {f["node"]: f for f in got if f["kind"] == "xid"}
    for node in (ahead, behind, reinstalled, spoofed):
        assert xids[node]["evidence"]["worst_xid"] == 79, xids[node]
        assert xids[node]["severity"] == "critical"
    # the old instance's late copy added nothing to the reinstalled node's incident
    assert not [f for f in got if f["node"] == reinstalled and "48" in (f["evidence"].get("xids") or {})]

    clocks = {f["node"]: f for f in got if f["kind"] == "host" and f["evidence"]["rule"] == "clock_jump"}
    assert clocks[ahead]["evidence"]["direction"] == "ahead"
    assert clocks[ahead]["evidence"]["jump_s"] > 40  # capped at the broker's time (+2 s)
    assert clocks[behind]["evidence"]["direction"] == "behind"
    assert clocks[behind]["evidence"]["jump_s"] < -35
    assert all(f["severity"] == "warning" for f in clocks.values())
    assert quiet not in clocks and reinstalled not in clocks
