"""The `fleetwatch` console script (docs/contract.md, "Commands").

Each subcommand's implementation lives with its component and is imported only when that
subcommand runs, so `fleetwatch collect` on a node does not import the detectors.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from fleetwatch import config
from fleetwatch.arg_types import nonneg_float, nonneg_int, port, positive_float, positive_int, year
from fleetwatch.bus.config import BrokerUnavailable, TopicsRefused
from fleetwatch.runtime import METRICS_ADDR, setup_logging

DEFAULT_BOOTSTRAP = "127.0.0.1:19092"

log = logging.getLogger("fleetwatch")

# The commands that read the deployment file (--config FILE or $FLEETWATCH_CONFIG), each with a
# section of its flags ([detect], [act], ...); detect and act also have typed sections
# (_typed_sections). Options that only make sense for one run stay out of the file.
CONFIGURED = ("collect", "simulate", "detect", "act", "slurm-jobs", "slurm-drainer")
PER_RUN = frozenset({"help", "config", "idle_exit", "count", "once"})


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that keeps the options added to it and its commands' parsers, so that the
    configuration file's flat sections are made from the flags themselves (their types, defaults
    and help), not from a second list."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.options: list[argparse.Action] = []  # before super(): it adds --help
        self.commands: dict[str, _Parser] = {}
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.options.append(action)
        return action


def _checked(check: Callable[[str], Any], text: str) -> str:
    """`text` as written, once a collector's own parser (imported only when the flag is given) took it."""
    try:
        check(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _mount_spec(text: str) -> str:
    from fleetwatch.collectors.mounts import parse_mount_spec

    return _checked(parse_mount_spec, text)


def _probe_dir(text: str) -> str:
    from fleetwatch.collectors.mounts import check_probe_dir

    return _checked(check_probe_dir, text)


def _iface_prefix(text: str) -> str:
    """An interface name prefix: what Linux allows in a name (at most 15 bytes, no '/', ':' or
    whitespace), not empty."""
    if not 0 < len(text.encode()) <= 15 or any(c in text for c in "/:") or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(f"not an interface name prefix: {text[:40]!r}")
    return text


def _blockdev(text: str) -> str:
    from fleetwatch.collectors.blockdevs import check_blockdev_name

    return _checked(check_blockdev_name, text)


class _Repeated(argparse.Action):
    """A flag given once per value (--mount A --mount B), collected into a list; in the file, a list
    of strings. Values given on the command line replace the file's list, which is the flag's
    default: argparse's "append" would add to it, and a flag given overrides the file."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: Any = None
    ) -> None:
        current = getattr(namespace, self.dest, None)
        items = [] if current is None or current is self.default else list(current)
        setattr(namespace, self.dest, [*items, values])


def _file_list(action: argparse.Action) -> Callable[[Any], Any]:
    """A repeated flag's key in the file: a list of strings, each checked as the flag checks it."""

    def convert(value: Any) -> list[Any]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError("a list of strings")
        try:
            return [action.type(v) if callable(action.type) else v for v in value]
        except (ValueError, argparse.ArgumentTypeError) as e:
            raise ValueError(f"a list of valid values ({e})") from None

    return convert


_EXPECTED: dict[Any, str] = {
    int: "an integer",
    float: "a number",
    positive_int: "an integer > 0",
    positive_float: "a number > 0",
    nonneg_float: "a number >= 0",
    nonneg_int: "an integer >= 0",
    port: "an integer 0-65535",
    year: "an integer 1-9999",
}


def _file_flag(action: argparse.Action) -> config.Flag:
    """A flag as a key of its command's section: the file's value checked as the flag's own are."""
    if isinstance(action, _Repeated):
        return config.Flag(action.dest, action.default, action.help or "", _file_list(action))
    if action.nargs == 0:  # store_true / store_false
        expected = "true or false"
    elif action.choices:
        expected = "one of " + ", ".join(map(str, action.choices))
    else:
        expected = _EXPECTED.get(action.type, "a string" if action.type is None else "a valid value")

    def convert(value: Any) -> Any:
        if action.nargs == 0:
            if not isinstance(value, bool):
                raise ValueError(expected)
            return value
        # TOML gives numbers and strings as themselves: a string where a number is due (or the
        # reverse, or a float for an integer) is the file's mistake, not something to coerce
        numeric = action.type in _EXPECTED
        if isinstance(value, bool) or not isinstance(value, (int, float) if numeric else str):
            raise ValueError(expected)
        if isinstance(value, float) and "integer" in expected:
            raise ValueError(expected)
        try:
            out = action.type(str(value)) if action.type is not None else value
        except (ValueError, argparse.ArgumentTypeError):
            raise ValueError(expected) from None
        if action.choices and out not in action.choices:
            raise ValueError(expected)
        return out

    return config.Flag(action.dest, action.default, action.help or "", convert)


def _add_config(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help=f"deployment configuration, TOML (default: ${config.ENV}; docs/configuration.md); "
        "flags given here override it",
    )


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


def build_parser() -> _Parser:
    parser = _Parser(prog="fleetwatch", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "demo", help="the whole pipeline on this machine: Kafka, simulator, detectors, actions"
    )
    p.add_argument("--nodes", type=positive_int, default=None, help="nodes (default: the scenario's, 32)")
    p.add_argument("--duration", type=positive_float, default=None, help="simulated seconds (default 300)")
    p.add_argument("--speed", type=positive_float, default=10.0, help="simulated seconds per wall second")
    p.add_argument("--scenario", default=None, help="scenario file (default: the built-in demo scenario)")
    p.add_argument("--seed", type=int, default=None, help="override the scenario's seed")
    p.add_argument(
        "--bootstrap", default=None, help="reuse this Kafka broker instead of starting a fresh one"
    )
    p.add_argument("--drain-budget", type=nonneg_float, default=0.02, help="fraction of the fleet drainable")
    p.add_argument("--settle", type=positive_float, default=8.0, help="seconds of quiet to wait at the end")
    _add_config(p)  # checked here, read by the demo's detect and act
    p.set_defaults(handler="fleetwatch.demo:run")

    p = sub.add_parser("collect", help="node agent: stream this node's GPU/host/network telemetry")
    _add_bootstrap(p)
    p.add_argument("--interval", type=positive_float, default=1.0, help="seconds between samples")
    p.add_argument("--source", default="nvml,host,net", help="comma list of nvml,host,net,kernel,dcgm")
    p.add_argument("--node", default=None, help="node name (default: this host's short name)")
    p.add_argument("--spool-dir", default=None, help="on-disk buffer for broker outages")
    p.add_argument("--spool-max-mib", type=positive_float, default=256.0, help="spool bound in MiB")
    p.add_argument("--count", type=positive_int, default=None, help="stop after this many samples")
    p.add_argument("--metrics-port", type=port, default=None, help="serve Prometheus metrics here")
    _add_metrics_addr(p)
    p.add_argument("--call-timeout", type=positive_float, default=5.0, help="seconds per collector call")
    p.add_argument(
        "--dcgm-url",
        default="http://127.0.0.1:9400/metrics",
        help="the dcgm-exporter metrics URL the dcgm source reads (http or https)",
    )
    p.add_argument(
        "--dcgm-timeout",
        type=positive_float,
        default=2.0,
        help="seconds the dcgm source waits for the exporter's whole answer (connection, headers, body)",
    )
    p.add_argument(
        "--dcgm-any-host",
        action="store_true",
        help="take the exporter's series whatever host they name (an exporter serving this node only "
        "whose hostname label is not the node's name, or absent)",
    )
    p.add_argument(
        "--kernel-log",
        choices=("kmsg", "journal"),
        default="kmsg",
        help="where the kernel source reads the kernel log: /dev/kmsg, or the systemd journal (journalctl)",
    )
    p.add_argument(
        "--journal-args",
        default=None,
        help="journalctl's arguments for a journal kept elsewhere (--kernel-log journal): '-D /srv/journal'",
    )
    # the host source's node checks (collectors/mounts.py, collectors/blockdevs.py)
    p.add_argument(
        "--mount",
        action=_Repeated,
        type=_mount_spec,
        default=None,
        metavar="PATH[:rw|:ro]",
        help="a mount point this node must have, writable unless :ro (give the flag once per mount; "
        "in the file, a list)",
    )
    p.add_argument(
        "--mount-deadline",
        type=positive_float,
        default=10.0,
        help="seconds after which a mount's probe that has not returned counts as hung (a loaded NFS "
        "or Lustre server answers a small fsync in a few seconds; a dead one, never)",
    )
    p.add_argument(
        "--mount-interval",
        type=positive_float,
        default=10.0,
        help="seconds between probes of one mount (a few metadata operations on a shared server, "
        "from every node)",
    )
    p.add_argument(
        "--mount-probe",
        choices=("write", "access"),
        default="write",
        help="how a mount that must be writable is probed: create, write, fsync and unlink a file, "
        "or access(W_OK) where the site allows no writes",
    )
    p.add_argument(
        "--mount-probe-dir",
        type=_probe_dir,
        default=".fleetwatch-probe",
        help="the directory in each mount the write probe writes in (made when missing; . for the "
        "mount's root)",
    )
    p.add_argument(
        "--blockdev",
        action=_Repeated,
        type=_blockdev,
        default=None,
        metavar="NAME",
        help="a block device this node must have: sda, nvme0n1, or all (every fixed whole disk the "
        "first sample finds); give the flag once per device (in the file, a list)",
    )
    p.add_argument(
        "--net-virtual",
        action="store_true",
        help="the net source also reports the kernel's virtual interfaces (bridges, veth, VLANs, "
        "bonds, tunnels); by default only interfaces that are devices on a bus",
    )
    p.add_argument(
        "--net-skip",
        action=_Repeated,
        type=_iface_prefix,
        default=None,
        metavar="PREFIX",
        help="the net source leaves out interfaces whose name starts with PREFIX; give the flag once "
        "per prefix (in the file, a list)",
    )
    _add_config(p)
    p.set_defaults(handler="fleetwatch.collectors.agent:run")

    p = sub.add_parser("simulate", help="simulated cluster with fault injection and ground truth")
    _add_bootstrap(p)
    p.add_argument("--nodes", type=positive_int, default=None, help="nodes (default: scenario's)")
    p.add_argument("--gpus", type=positive_int, default=None, help="GPUs per node (default 8)")
    p.add_argument("--scenario", default=None, help="scenario file (YAML or JSON); default: built-in")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: scenario's)")
    p.add_argument(
        "--speed", type=nonneg_float, default=1.0, help="simulated seconds per wall second; 0 = flat out"
    )
    p.add_argument("--duration", type=positive_float, default=None, help="simulated seconds to run")
    p.add_argument(
        "--epoch",
        type=nonneg_float,
        default=None,
        help="unix time of simulated second 0 (default: early enough that no sample is in the future)",
    )
    p.add_argument("--metrics-port", type=port, default=None, help="serve Prometheus metrics here")
    _add_metrics_addr(p)
    _add_config(p)
    p.set_defaults(handler="fleetwatch.collectors.sim.cli:run")

    p = sub.add_parser("replay", help="produce recorded telemetry, one JSON message per line")
    p.add_argument("file", help="JSONL file (use - for stdin)")
    _add_bootstrap(p)
    p.add_argument("--topic", default=None, help="override the topic (default: by each message's schema)")
    p.set_defaults(handler="fleetwatch.collectors.replay:run")

    p = sub.add_parser("xids", help="the GPU, NVSwitch and PCIe events of a saved kernel log, as JSON lines")
    p.add_argument(
        "file",
        help="a saved kernel log: /dev/kmsg, dmesg [-T], journalctl -k [-o json], syslog (- for stdin)",
    )
    p.add_argument(
        "--year",
        type=year,
        default=None,
        help="the year of syslog lines, which carry none (default: this year)",
    )
    p.add_argument(
        "--utc-offset",
        default="+00:00",
        help="the offset of the local times dmesg -T and syslog lines print (default: +00:00)",
    )
    p.add_argument(
        "--gpus",
        default=None,
        help="GPU indices by PCI address (nvidia-smi lists them with index,pci.bus_id): 0=0000:9b:00.0,1=...",
    )
    p.set_defaults(handler="fleetwatch.pipeline.xids:run")

    p = sub.add_parser("detect", help="detector worker (consumer group fleetwatch-detect)")
    _add_bootstrap(p)
    p.add_argument("--metrics-port", type=port, default=9108, help="serve Prometheus metrics here (0: off)")
    _add_metrics_addr(p)
    p.add_argument("--group", default="fleetwatch-detect", help="consumer group (one per pipeline)")
    p.add_argument(
        "--time-scale",
        type=positive_float,
        default=1.0,
        help="shorten day-long detector windows (lemon) by this factor, for compressed simulations",
    )
    p.add_argument(
        "--arrival-speed",
        type=positive_float,
        default=None,
        help="telemetry reaches the broker this many times faster than the nodes' clocks run (a "
        "simulation or recording sent at N x; default [detect.node.silence] arrival_speed, 1)",
    )
    p.add_argument(
        "--start-at",
        choices=("earliest", "latest"),
        default="earliest",
        help="where a new consumer group starts reading (default: earliest)",
    )
    p.add_argument(
        "--forget-after",
        type=positive_float,
        default=None,
        help="forget a node after this many seconds without telemetry (event time; default "
        "[detect.node] forget_after_s, one day; inf: never): its findings resolve, its state and "
        "series go, act drops it from the fleet",
    )
    p.add_argument(
        "--snapshot-every", type=positive_float, default=30.0, help="seconds between state snapshots"
    )
    p.add_argument("--idle-exit", type=positive_float, default=None, help="exit after this many idle seconds")
    p.add_argument(
        "--no-skew-check",
        action="store_true",
        help="accept telemetry, steps and jobs whatever their timestamps (old recordings)",
    )
    p.add_argument(
        "--max-clock-ahead",
        type=nonneg_float,
        default=60.0,
        help="refuse a message timestamped more than this many seconds after it reached the broker",
    )
    p.add_argument(
        "--max-clock-behind",
        type=nonneg_float,
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
        type=nonneg_float,
        default=None,
        help="seconds of steady telemetry before a node's per-node /metrics series are always exported "
        "(default [detect.node] warm_up_s, 1200)",
    )
    _add_config(p)
    p.set_defaults(handler="fleetwatch.pipeline.detect:run")

    p = sub.add_parser("eval", help="simulate -> detect -> score, without wall-clock waits")
    p.add_argument("--scenario", default=None, help="scenario file (default: the built-in default)")
    p.add_argument("--nodes", type=positive_int, default=None, help="override the scenario's node count")
    p.add_argument("--seed", type=int, default=None, help="override the scenario's seed")
    p.add_argument("--duration", type=positive_float, default=None, help="override simulated seconds")
    p.add_argument("--json", action="store_true", help="print the scorecard as JSON")
    p.set_defaults(handler="fleetwatch.pipeline.evaluate:run")

    # --- action layer (alerts/): the two blocks below are owned by the alerts/ code
    p = sub.add_parser("act", help="route findings to Alertmanager and emit drain requests")
    _add_bootstrap(p)
    p.add_argument("--alertmanager", default="http://127.0.0.1:9093", help="Alertmanager base URL")
    p.add_argument(
        "--alertmanager-timeout",
        type=positive_float,
        default=30.0,
        help="seconds one post to Alertmanager may take (a slow answer is not a failure); alerts are "
        "sent beside the drain path, so this never delays a drain",
    )
    p.add_argument(
        "--alert-flush-timeout",
        type=nonneg_float,
        default=5.0,
        help="at exit, seconds to wait for Alertmanager to take the queued alerts (the rest stay in "
        "the closing snapshot and are sent after a restart)",
    )
    # The policy's and the census's flags default to None: not given, [act.policy] / [act.census]
    # of the file decides, else the code default (alerts/policy.py PolicyConfig, census.CensusConfig).
    p.add_argument(
        "--drain-budget", type=nonneg_float, default=None, help="max fraction of the fleet drained (0.02)"
    )
    p.add_argument(
        "--budget-min-nodes",
        type=int,
        default=None,
        help="budget floor in nodes (default 0: the fraction is strict)",
    )
    p.add_argument(
        "--fleet-size",
        type=positive_int,
        default=None,
        help="nodes in the fleet (default: the census of reporting nodes on --nodes-topic)",
    )
    p.add_argument(
        "--nodes-topic", default="fleet.nodes.v1", help="census of reporting nodes (node/1); only they drain"
    )
    _add_results_topic(p)
    p.add_argument(
        "--pending-timeout",
        type=positive_float,
        default=300.0,
        help="alert when a drain has had no result from the adapter for this many seconds",
    )
    p.add_argument("--cluster", default="default", help="cluster label on alerts")
    p.add_argument("--metrics-port", type=port, default=None, help="serve Prometheus metrics here")
    _add_metrics_addr(p)
    p.add_argument("--resend-interval", type=positive_float, default=60.0, help="seconds between re-sends")
    p.add_argument(
        "--resume-after",
        type=nonneg_float,
        default=None,
        help="healthy seconds before a drained node resumes (900)",
    )
    p.add_argument(
        "--cooldown",
        type=nonneg_float,
        default=None,
        help="re-drain within this many seconds = flapping (3600)",
    )
    p.add_argument(
        "--no-auto-resume",
        dest="auto_resume",
        action="store_false",
        default=None,
        help="never request resumes",
    )
    p.add_argument("--storm-window", type=positive_float, default=None, help="storm window, seconds (60)")
    p.add_argument(
        "--storm-nodes", type=positive_int, default=None, help="nodes in a window that make a storm (5)"
    )
    p.add_argument(
        "--storm-fraction",
        type=nonneg_float,
        default=None,
        help="fraction of the fleet that makes a storm (0.05)",
    )
    p.add_argument("--storm-min-nodes", type=positive_int, default=None, help="never a storm below this (3)")
    p.add_argument(
        "--storm-clear", type=nonneg_float, default=None, help="quiet seconds that end a storm (120)"
    )
    p.add_argument("--settle", type=nonneg_float, default=None, help="seconds to wait after an onset (0)")
    p.add_argument(
        "--retry-deferred",
        type=positive_float,
        default=None,
        help="seconds before a request the adapter deferred is asked again (60)",
    )
    p.add_argument(
        "--runbook-base",
        default=None,
        help="runbook_url prefix; a page of docs/runbooks/ is appended (default: act's own server, "
        "http://<host>:<--metrics-port>/runbooks/, which serves them)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        default=None,
        help="decide and alert as usual, but publish would-be drain/resume requests (marked dry_run) "
        "to the drain topic (default scheduler.drain.dryrun.v1, read by no adapter); alerts are "
        "labelled dry_run",
    )
    p.add_argument("--control-topic", default="fleet.control.v1", help="operators' switches (control/1)")
    p.add_argument(
        "--control-key-file",
        default=None,
        help="verifies the operators' switches (default: $FLEETWATCH_CONTROL_KEY, else the drain key)",
    )
    p.add_argument(
        "--slurm-nodes-topic",
        default="scheduler.nodes.v1",
        help="nodes as Slurm shows them (slurm_node/1, from slurm-drainer): held nodes are left alone",
    )
    p.add_argument("--drain-key-file", default=None, help="HMAC key file (default: $FLEETWATCH_DRAIN_KEY)")
    p.add_argument(
        "--census-key-file",
        default=None,
        help="detect's key file, census and findings: act verifies both (default: $FLEETWATCH_CENSUS_KEY)",
    )
    p.add_argument(
        "--census-warm-up",
        type=nonneg_float,
        default=None,
        help="seconds of steady telemetry before a census node counts toward the budget and storm guard "
        "(1200)",
    )
    p.add_argument(
        "--census-burst-fraction",
        type=nonneg_float,
        default=None,
        help="new node names within --census-burst-window, as a fraction of the warm fleet, that raise "
        "fleetwatch_act_census_burst (0.1)",
    )
    p.add_argument(
        "--census-burst-min",
        type=positive_int,
        default=None,
        help="never a census burst below this many names (10)",
    )
    p.add_argument(
        "--census-burst-window", type=positive_float, default=None, help="census burst window, s (600)"
    )
    p.add_argument(
        "--group", default=None, help="consumer group (fleetwatch-act; fleetwatch-act-dry-run with --dry-run)"
    )
    p.add_argument("--findings-topic", default="fleet.findings.v1", help="input topic")
    p.add_argument(
        "--drain-topic",
        default=None,
        help="drain request topic (scheduler.drain.v1; scheduler.drain.dryrun.v1 with --dry-run)",
    )
    p.add_argument("--snapshot-every", type=positive_float, default=5.0, help="state snapshot period, s")
    p.add_argument(
        "--instance-id",
        default=None,
        help="static group membership id: a restart with the same id takes its partitions back at once",
    )
    p.add_argument(
        "--session-timeout", type=positive_float, default=10.0, help="group session timeout, seconds"
    )
    p.add_argument("--idle-exit", type=positive_float, default=None, help="exit after this many idle s")
    _add_config(p)
    p.set_defaults(handler="fleetwatch.alerts.act:run")

    p = sub.add_parser(
        "slurm-jobs", help="publish job/1 for every Slurm job's start and end (beside slurmctld)"
    )
    _add_bootstrap(p)
    p.add_argument("--metrics-port", type=port, default=None, help="serve Prometheus metrics here")
    _add_metrics_addr(p)
    p.add_argument(
        "--interval", type=positive_float, default=2.0, help="seconds between squeue polls (default 2)"
    )
    p.add_argument("--slurm-conf", default=None, help="slurm.conf for squeue (default: $SLURM_CONF)")
    p.add_argument(
        "--jobcomp",
        default=None,
        help="slurmctld's JobCompLoc file (JobCompType=jobcomp/filetxt): ends of jobs Slurm has forgotten",
    )
    p.add_argument("--topic", default="fleet.jobs.v1", help="jobs topic (default fleet.jobs.v1)")
    p.add_argument("--once", action="store_true", help="poll once, publish, exit")
    _add_config(p)
    p.set_defaults(handler="fleetwatch.collectors.slurm_jobs.publisher:run")

    for name, helptext, handler in (
        (
            "pause",
            "pause automatic drains and resumes fleet-wide (every act obeys; survives restarts)",
            "pause",
        ),
        ("resume-drains", "lift a drain pause before it expires", "resume_drains"),
    ):
        p = sub.add_parser(name, help=helptext)
        _add_bootstrap(p)
        if name == "pause":
            p.add_argument("--reason", required=True, help="why (shown in every alert while paused)")
            p.add_argument(
                "--for",
                dest="duration",
                required=True,
                help="how long, e.g. 30m, 2h, 1d (at most 7 days: a pause ends by itself)",
            )
        else:
            p.add_argument("--reason", default="lifted by an operator", help="why (logged by every act)")
        p.add_argument("--by", default=None, help="who (default: user@host)")
        p.add_argument(
            "--drain-key-file", default=None, help="HMAC key file (default: $FLEETWATCH_DRAIN_KEY)"
        )
        p.add_argument("--control-topic", default="fleet.control.v1", help="control topic (control/1)")
        p.add_argument(
            "--control-key-file",
            default=None,
            help="control key file (default: $FLEETWATCH_CONTROL_KEY, else the drain key)",
        )
        p.set_defaults(handler=f"fleetwatch.alerts.pause_cli:{handler}")

    p = sub.add_parser(
        "account", help="reliability accounting: keep job, finding and drain history in a store"
    )
    _add_bootstrap(p)
    from fleetwatch.pipeline.reliability import args as reliability

    reliability.add_window_args(p)
    p.add_argument("--metrics-port", type=port, default=None, help="serve Prometheus metrics here")
    _add_metrics_addr(p)
    p.add_argument(
        "--census-key-file",
        default=None,
        help="census key file: findings and node/1 (default: $FLEETWATCH_CENSUS_KEY)",
    )
    p.add_argument(
        "--drain-key-file",
        default=None,
        help="drain key file, to read drain results (default: $FLEETWATCH_DRAIN_KEY; none: no drained time)",
    )
    p.add_argument(
        "--live-window",
        type=reliability.span_s,
        default=28 * 86400.0,
        help="trailing window of the live figures on /metrics (default 28d)",
    )
    p.add_argument(
        "--refresh-every",
        type=reliability.span_s,
        default=300.0,
        help="how often the live figures are computed (default 5m)",
    )
    p.add_argument("--jobs-topic", default="fleet.jobs.v1", help="job/1")
    p.add_argument("--steps-topic", default="fleet.steps.v1", help="step/1, with the checkpoint marks")
    p.add_argument("--findings-topic", default="fleet.findings.v1", help="finding/1")
    _add_results_topic(p)
    p.add_argument("--nodes-topic", default="fleet.nodes.v1", help="node/1: the census")
    p.add_argument(
        "--slurm-nodes-topic",
        default="scheduler.nodes.v1",
        help="slurm_node/1, from slurm-drainer: a drain lifted by hand ends where it shows the node back",
    )
    p.add_argument("--idle-exit", type=positive_float, default=None, help="exit after this many idle s")
    p.set_defaults(handler="fleetwatch.pipeline.reliability.cli:account_command")

    p = sub.add_parser("report", help="the reliability report (r_f, MTTF, ETTR, lemons, lost GPU-hours)")
    reliability.add_window_args(p)
    p.add_argument(
        "--since",
        type=reliability.when,
        default=None,
        help="start: now, a span back (28d), an ISO date or unix seconds (default: --until - 28d)",
    )
    p.add_argument("--until", type=reliability.when, default="now", help="end (default now)")
    p.add_argument("--out", default=None, help="write report.md, report.html and the plots (SVG) here")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(handler="fleetwatch.pipeline.reliability.cli:report_command")

    p = sub.add_parser("slurm-drainer", help="execute signed drain/resume requests with scontrol")
    _add_bootstrap(p)
    p.add_argument("--metrics-port", type=port, default=None, help="serve Prometheus metrics here")
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
        type=positive_float,
        default=600.0,
        help="refuse requests issued longer ago than this many seconds (rejected_stale)",
    )
    p.add_argument(
        "--max-skew",
        type=nonneg_float,
        default=60.0,
        help="refuse requests issued more than this many seconds ahead of this clock (rejected_stale)",
    )
    p.add_argument(
        "--slurm-nodes-topic",
        default="scheduler.nodes.v1",
        help="publish each node as Slurm shows it (slurm_node/1) here, for act",
    )
    p.add_argument(
        "--node-states-every",
        type=nonneg_float,
        default=30.0,
        help="seconds between sinfo reads for --slurm-nodes-topic (0: publish nothing)",
    )
    p.add_argument(
        "--validate",
        choices=("dcgmi", "command", "none"),
        default="dcgmi",
        help="the test a drained node passes on the node (a Slurm job in a one-node MAINT reservation) "
        "before a resume lifts fleetwatch's drain: dcgmi diag, the site's command, or none",
    )
    p.add_argument(
        "--validate-level",
        type=positive_int,
        default=1,
        help="dcgmi diag -r LEVEL (NVIDIA: 1 quick checks, seconds; 2 about 2 min; 3 about 15 min)",
    )
    p.add_argument(
        "--validate-command",
        default=None,
        help="the site's own test on the node (e.g. an NCCL all-reduce; exit 0 passes): with "
        "'--validate command', or where dcgmi is not installed",
    )
    p.add_argument(
        "--validate-timeout",
        type=positive_float,
        default=600.0,
        help="seconds the test may take on the node; past it the job is cancelled and fails",
    )
    p.add_argument("--dcgmi", default="dcgmi", help="dcgmi on the nodes (a path, or found on their PATH)")
    p.add_argument(
        "--control-topic",
        default="fleet.control.v1",
        help="operators' switches (control/1): while drains are paused, requests are answered deferred",
    )
    p.add_argument(
        "--control-key-file",
        default=None,
        help="verifies the operators' switches (default: $FLEETWATCH_CONTROL_KEY, else the drain key)",
    )
    p.add_argument("--idle-exit", type=positive_float, default=None, help="exit after this many idle s")
    _add_config(p)
    p.set_defaults(handler="fleetwatch.alerts.slurm_drainer:run")
    # --- end of the action layer's blocks

    p = sub.add_parser("score", help="stream a univariate CSV series through the online detector")
    p.add_argument("--csv", required=True, help="input CSV file (use - for stdin)")
    p.add_argument("--column", default="value", help="column holding the values (default: value)")
    p.add_argument(
        "--timestamp", default="timestamp", help="timestamp column (default: timestamp; row number if absent)"
    )
    p.set_defaults(handler="fleetwatch.pipeline.score_cli:run")

    p = sub.add_parser("config", help="print the deployment configuration's defaults, or check a file")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--defaults", action="store_true", help="print every key with its default and reason (TOML)"
    )
    what.add_argument("--check", metavar="FILE", help="check a file: exit 0 if every command would accept it")
    p.set_defaults(handler="fleetwatch.cli:config_command")

    for name in CONFIGURED:  # the add_parser() of a _Parser's subparsers makes _Parsers
        command = sub.choices[name]
        assert isinstance(command, _Parser)
        parser.commands[name] = command
    return parser


def _typed_sections(command: str) -> tuple[dict[str, type], set[str]]:
    """The typed sections a command reads and the flags that override their fields (imported only
    when needed: collect imports no detector)."""
    if command == "detect":
        from fleetwatch.pipeline.detect import SECTION_FLAGS, SECTIONS
    elif command == "act":
        from fleetwatch.alerts.act import SECTION_FLAGS, SECTIONS
    else:
        return {}, set()
    return SECTIONS, {flag for flags in SECTION_FLAGS.values() for flag in flags}


def command_sections(parser: _Parser, command: str) -> dict[str, config.Section]:
    """A command's sections of the file: its flags ([act]), then its typed sections ([act.policy]).
    A flag that overrides a typed field is not a key of its own: the field is."""
    typed, overriding = _typed_sections(command)
    flags = [
        _file_flag(a)
        for a in parser.commands[command].options
        if a.option_strings and a.dest not in PER_RUN and a.dest not in overriding
    ]
    return {command: flags, **typed}


def all_sections(parser: _Parser) -> dict[str, config.Section]:
    """Every section of the file, in the order --defaults prints them."""
    out: dict[str, config.Section] = {}
    for command in CONFIGURED:
        out.update(command_sections(parser, command))
    return out


HEADER = f"""fleetwatch deployment configuration (docs/configuration.md): every key with its code default.
Generated by `fleetwatch config --defaults`; check a file with `fleetwatch config --check FILE`.
Commands read it with --config FILE or ${config.ENV}; a flag on the command line overrides the
file, the file overrides the code. Keys commented out have no default (TOML has no null)."""


def config_command(args: argparse.Namespace) -> int:
    sections = all_sections(build_parser())
    if args.defaults:
        sys.stdout.write(config.render(sections, HEADER))
        return 0
    config.check_sections(config.load(args.check), sections)  # ConfigError: main reports, status 2
    print(f"{args.check}: ok")
    return 0


def _configure(parser: _Parser, argv: Sequence[str], args: argparse.Namespace) -> argparse.Namespace:
    """Parse again with the file's values as the command's defaults, so that a flag given overrides
    the file; the typed sections reach the command as args.settings ({} without a file).

    A command checks its own sections and that every section is some command's (each command
    checks its own keys: collect on a node imports no detector to check [detect.node])."""
    path = args.config or os.environ.get(config.ENV) or None
    args.settings = {}
    if path is None:
        return args
    data = config.load(path)
    if args.command not in parser.commands:  # the demo: the file is its workers', checked whole
        config.check_sections(data, all_sections(parser))
        args.config = path
        return args
    sections = command_sections(parser, args.command)
    decoded = config.check_sections(data, sections, roots=CONFIGURED)
    parser.commands[args.command].set_defaults(**decoded.pop(args.command))
    args = parser.parse_args(argv)
    args.settings, args.config = decoded, path
    log.info("configuration from %s", path)
    return args


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The command line with the deployment file applied, as main() runs it (ConfigError: a bad file)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    return _configure(parser, argv, args) if hasattr(args, "config") else args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    try:
        if hasattr(args, "config"):  # a command that reads the file (`config --check` names its own)
            args = _configure(parser, argv, args)
        # What runs, as the flags and the deployment file settled it (secrets come from the
        # environment, never through these arguments)
        log.debug("%s: %s", args.command, {k: v for k, v in vars(args).items() if k != "handler"})
        return int(_resolve(args.handler)(args) or 0)
    except (BrokerUnavailable, TopicsRefused) as e:
        print(f"fleetwatch {args.command}: {e}", file=sys.stderr)
        return 3
    except BrokenPipeError:
        # whoever reads our output stopped (`| head`): no traceback, and none at exit either,
        # when Python flushes stdout again; 141, as a shell reports a pipe's SIGPIPE
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except (FileNotFoundError, ValueError) as e:  # ConfigError among them: "config error: [act] ..."
        print(f"fleetwatch {args.command}: {e}", file=sys.stderr)
        return 2


def _resolve(spec: str) -> Callable[[argparse.Namespace], int]:
    module, func = spec.split(":")
    return getattr(importlib.import_module(module), func)


if __name__ == "__main__":
    sys.exit(main())
