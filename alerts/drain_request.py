"""The `drain/1` message (docs/contract.md, "drain/1"): build, sign, verify and validate drain requests.

`signature` is HMAC-SHA256 (hex) over the canonical JSON of every other field: keys sorted, no
whitespace, UTF-8, as orjson writes them (its float formatting is the shortest round-trip form,
so a verifier that decodes and re-encodes gets the same bytes). The key is shared between
`fleetwatch act` and the Slurm adapter; it comes from FLEETWATCH_DRAIN_KEY or a key file and is
never logged or put in an error message.

`request_id` is a hash of (node, action, triggering finding ids), NOT of the time: reprocessing
the same findings after a restart yields the same request, and the adapter's journal makes it run
once.

A request lists at most MAX_FINDINGS ids (the first ones in sorted order); a node with more (one
sample can open a finding per InfiniBand port) gets a request whose reason says how many there
were, e.g. "fleetwatch: IB link down (256 of 257 findings listed)", and whose request_id is still
the hash of ALL of them. No field is added for the total on purpose: validate_drain refuses unknown
fields, so an adapter of an older release would refuse every such request, while this way every
adapter, old or new, accepts and verifies it unchanged.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from fleetwatch import schemas, signing
from fleetwatch.signing import SigningKeyError

# The schema and its limits live in the core (fleetwatch/schemas.py), which decodes drain/1
# without importing this layer.
DRAIN = schemas.DRAIN
ACTIONS = schemas.DRAIN_ACTIONS
MAX_REASON = schemas.MAX_REASON
MAX_FINDINGS = schemas.MAX_FINDINGS
REQUEST_ID = schemas.REQUEST_ID_RE
validate_drain = schemas.validate_drain
KEY_ENV = "FLEETWATCH_DRAIN_KEY"


class DrainKeyError(SigningKeyError):
    """No usable drain key; the message names where it was looked for, never its value."""


def load_key(key_file: str | None = None, env: Mapping[str, str] | None = None) -> bytes:
    """The shared HMAC key: the key file if given, else $FLEETWATCH_DRAIN_KEY."""
    return signing.load_key("drain", KEY_ENV, key_file, os.environ if env is None else env, DrainKeyError)


def request_id(node: str, action: str, findings: Iterable[str]) -> str:
    """Deterministic id: the same node, action and triggering findings give the same request."""
    return hashlib.sha256(orjson.dumps([node, action, sorted(findings)])).hexdigest()[:32]


def canonical(msg: Mapping[str, Any]) -> bytes:
    """The signed bytes: every field but `signature`, keys sorted (fleetwatch/signing.py)."""
    return signing.canonical(msg, "signature")


def sign(msg: Mapping[str, Any], key: bytes) -> str:
    return signing.mac(msg, key, "signature")


def one_line(reason: str, limit: int = MAX_REASON, blank: str = "fleetwatch") -> str:
    """`reason` as validate_drain accepts it: one line, at most `limit` characters, `blank` where
    nothing is left (a request's reason is never empty; a node view's Reason of only spaces is none).

    Reasons are built from finding evidence (an XID code, a rule name), which a detector or a
    producer may have filled with anything: a request must never fail to build because of it."""
    text = " ".join(reason.replace("\0", " ").split())
    return text[:limit] or blank


def bounded_reason(reason: str, total: int) -> str:
    """The reason, with a note of how many findings there were when not all of them are listed."""
    if total <= MAX_FINDINGS:
        return one_line(reason)
    note = f" ({MAX_FINDINGS} of {total} findings listed)"
    return one_line(reason, MAX_REASON - len(note)) + note


def make_request(
    *,
    node: str,
    action: str,
    reason: str,
    severity: str,
    findings: Iterable[str],
    issued_at: float,
    key: bytes,
    dry_run: bool = False,
) -> dict[str, Any]:
    """A signed drain/1; `dry_run`: a would-be request of `act --dry-run` (schemas.DRY_RUN), which
    no adapter executes."""
    ids = sorted(set(findings))
    msg: dict[str, Any] = {
        "schema": DRAIN,
        "request_id": request_id(node, action, ids),
        "node": node,
        "action": action,
        "reason": bounded_reason(reason, len(ids)),
        "severity": severity,
        "findings": ids[:MAX_FINDINGS],
        "issued_at": float(issued_at),
    }
    if dry_run:
        msg[schemas.DRY_RUN] = True
    msg["signature"] = sign(msg, key)
    validate_drain(msg)
    return msg


def verify(msg: Mapping[str, Any], key: bytes) -> bool:
    """True if the signature matches (constant-time compare)."""
    return signing.verify(msg, key, "signature")
