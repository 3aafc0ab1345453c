"""How a running act reads the Slurm adapter's answers and views, on the real broker (its results and
Slurm-node topics LogAppendTime, as in a deployment): the order the broker took them in decides,
not the adapter's clock, and an answer naming another node than its request is never filed.

Both are signed with the drain key, so no forger writes them: a view whose ts is ahead of the answer
it preceded comes from the adapter's own clock stepping (NTP), a wrong node from a defective adapter."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson

from fleetwatch import schemas
from fleetwatch.alerts import drain_request, drain_result
from fleetwatch.alerts.slurm import NodeInfo
from fleetwatch.alerts.slurm_nodes import make_record
from tests.helpers.findings import finding
from tests.integration.act_rig import KEY, ActRig, free_port, metric, wait_for_metric
from tests.integration.services import TopicTail

RESUMED = "fleetwatch_act_resumed_by_hand_total"
USED = "fleetwatch_act_drain_budget_used"


def in_service(node: str, ts: float) -> bytes:
    """The adapter's signed view of `node`: idle, no maintenance (back in service), taken at `ts`."""
    return orjson.dumps(make_record(NodeInfo(node, "idle", ""), (), False, ts, KEY.encode()))


def request_for(node: str, drains: TopicTail) -> dict[str, Any]:
    """The signed drain request act wrote for `node`."""
    got = drains.collect(lambda rs: any(r.key == node.encode() for r in rs), timeout_s=60)
    [m] = [m for m in drains.messages(got) if m["node"] == node]
    assert drain_request.verify(m, KEY.encode())
    return m


def steady(port: int, name: str, value: float, for_s: float) -> None:
    """`name` reads `value` throughout `for_s` seconds (act decides every second)."""
    deadline = time.monotonic() + for_s
    while time.monotonic() < deadline:
        assert metric(port, name) == value, name
        time.sleep(0.2)


def test_a_view_the_broker_took_before_the_drains_answer_is_not_a_resume_by_hand(
    rig: ActRig, topic_tail: Callable[[str], TopicTail]
) -> None:
    """The adapter's clock stepped ahead (45 s, under the 60 s a view may lead the broker) between a
    view it read before the drain and the drain's answer: the view's ts is after the answer's, but the
    broker took it first. It shows the node in service (as Slurm did before the drain), and must not
    free the drain's budget slot as if an operator had resumed the node. A view the broker takes after
    the answer does."""
    n = f"order-{rig.group}"
    drains = topic_tail(rig.drains)
    rig.census(n)
    port = free_port()
    rig.act("--fleet-size", "10", "--budget-min-nodes", "3", "--metrics-port", str(port))
    rig.wait_for_log(0, "assigned")
    rig.send(finding(n, ts=time.time() - 1))
    request = request_for(n, drains)
    now = time.time()
    rig.producer.send(rig.slurm_nodes, key=n.encode(), value=in_service(n, now + 45))
    rig.flush()  # the broker has the view before it has the answer below
    rig.result(request, "executed")  # ts: time.time(), 45 s before the view's
    assert wait_for_metric(port, USED, 1), rig.logs()
    steady(port, USED, 1, for_s=4)
    assert metric(port, RESUMED) == 0, rig.logs()

    # the adapter's next view, taken after the answer (in both clocks): the operator's resume
    rig.producer.send(rig.slurm_nodes, key=n.encode(), value=in_service(n, now + 46))
    rig.flush()
    assert wait_for_metric(port, RESUMED, 1), rig.logs()
    assert wait_for_metric(port, USED, 0), rig.logs()  # the slot is free again (the same decision)
    assert "back in service in Slurm (resumed by hand)" in rig.logs()


def test_an_answer_naming_another_node_than_its_request_is_counted_once_and_never_filed(
    rig: ActRig, topic_tail: Callable[[str], TopicTail]
) -> None:
    """A result bound to n's request (its id and signature, signed with the drain key) that names m:
    act files it for neither node, counts it once however many decisions see it, logs it once, and
    files n's genuine answer behind it."""
    n, m = f"asked-{rig.group}", f"other-{rig.group}"
    drains = topic_tail(rig.drains)
    rig.census(n, m)
    port = free_port()
    act = rig.act("--fleet-size", "10", "--budget-min-nodes", "3", "--metrics-port", str(port))
    rig.wait_for_log(0, "assigned")
    rig.send(finding(n, ts=time.time() - 1))
    request = request_for(n, drains)
    wrong = drain_result.make_result(
        request_id=request["request_id"], node=m, action="drain", outcome="executed", detail="",
        ts=time.time(), request_signature=request["signature"], key=KEY.encode(),
    )  # fmt: skip
    for key in (m, n):  # under either node's key: the topic's key decides nothing
        rig.producer.send(rig.results, key=key.encode(), value=schemas.encode(wrong))
    rig.flush()
    wrong_node = 'fleetwatch_act_drain_results_ignored_total{reason="wrong_node"}'
    assert wait_for_metric(port, wrong_node, 1), rig.logs()
    steady(port, wrong_node, 1, for_s=4)  # a decision every second, each seeing the same answer
    assert metric(port, "fleetwatch_act_drains_pending") == 1  # n's drain still waits for its answer
    assert metric(port, USED) == 0  # neither n nor m counts as drained
    assert rig.logs().count("ignoring a result for request") == 1

    rig.result(request, "executed")  # the genuine answer, behind the wrong one
    assert wait_for_metric(port, USED, 1), rig.logs()
    assert metric(port, "fleetwatch_act_drains_pending") == 0
    assert metric(port, wrong_node) == 1
    assert act.poll() is None, rig.logs()


def test_more_wrong_node_answers_than_a_request_keeps_leave_the_drain_pending_and_alerted(
    rig: ActRig, topic_tail: Callable[[str], TopicTail]
) -> None:
    """A defective adapter (it holds the drain key) answers n's request for five other nodes before
    it answers for n, all in n's partition. act keeps at most four answers per request copy
    (alerts/drain_log.py: memory bounded against the adapter's own floods), the first four, so n's
    genuine answer is not kept:
    the drain stays pending, holds its budget slot, and once --pending-timeout passes act says so
    (FleetwatchDrainRefused, adapter:no_result). Nothing is hidden and nothing counts as drained."""
    n = f"flooded-{rig.group}"
    others = [f"wrong{i}-{rig.group}" for i in range(5)]
    drains = topic_tail(rig.drains)
    rig.census(n, *others)
    port = free_port()
    act = rig.act(
        "--fleet-size", "10", "--budget-min-nodes", "3", "--metrics-port", str(port), "--pending-timeout", "3"
    )
    rig.wait_for_log(0, "assigned")
    rig.send(finding(n, ts=time.time() - 1))
    request = request_for(n, drains)
    for m in others:
        wrong = drain_result.make_result(
            request_id=request["request_id"], node=m, action="drain", outcome="executed", detail="",
            ts=time.time(), request_signature=request["signature"], key=KEY.encode(),
        )  # fmt: skip
        # keyed by n, as the genuine answer is: one partition, so act reads them in the order sent.
        # Keyed by the node they name, they sat in other partitions, which act may read after n's
        # (once on CI the genuine answer came first, was kept, and nothing paged)
        rig.producer.send(rig.results, key=n.encode(), value=schemas.encode(wrong))
    rig.flush()
    rig.result(request, "executed")  # the genuine answer, sixth
    wrong_node = 'fleetwatch_act_drain_results_ignored_total{reason="wrong_node"}'
    assert wait_for_metric(port, wrong_node, 1), rig.logs()  # counted once for the request
    # 60 s: once in a full run under load the page took longer than the default 20 s to arrive
    refused = rig.am.wait_for(
        lambda a: any(x["labels"]["alertname"] == "FleetwatchDrainRefused" for x in a),
        timeout_s=60.0,
        cluster=rig.cluster,
    )
    paged = [a for a in refused if a["labels"]["alertname"] == "FleetwatchDrainRefused"]
    assert len(paged) == 1, (refused, rig.logs())  # what act did, should it not page
    [alert] = paged
    assert (alert["labels"]["node"], alert["labels"]["reason"]) == (n, "adapter:no_result"), rig.logs()
    assert request["request_id"] in alert["annotations"]["summary"]
    assert metric(port, "fleetwatch_act_drains_pending") == 1
    assert metric(port, USED) == 0  # nothing counts as drained
    steady(port, wrong_node, 1, for_s=2)
    assert act.poll() is None, rig.logs()
