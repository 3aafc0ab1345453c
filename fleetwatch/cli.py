"""The `fleetwatch` console script (DESIGN.md, "CLI").

Each subcommand's implementation lives with its component and is imported only when that
subcommand runs, so `fleetwatch collect` on a node does not import the detectors.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence

from fleetwatch.kafka_io import BrokerUnavailable
from fleetwatch.runtime import METRICS_ADDR, setup_logging

DEFAULT_BOOTSTRAP = "127.0.0.1:19092"

log = logging.getLogger("fleetwatch")


def _positive_float(text: str) -> float:
    v = float(text)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v


def _positive_int(text: str) -> int:
    v = int(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v


def _nonneg_float(text: str) -> float:
    v = float(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return v


def _add_bootstrap(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--bootstrap",
        default=DEFAULT_BOOTSTRAP,
        help=f"Kafka bootstrap servers HOST:PORT[,HOST:PORT] (default {DEFAULT_BOOTSTRAP})",
    )


def _add_metrics_addr(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--metrics-addr",
        default=METRICS_ADDR,
        help=f"address the metrics server binds (default {METRICS_ADDR}: this host only; "
        "0.0.0.0 where Prometheus scrapes from another host)",
    )


def _add_results_topic(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--results-topic",
        default="scheduler.drain.results.v1",
        help="the Slurm adapter's drain_result/1 (what became of each drain request)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleetwatch", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "demo", help="the whole pipeline on this machine: Kafka, simulator, detectors, actions"
    )
    p.add_argument("--nodes", type=_positive_int, default=None, help="nodes (default: the scenario's, 32)")
    p.add_argument("--duration", type=_positive_float, default=None, help="simulated seconds (default 300)")
    p.add_argument("--speed", type=_positive_float, default=10.0, help="simulated seconds per wall second")
    p.add_argument("--scenario", default=None, help="scenario file (default: the built-in demo scenario)")
    p.add_argument("--seed", type=int, default=None, help="override the scenario's seed")
    p.add_argument(
        "--bootstrap", default=None, help="reuse this Kafka broker instead of starting a fresh one"
    )
    p.add_argument("--drain-budget", type=_nonneg_float, default=0.02, help="fraction of the fleet drainable")
    p.add_argument("--settle", type=_positive_float, default=8.0, help="seconds of quiet to wait at the end")
    p.set_defaults(handler="fleetwatch.demo:run")

    p = sub.add_parser("collect", help="node agent: stream this node's GPU/host/network telemetry")
    _add_bootstrap(p)
    p.add_argument("--interval", type=_positive_float, default=1.0, help="seconds between samples")
    p.add_argument("--source", default="nvml,host,net", help="comma list of nvml,host,net")
    p.add_argument("--node", default=None, help="node name (default: this host's short name)")
    p.add_argument("--spool-dir", default=None, help="on-disk buffer for broker outages")
    p.add_argument("--spool-max-mib", type=_positive_float, default=256.0, help="spool bound in MiB")
    p.add_argument("--count", type=_positive_int, default=None, help="stop after this many samples")
    p.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics here")
    _add_metrics_addr(p)
    p.add_argument("--call-timeout", type=_positive_float, default=5.0, help="seconds per collector call")
    p.set_defaults(handler="fleetwatch.collectors.agent:run")

    p = sub.add_parser("simulate", help="simulated cluster with fault injection and ground truth")
    _add_bootstrap(p)
    p.add_argument("--nodes", type=_positive_int, default=None, help="nodes (default: scenario's)")
    p.add_argument("--gpus", type=_positive_int, default=None, help="GPUs per node (default 8)")
    p.add_argument("--scenario", default=None, help="scenario file (YAML or JSON); default: built-in")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: scenario's)")
    p.add_argument(
        "--speed", type=_nonneg_float, default=1.0, help="simulated seconds per wall second; 0 = flat out"
    )
    p.add_argument("--duration", type=_positive_float, default=None, help="simulated seconds to run")
    p.add_argument(
        "--epoch",
        type=_nonneg_float,
        default=None,
        help="unix time of simulated second 0 (default: early enough that no sample is in the future)",
    )
    p.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics here")
    _add_metrics_addr(p)
    p.set_defaults(handler="fleetwatch.collectors.sim.cli:run")

    p = sub.add_parser("replay", help="produce recorded telemetry, one JSON message per line")
    p.add_argument("file", help="JSONL file (use - for stdin)")
    _add_bootstrap(p)
    p.add_argument("--topic", default=None, help="override the topic (default: by each message's schema)")
    p.set_defaults(handler="fleetwatch.collectors.replay:run")

    p = sub.add_parser("detect", help="detector worker (consumer group fleetwatch-detect)")
    _add_bootstrap(p)
    p.add_argument("--metrics-port", type=int, default=9108, help="serve Prometheus metrics here (0: off)")
    _add_metrics_addr(p)
    p.add_argument("--group", default="fleetwatch-detect", help="consumer group (one per pipeline)")
    p.add_argument(
        "--time-scale",
        type=_positive_float,
        default=1.0,
        help="shorten day-long detector windows (lemon) by this factor, for compressed simulations",
    )
    p.add_argument(
        "--start-at",
        choices=("earliest", "latest"),
        default="earliest",
        help="where a new consumer group starts reading (default: earliest)",
    )
    p.add_argument(
        "--forget-after",
        type=_positive_float,
        default=86400.0,
        help="forget a node after this many seconds without telemetry (event time; default one day; "
        "inf: never): its findings resolve, its state and series go, act drops it from the fleet",
    )
    p.add_argument(
        "--snapshot-every", type=_positive_float, default=30.0, help="seconds between state snapshots"
    )
    p.add_argument(
        "--idle-exit", type=_positive_float, default=None, help="exit after this many idle seconds"
    )
    p.add_argument(
        "--no-skew-check",
        action="store_true",
        help="accept telemetry, steps and jobs whatever their timestamps (old recordings)",
    )
    p.add_argument(
        "--max-clock-ahead",
        type=_nonneg_float,
        default=60.0,
        help="refuse a message timestamped more than this many seconds after it reached the broker",
    )
    p.add_argument(
        "--max-clock-behind",
        type=_nonneg_float,
        default=86400.0,
        help="refuse a message timestamped more than this many seconds before it reached the broker",
    )
    p.add_argument(
        "--census-key-file",
        default=None,
        help="detect's key file, census and findings: it signs both (default: $FLEETWATCH_CENSUS_KEY)",
    )
    p.add_argument(
        "--census-warm-up",
        type=_nonneg_float,
        default=1200.0,
        help="seconds of steady telemetry before a node's per-node /metrics series are always exported",
    )
    p.set_defaults(handler="fleetwatch.pipeline.detect:run")

    p = sub.add_parser("eval", help="simulate -> detect -> score, without wall-clock waits")
    p.add_argument("--scenario", default=None, help="scenario file (default: the built-in default)")
    p.add_argument("--nodes", type=_positive_int, default=None, help="override the scenario's node count")
    p.add_argument("--seed", type=int, default=None, help="override the scenario's seed")
    p.add_argument("--duration", type=_positive_float, default=None, help="override simulated seconds")
    p.add_argument("--json", action="store_true", help="print the scorecard as JSON")
    p.set_defaults(handler="fleetwatch.pipeline.evaluate:run")

    # --- action layer (alerts/): the two blocks below are owned by the alerts/ code
    p = sub.add_parser("act", help="route findings to Alertmanager and emit drain requests")
    _add_bootstrap(p)
    p.add_argument("--alertmanager", default="http://127.0.0.1:9093", help="Alertmanager base URL")
    p.add_argument(
        "--alertmanager-timeout",
        type=_positive_float,
        default=30.0,
        help="seconds one post to Alertmanager may take (a slow answer is not a failure); alerts are "
        "sent beside the drain path, so this never delays a drain",
    )
    p.add_argument(
        "--alert-flush-timeout",
        type=_nonneg_float,
        default=5.0,
        help="at exit, seconds to wait for Alertmanager to take the queued alerts (the rest stay in "
        "the closing snapshot and are sent after a restart)",
    )
    p.add_argument(
        "--drain-budget", type=_nonneg_float, default=0.02, help="max fraction of the fleet drained"
    )
    p.add_argument(
        "--budget-min-nodes",
        type=int,
        default=0,
        help="budget floor in nodes (default 0: the fraction is strict)",
    )
    p.add_argument(
        "--fleet-size",
        type=_positive_int,
        default=None,
        help="nodes in the fleet (default: the census of reporting nodes on --nodes-topic)",
    )
    p.add_argument(
        "--nodes-topic", default="fleet.nodes.v1", help="census of reporting nodes (node/1); only they drain"
    )
    _add_results_topic(p)
    p.add_argument(
        "--pending-timeout",
        type=_positive_float,
        default=300.0,
        help="alert when a drain has had no result from the adapter for this many seconds",
    )
    p.add_argument("--cluster", default="default", help="cluster label on alerts")
    p.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics here")
    _add_metrics_addr(p)
    p.add_argument("--resend-interval", type=_positive_float, default=60.0, help="seconds between re-sends")
    p.add_argument(
        "--resume-after",
        type=_nonneg_float,
        default=900.0,
        help="healthy seconds before a drained node resumes",
    )
    p.add_argument(
        "--cooldown", type=_nonneg_float, default=3600.0, help="re-drain within this many seconds = flapping"
    )
    p.add_argument("--no-auto-resume", action="store_true", help="never request resumes")
    p.add_argument("--storm-window", type=_positive_float, default=60.0, help="storm window, seconds")
    p.add_argument("--storm-nodes", type=_positive_int, default=5, help="nodes in a window that make a storm")
    p.add_argument(
        "--storm-fraction", type=_nonneg_float, default=0.05, help="fraction of the fleet that makes a storm"
    )
    p.add_argument("--storm-min-nodes", type=_positive_int, default=3, help="never a storm below this")
    p.add_argument("--storm-clear", type=_nonneg_float, default=120.0, help="quiet seconds that end a storm")
    p.add_argument("--settle", type=_nonneg_float, default=0.0, help="seconds to wait after an onset")
    p.add_argument(
        "--runbook-base",
        default="https://github.com/fleetwatch/fleetwatch/blob/main/docs/runbooks.md#",
        help="runbook_url prefix; the finding kind is appended",
    )
    p.add_argument("--drain-key-file", default=None, help="HMAC key file (default: $FLEETWATCH_DRAIN_KEY)")
    p.add_argument(
        "--census-key-file",
        default=None,
        help="detect's key file, census and findings: act verifies both (default: $FLEETWATCH_CENSUS_KEY)",
    )
    p.add_argument(
        "--census-warm-up",
        type=_nonneg_float,
        default=1200.0,
        help="seconds of steady telemetry before a census node counts toward the budget and storm guard",
    )
    p.add_argument(
        "--census-burst-fraction",
        type=_nonneg_float,
        default=0.1,
        help="new node names within --census-burst-window, as a fraction of the warm fleet, that raise "
        "fleetwatch_act_census_burst",
    )
    p.add_argument(
        "--census-burst-min",
        type=_positive_int,
        default=10,
        help="never a census burst below this many names",
    )
    p.add_argument(
        "--census-burst-window", type=_positive_float, default=600.0, help="census burst window, s"
    )
    p.add_argument("--group", default="fleetwatch-act", help="consumer group")
    p.add_argument("--findings-topic", default="fleet.findings.v1", help="input topic")
    p.add_argument("--drain-topic", default="scheduler.drain.v1", help="drain request topic")
    p.add_argument("--snapshot-every", type=_positive_float, default=5.0, help="state snapshot period, s")
    p.add_argument(
        "--instance-id",
        default=None,
        help="static group membership id: a restart with the same id takes its partitions back at once",
    )
    p.add_argument(
        "--session-timeout", type=_positive_float, default=10.0, help="group session timeout, seconds"
    )
    p.add_argument("--idle-exit", type=_positive_float, default=None, help="exit after this many idle s")
    p.set_defaults(handler="fleetwatch.alerts.act:run")

    p = sub.add_parser(
        "slurm-jobs", help="publish job/1 for every Slurm job's start and end (beside slurmctld)"
    )
    _add_bootstrap(p)
    p.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics here")
    _add_metrics_addr(p)
    p.add_argument(
        "--interval", type=_positive_float, default=2.0, help="seconds between squeue polls (default 2)"
    )
    p.add_argument("--slurm-conf", default=None, help="slurm.conf for squeue (default: $SLURM_CONF)")
    p.add_argument(
        "--jobcomp",
        default=None,
        help="slurmctld's JobCompLoc file (JobCompType=jobcomp/filetxt): ends of jobs Slurm has forgotten",
    )
    p.add_argument("--topic", default="fleet.jobs.v1", help="jobs topic (default fleet.jobs.v1)")
    p.add_argument("--once", action="store_true", help="poll once, publish, exit")
    p.set_defaults(handler="fleetwatch.collectors.slurm_jobs.publisher:run")

    p = sub.add_parser("slurm-drainer", help="execute signed drain/resume requests with scontrol")
    _add_bootstrap(p)
    p.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics here")
    _add_metrics_addr(p)
    p.add_argument("--drain-key-file", default=None, help="HMAC key file (default: $FLEETWATCH_DRAIN_KEY)")
    p.add_argument(
        "--state-dir", default=None, help="journal directory (default: $FLEETWATCH_HOME/slurm-drainer)"
    )
    p.add_argument("--slurm-conf", default=None, help="slurm.conf for sinfo/scontrol (default: $SLURM_CONF)")
    p.add_argument("--group", default="fleetwatch-slurm", help="consumer group")
    p.add_argument("--drain-topic", default="scheduler.drain.v1", help="drain request topic")
    _add_results_topic(p)
    p.add_argument(
        "--max-age",
        type=_positive_float,
        default=600.0,
        help="refuse requests issued longer ago than this many seconds (rejected_stale)",
    )
    p.add_argument(
        "--max-skew",
        type=_nonneg_float,
        default=60.0,
        help="refuse requests issued more than this many seconds ahead of this clock (rejected_stale)",
    )
    p.add_argument("--idle-exit", type=_positive_float, default=None, help="exit after this many idle s")
    p.set_defaults(handler="fleetwatch.alerts.slurm_drainer:run")
    # --- end of the action layer's blocks

    p = sub.add_parser("score", help="stream a univariate CSV series through the online detector")
    p.add_argument("--csv", required=True, help="input CSV file (use - for stdin)")
    p.add_argument("--column", default="value", help="column holding the values (default: value)")
    p.add_argument(
        "--timestamp", default="timestamp", help="timestamp column (default: timestamp; row number if absent)"
    )
    p.set_defaults(handler="fleetwatch.pipeline.score_cli:run")

    return parser


def _resolve(spec: str) -> Callable[[argparse.Namespace], int]:
    module, func = spec.split(":")
    return getattr(importlib.import_module(module), func)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    try:
        return int(_resolve(args.handler)(args) or 0)
    except BrokerUnavailable as e:
        print(f"fleetwatch {args.command}: {e}", file=sys.stderr)
        return 3
    except (FileNotFoundError, ValueError) as e:
        print(f"fleetwatch {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
