"""An XID burst of many codes through the real broker into a real detect worker (issue 23, item 2).

Eighteen distinct benign XIDs on one GPU, then an XID 79: the finding on fleet.findings.v1 is
critical, names 79 as the worst code, and act's drain policy drains on it. Before the fix the
codes past the sixteenth were counted as "other", so the 79 reached neither the severity nor the
drain. Nodes are named per run, so the shared topics carry nothing else that matches."""

from __future__ import annotations

import time
from typing import Any

from fleetwatch import schemas, topics
from fleetwatch.alerts.policy import NodeState, Policy, drain_reason
from tests.helpers.messages import gpu, sample
from tests.integration.services import TopicTail
from tests.integration.workers import Detect, produce

# NVIDIA's RESTART_APP and IGNORE codes, and uncatalogued ones
BENIGN = (8, 11, 13, 14, 25, 31, 32, 38, 43, 45, 63, 68, 69, 92, 1001, 1002, 1003, 1004)


def test_an_xid79_after_many_benign_codes_is_critical_and_drains(
    kafka_bootstrap: str, detect: tuple[Detect, str]
) -> None:
    d, p = detect
    node = f"{p}n0"
    now = time.time() - 40
    records = [(node, sample(node, now, 1, [gpu(2)]))]
    records += [(node, sample(node, now + k, k + 1, [gpu(2, xids=[c])])) for k, c in enumerate(BENIGN, 1)]
    records.append((node, sample(node, now + 25, 30, [gpu(2, xids=[79])])))
    tail = TopicTail(kafka_bootstrap, topics.FINDINGS)
    produce(kafka_bootstrap, topics.TELEMETRY, [(k, v) for k, v in records])

    def mine(recs: list[Any]) -> list[dict[str, Any]]:
        return [schemas.decode(r.value) for r in recs if r.key == node.encode()]

    got = mine(tail.collect(lambda rs: any(f["evidence"].get("worst_xid") == 79 for f in mine(rs)), 60))
    tail.close()
    assert d.thread.is_alive(), "the worker died"
    xid = [f for f in got if f["kind"] == "xid" and not f["resolved"]]
    last = xid[-1]
    assert last["severity"] == "critical" and last["gpu"] == 2
    assert last["evidence"]["worst_xid"] == 79 and next(iter(last["evidence"]["xids"])) == "79"
    assert last["evidence"]["total"] == len(BENIGN) + 1
    assert len({f["id"] for f in xid}) == 1  # one burst, one incident
    assert drain_reason(last) == "XID 79"
    # act's policy, fed what act reads, counts the node as needing a drain
    st = NodeState()
    for f in got:
        Policy().observe(st, f)
    assert [o.drain for o in st.worthy()] == ["XID 79"]
