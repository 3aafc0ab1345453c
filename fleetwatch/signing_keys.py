"""The HMAC keys fleetwatch signs with (docs/security.md): read from a key file, or else from an
environment variable, and never logged or put in an error message. One function for both keys:
the drain key (act and the Slurm adapter) and detect's key (the census and findings)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

MIN_KEY_BYTES = 16


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
            raw = Path(key_file).read_bytes().strip()
        except OSError as e:
            raise error(f"cannot read the {what} key file {key_file}: {e.strerror}") from None
        where = f"key file {key_file}"
    else:
        raw = env.get(env_var, "").strip().encode()
        where = f"${env_var}"
    if len(raw) < MIN_KEY_BYTES:
        raise error(f"no {what} signing key: {where} is missing or shorter than {MIN_KEY_BYTES} bytes")
    return raw
