"""A node agent for the tests (collectors/agent.py) with its spool in the test's directory and a
stand-in GPU source whose util is the call count."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleetwatch import topics
from fleetwatch.collectors.agent import Agent, SourceRunner
from fleetwatch.collectors.forwarder import SpoolForwarder
from fleetwatch.collectors.spool import Spool


class CountingSource:
    """A stand-in for a collector: a GPU list whose util is the call count."""

    name = "nvml"

    def __init__(self) -> None:
        self.calls = 0

    def sample(self) -> dict[str, Any]:
        self.calls += 1
        return {"gpus": [{"index": i, "util": float(self.calls % 100)} for i in range(8)]}

    def close(self) -> None:
        pass


def make_agent(tmp_path: Path, bootstrap: str, runners: list[SourceRunner], **kw: Any) -> Agent:
    spool = Spool(tmp_path / "spool.sqlite", max_bytes=kw.pop("max_bytes", 64 << 20))
    fwd = SpoolForwarder(spool, topics.TELEMETRY, bootstrap, retry_backoff_s=0.2)
    return Agent(node=kw.pop("node", "agent-test"), runners=runners, spool=spool, forwarder=fwd, **kw)
