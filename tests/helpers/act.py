"""The acting stage in-process (alerts/actor.py) with the real policy, alert model and result
book, and no Alertmanager: feed it findings, let it decide at a time of the test's choosing, hand
it drain results."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry

from fleetwatch import schemas
from fleetwatch.alerts import drain_result
from fleetwatch.alerts.act_metrics import ActMetrics
from fleetwatch.alerts.actor import Actor, ActTask
from fleetwatch.alerts.alert_model import AlertBook, AlertBuilder
from fleetwatch.alerts.drain_log import ResultBook
from fleetwatch.alerts.drain_pause import PauseBook
from fleetwatch.alerts.policy import Policy, PolicyConfig
from fleetwatch.alerts.slurm_nodes import SlurmNodeBook
from fleetwatch.pipeline.job_table import JobTable
from tests.helpers.findings import T0

KEY = b"test-drain-key-0123456789abcdef"


class NoAlertmanager:
    def flush(self, books: Iterable[AlertBook], force: bool = False) -> bool:
        return True


class Rig:
    def __init__(
        self,
        census: set[str],
        fleet_size: int | None = None,
        finding_key: bytes | None = None,  # detect's key: findings must verify (None: no check)
        metrics: bool = True,  # False: the actor is given no metrics (as eval and benchmarks build it)
        pause: PauseBook | None = None,  # an operator's switch (alerts/drain_pause.py); None: never paused
        dry_run: bool = False,
        held_book: SlurmNodeBook | None = None,  # nodes people hold (alerts/slurm_nodes.py)
        **cfg: Any,
    ) -> None:
        self.now = T0
        self.jobs = JobTable()
        # act's metrics on the rig's own registry: read with metric(), never the global one
        self.registry = CollectorRegistry()
        given = ActMetrics(self.registry) if metrics else None
        self.results = ResultBook(KEY, given)
        self.tasks: dict[tuple[str, int], ActTask] = {}
        self.actor = Actor(
            policy=Policy(PolicyConfig(**cfg)),
            builder=AlertBuilder("test", dry_run=dry_run),
            dispatcher=NoAlertmanager(),  # type: ignore[arg-type]
            jobs=self.jobs,
            key=KEY,
            drain_topic="drains",
            tasks=lambda: self.tasks,
            fleet_size=fleet_size,
            clock=lambda: self.now,
            census=census,
            results=self.results.answers,
            pending_timeout_s=300.0,
            finding_key=finding_key,
            metrics=given,
            pause=pause.active if pause is not None else lambda _now: None,
            dry_run=dry_run,
            held=held_book.held_nodes if held_book is not None else lambda _now: {},
            slurm_view=held_book.view if held_book is not None else lambda _node: (None, None),
        )
        self.task = self.tasks[("act", 0)] = ActTask(self.actor, 0)

    def feed(self, *fs: dict[str, Any]) -> list[dict[str, Any]]:
        return [msg for _, _, msg in self.task.process("findings", list(fs))]

    def decide(self, at: float) -> list[dict[str, Any]]:
        self.now = at
        return [msg for _, _, msg in self.actor.decide()]

    def result(
        self,
        req: dict[str, Any],
        outcome: str,
        key: bytes = KEY,
        node: str | None = None,
        detail: str = "",
        seen: float | None = None,
    ) -> None:
        """The adapter's signed answer to `req` (bound to its signature), as slurm-drainer sends it;
        `seen`: when the broker took it (None: not known, as from a topic act reads without it)."""
        r = drain_result.make_result(
            request_id=req["request_id"],
            node=node or req["node"],
            action=req["action"],
            outcome=outcome,
            detail=detail or f"{outcome} by the test",
            ts=self.now,
            request_signature=req["signature"],
            key=key,
        )
        self.results.apply(req["node"].encode(), schemas.encode(r), seen, seen is not None)

    def metric(self, name: str, **labels: str) -> float | None:
        """A sample of act's metrics for this rig (None: no such series)."""
        return self.registry.get_sample_value(name, labels)

    def alerts(self, alertname: str, active: bool = True) -> list[Any]:
        """The alert records of that name in the task's and the fleet-wide books."""
        books = (self.task.book, self.actor.global_book)
        return [
            r
            for b in books
            for r in b.records.values()
            if r.labels["alertname"] == alertname and (r.ends_at is None) == active
        ]

    def refusals(self) -> dict[str, str]:
        """node -> reason of each active FleetwatchDrainRefused alert."""
        return {
            r.labels["node"]: r.labels["reason"]
            for r in self.task.book.records.values()
            if r.labels["alertname"] == "FleetwatchDrainRefused" and r.ends_at is None
        }
