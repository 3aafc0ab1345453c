"""The `drain_result/1` message: what the Slurm adapter did with one drain/1 request.

`fleetwatch slurm-drainer` produces one per request it handles to scheduler.drain.results.v1
(key = node), before it commits the request's offset; `fleetwatch act` follows the topic and only
counts a drain as done once its result says `executed` (alerts/drain_log.py, alerts/policy.py).

    {"schema": "drain_result/1", "request_id": 32 hex, "node": NAME, "action": "drain"|"resume",
     "outcome": one of OUTCOMES, "detail": one line, "ts": unix s (adapter's clock),
     "request_signature": the answered request's signature (64 hex),
     "signature": HMAC-SHA256 hex}

The result is signed with the same shared key and canonical form as drain/1
(alerts/drain_request.py): a result frees budget in `act`, so whoever can write the topic must not
be able to make `act` believe a drain was refused and issue another one. A signature vouches only
for what was authenticated: the adapter answers a request only once it decoded and its signature
verified (a forged or malformed one gets a dead letter and a counter, never a signed result
carrying its id; `rejected_forged` and `rejected_malformed` are written only by earlier
releases), and `request_signature` binds the answer to that exact request, so `act` files it
only against the request it issued (request ids are predictable from finding ids; signatures are
not). A result without it (written by an adapter of an earlier release, which also signed answers
to forged requests) is not applied.
"""

from __future__ import annotations

from typing import Any

from fleetwatch import schemas
from fleetwatch.alerts import drain_request
from fleetwatch.plain_text import clean_text

# The schema, its outcomes and its limits live in the core (fleetwatch/schemas.py), which decodes
# drain_result/1 without importing this layer.
DRAIN_RESULT = schemas.DRAIN_RESULT
OUTCOMES = schemas.DRAIN_OUTCOMES
MAX_DETAIL = schemas.MAX_DETAIL
BINDING = schemas.REQUEST_SIGNATURE  # optional in the schema (earlier releases wrote none), always written
validate_result = schemas.validate_result
EXECUTED = "executed"
DUPLICATE = "duplicate"  # handled before; its first result says how (act ignores this one)
# not now, nothing done (an operator's pause, a node people hold in Slurm): act asks again later
DEFERRED = "deferred"


def make_result(
    *,
    request_id: str,
    node: str,
    action: str,
    outcome: str,
    detail: str,
    ts: float,
    request_signature: str,
    key: bytes,
) -> dict[str, Any]:
    msg: dict[str, Any] = {
        "schema": DRAIN_RESULT,
        "request_id": request_id,
        "node": node,
        "action": action,
        "outcome": outcome,
        # one plain line: a detail repeats Slurm's Reason or a test's output, anyone's text (a
        # terminal escape in it reached act's log and alerts); clean_text's cut is marked "..."
        "detail": clean_text(detail or outcome, MAX_DETAIL) or outcome,
        "ts": float(ts),
        BINDING: request_signature,
    }
    msg["signature"] = drain_request.sign(msg, key)
    validate_result(msg)
    return msg
