"""A small per-node counting stage for the worker mechanism's own tests (unit tier on the
in-memory bus, integration tier on the real broker)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from fleetwatch import schemas
from fleetwatch.pipeline.tasks import Output, Stage


class CountingTask:
    """Counts samples per node; emits (node, count) for every sample it accepts."""

    def __init__(self, out_topic: str, counts: dict[str, int] | None = None) -> None:
        self.out_topic = out_topic
        self.counts = counts or {}

    def process(self, topic: str, msgs: Sequence[dict[str, Any]]) -> list[Output]:
        out: list[Output] = []
        for m in msgs:
            n = self.counts[m["node"]] = self.counts.get(m["node"], 0) + 1
            out.append(
                (self.out_topic, m["node"], {"schema": "count/1", "node": m["node"], "seq": m["seq"], "n": n})
            )
        return out

    def to_bytes(self) -> bytes:
        return orjson.dumps(self.counts)


def counting_stage(
    name: str,
    in_topic: str,
    out_topic: str,
    load_delay_s: float = 0.0,
    task: type[CountingTask] = CountingTask,
    serializers: dict[str, Callable[[Any], bytes]] | None = None,
) -> Stage:
    """A stage of `task`s (CountingTask or a variant of it), its outputs on out_topic."""

    def load(_p: int, raw: bytes) -> CountingTask:
        time.sleep(load_delay_s)  # stands for a big state
        return task(out_topic, orjson.loads(raw))

    return Stage(
        name=name,
        inputs=(in_topic,),
        schemas={in_topic: schemas.TELEMETRY},
        new_task=lambda p: task(out_topic),
        load_task=load,
        serializers=serializers or {},
    )
