"""act's Prometheus metrics, as one object made on the registry its caller gives.

`fleetwatch act` uses `exported()`: this process's one set in prometheus_client's global REGISTRY
(what /metrics serves), so the names, labels and help text are those docs/contract.md lists.
Everything else (tests, benchmarks) builds `ActMetrics()` on no registry, or on a private
`CollectorRegistry` to read the counts, and so never touches the global one.
"""

from __future__ import annotations

import threading

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from fleetwatch.alerts.alertmanager import AlertMetrics
from fleetwatch.census import CensusMetrics


class ActMetrics:
    """The counters and gauges act writes: its Actor's and ResultBook's (alerts/actor.py,
    alerts/drain_log.py) here, its alert sender's (`alerts`, alerts/alertmanager.py) and its
    census's (`census`, fleetwatch/census.py) defined beside their writers."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry  # None: the metrics count but are exported nowhere
        self.findings = Counter(
            "fleetwatch_act_findings_total", "findings acted on", ["kind", "severity"], registry=r
        )
        self.drains = Counter(
            "fleetwatch_act_drain_requests_total", "drain/1 requests produced", ["action"], registry=r
        )
        self.refused = Counter(
            "fleetwatch_act_drains_refused_total", "drains refused, by reason", ["reason"], registry=r
        )
        self.budget_used = Gauge(
            "fleetwatch_act_drain_budget_used",
            "nodes drained by fleetwatch now (confirmed by Slurm)",
            registry=r,
        )
        self.pending = Gauge(
            "fleetwatch_act_drains_pending",
            "drains requested with no result from the adapter yet",
            registry=r,
        )
        self.unconfirmed = Gauge(
            "fleetwatch_act_drains_unconfirmed",
            "pending drains older than --pending-timeout (adapter down?)",
            registry=r,
        )
        self.results = Counter(
            "fleetwatch_act_drain_results_total",
            "drain_result/1 outcomes applied to a request",
            ["action", "outcome"],
            registry=r,
        )
        self.budget_nodes = Gauge(
            "fleetwatch_act_drain_budget_nodes", "nodes the drain budget allows now", registry=r
        )
        self.fleet = Gauge("fleetwatch_act_fleet_size", "fleet size the budget is computed on", registry=r)
        self.storm = Gauge("fleetwatch_act_storm_active", "1 while a drain storm is declared", registry=r)
        # One series per drained node only (a drained fleet is at most the budget, 2% by default),
        # so the "drained" state of a node's health is known to Grafana without a series per node.
        self.node_drained = Gauge(
            "fleetwatch_act_node_drained",
            "1 for each node fleetwatch holds drained (confirmed by Slurm)",
            ["node"],
            registry=r,
        )
        self.results_ignored = Counter(
            "fleetwatch_act_drain_results_ignored_total",
            "drain_result/1 records act does not apply: malformed, bad_signature, unbound (no request "
            "signature), wrong_node (names another node than the request it answers)",
            ["reason"],
            registry=r,
        )
        self.paused = Gauge(
            "fleetwatch_act_drains_paused",
            "1 while an operator's pause holds every automatic drain and resume (fleetwatch pause)",
            registry=r,
        )
        self.paused_until = Gauge(
            "fleetwatch_act_drains_paused_until_seconds",
            "when the pause in force ends (unix s); 0 when none is",
            registry=r,
        )
        self.dry_run = Gauge(
            "fleetwatch_act_dry_run",
            "1 when this act runs with --dry-run (its drain and resume requests are never executed)",
            registry=r,
        )
        self.control_refused = Counter(
            "fleetwatch_act_control_refused_total",
            "control/1 records refused: malformed, bad_signature, clock_skew",
            ["reason"],
            registry=r,
        )
        self.validations = Counter(
            "fleetwatch_act_validations_total",
            "validations of drained nodes before a resume, as the adapter reported them: passed, failed",
            ["outcome"],
            registry=r,
        )
        for outcome in ("passed", "failed"):  # both series from the start: rate() sees the first
            self.validations.labels(outcome)
        self.resumed_by_hand = Counter(
            "fleetwatch_act_resumed_by_hand_total",
            "nodes fleetwatch held drained that Slurm shows back in service (an operator resumed them)",
            registry=r,
        )
        self.held = Gauge(
            "fleetwatch_act_nodes_held",
            "nodes people hold (Slurm maintenance, down, drained by someone else, opted out): never "
            "drained, not counted in the fleet",
            registry=r,
        )
        self.slurm_nodes_refused = Counter(
            "fleetwatch_act_slurm_nodes_refused_total",
            "slurm_node/1 records refused: malformed, bad_signature, clock_skew",
            ["reason"],
            registry=r,
        )
        # Series of known labels from the start, at 0: the panels' increase() sees a first refusal
        for why in ("malformed", "bad_signature", "clock_skew"):
            self.control_refused.labels(why)
            self.slurm_nodes_refused.labels(why)
        for why in (
            "paused",
            "maintenance",
            "down",
            "drained_by_other",
            "opted_out",
            "storm",
            "budget",
            "job",
        ):
            self.refused.labels(why)
        self.alerts = AlertMetrics(r)
        self.census = CensusMetrics(r)


_exported: ActMetrics | None = None
_exported_lock = threading.Lock()


def exported() -> ActMetrics:
    """This process's act metrics in the global REGISTRY, made on the first call (for `fleetwatch
    act`; a second call, as in-process test runs of the command make, returns the same set)."""
    global _exported
    with _exported_lock:
        if _exported is None:
            _exported = ActMetrics(REGISTRY)
        return _exported
