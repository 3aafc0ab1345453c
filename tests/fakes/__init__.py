"""Test doubles for the collectors: a fake pynvml, and fake /proc and /sys trees on disk."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fleetwatch import schemas
from tests.fakes.fake_pynvml import FakeGpu, FakeLink, FakeNvml

__all__ = ["FakeGpu", "FakeLink", "FakeNvml", "telemetry_message", "write_tree"]


def write_tree(root: Path, files: Mapping[str, str]) -> Path:
    """Create `files` ({relative path: content}) under `root`, e.g. a fake /proc or /sys; returns root."""
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return root


def telemetry_message(*parts: Mapping[str, Any], node: str = "node-01", seq: int = 0) -> dict[str, Any]:
    """Wrap partial bodies from sources the way the agent does (schema/node/ts/seq; `gpus` is required)."""
    message: dict[str, Any] = {
        "schema": schemas.TELEMETRY,
        "node": node,
        "ts": time.time(),
        "seq": seq,
        "gpus": [],
    }
    for part in parts:
        message.update(part)
    return message
