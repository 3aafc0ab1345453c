"""How fleetwatch signs the records that steer an action (docs/security.md), in one place: the
HMAC keys, read from a key file or else an environment variable and never logged or put in an
error message, and the one signature scheme every signed message uses: HMAC-SHA256 (hex) over
the canonical JSON of every field but the signature's own (keys sorted, no whitespace, UTF-8, as
orjson writes them; its float formatting is the shortest round-trip form, so a verifier that
decodes and re-encodes gets the same bytes), the `schema` field included, so that one message's
signature never passes for another's.

Two keys use it: the drain key (act and the Slurm adapter: drain/1 and drain_result/1, whose
signature field is `signature`) and detect's key (the census, node/1, and findings, finding/1,
whose field is `sig`)."""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import stat
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from fleetwatch import schemas

MIN_KEY_BYTES = 16
MAX_KEY_FILE_BYTES = 4096


class SigningKeyError(ValueError):
    """No usable signing key; the message names where it was looked for, never its value."""


def load_key(
    what: str,
    env_var: str,
    key_file: str | None,
    env: Mapping[str, str],
    error: type[SigningKeyError] = SigningKeyError,
) -> bytes:
    """The key from `key_file` if given, else from $`env_var`; `what` names it in errors
    ("drain", "census"), which are raised as `error`."""
    if key_file:
        try:
            if not stat.S_ISREG(os.stat(key_file).st_mode):  # a FIFO would block, /dev/zero never end
                raise error(f"the {what} key file {key_file} is not a regular file")
            with open(key_file, "rb") as f:
                raw = f.read(MAX_KEY_FILE_BYTES + 1)
        except OSError as e:
            raise error(f"cannot read the {what} key file {key_file}: {e.strerror}") from None
        if len(raw) > MAX_KEY_FILE_BYTES:
            raise error(f"the {what} key file {key_file} is longer than {MAX_KEY_FILE_BYTES} bytes")
        raw = raw.strip()
        where = f"key file {key_file}"
    else:
        raw = env.get(env_var, "").strip().encode()
        where = f"${env_var}"
    if len(raw) < MIN_KEY_BYTES:
        raise error(f"no {what} signing key: {where} is missing or shorter than {MIN_KEY_BYTES} bytes")
    return raw


def canonical(msg: Mapping[str, Any], field: str = "sig") -> bytes:
    """The signed bytes: every field but `field`, keys sorted."""
    return orjson.dumps({k: v for k, v in msg.items() if k != field}, option=orjson.OPT_SORT_KEYS)


def mac(msg: Mapping[str, Any], key: bytes, field: str = "sig") -> str:
    """The signature of `msg` (hex)."""
    return hmac.new(key, canonical(msg, field), hashlib.sha256).hexdigest()


def verify(msg: Mapping[str, Any], key: bytes, field: str = "sig") -> bool:
    """True if msg[field] is its signature under `key` (constant-time compare)."""
    sig = msg.get(field)
    if not isinstance(sig, str) or not sig.isascii():
        # compare_digest raises TypeError on a str with non-ASCII characters: an unsigned record
        # with "sig": "é" raised out of act's task (a dead letter, a page and a reload per record)
        return False
    return hmac.compare_digest(sig, mac(msg, key, field))


def decode_verified(
    value: bytes, schema: str, kafka_key: bytes | None, key: bytes, field: str = "signature"
) -> tuple[dict[str, Any] | None, str, str]:
    """A record of a signed topic: (the message, "", "") when it decodes as `schema` and its
    `field` verifies under `key`; else (None, reason, detail), the reason `malformed` or
    `bad_signature`, for the reader to count."""
    try:
        msg = schemas.decode(value, schema, key=kafka_key)
    except schemas.MessageError as e:
        return None, "malformed", str(e)
    if not verify(msg, key, field):
        return None, "bad_signature", f"{schema} that does not verify"
    return msg, "", ""


def signed(msg: Mapping[str, Any], key: bytes) -> dict[str, Any]:
    """The message with its `sig`, signed over its JSON values (a numpy scalar in a finding's
    evidence becomes the plain number a reader decodes and verifies)."""
    plain = orjson.loads(schemas.encode({k: v for k, v in msg.items() if k != "sig"}))
    return {**plain, "sig": mac(plain, key)}


def encode_signed(msg: Mapping[str, Any], key: bytes) -> bytes:
    """The message as it goes on its topic: signed, compact JSON."""
    return schemas.encode(signed(msg, key))


def encoder(key: bytes) -> Callable[[dict[str, Any]], bytes]:
    """A stage's serializer for a signed output topic (pipeline/tasks.py Stage.serializers): the
    tasks' outputs stay key-free, so snapshots and `fleetwatch eval` never see the key."""
    return functools.partial(encode_signed, key=key)
