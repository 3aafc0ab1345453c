"""The node agent (`fleetwatch collect`): one telemetry/1 message per node per interval.

Each tick samples every source in its own thread with a deadline (NVML is known to hang on
a bad GPU; a hang must not stop the agent, and is itself reported in `agent.source_errors`),
merges the partial bodies, writes the message to the on-disk spool, and lets the forwarder
move the spool to Kafka. `seq` is persisted in the spool so it keeps increasing across
restarts, which lets consumers drop the duplicates that at-least-once delivery can make.
`agent.instance` names the spool that numbers them: a new spool starts a new sequence.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import Counter, Gauge

from fleetwatch import __version__, schemas, topics
from fleetwatch.collectors.forwarder import REFUSED, SpoolForwarder
from fleetwatch.collectors.sources import SOURCE_NAMES, Source, make_source
from fleetwatch.collectors.spool import BOUND, DROP_REASONS, Spool
from fleetwatch.runtime import StopFlag, serve_metrics

log = logging.getLogger(__name__)

SAMPLES = Counter("fleetwatch_agent_samples_total", "telemetry samples taken by this agent")
SOURCE_ERRORS = Counter(
    "fleetwatch_agent_source_errors_total", "collector calls that failed or timed out", ["source", "reason"]
)
SPOOL_DEPTH = Gauge("fleetwatch_agent_spool_records", "samples waiting in the on-disk spool")
SPOOL_DROPPED = Counter(
    "fleetwatch_agent_spool_dropped_total",
    "samples dropped from the spool: over its bound (bound), the disk full or failing a write "
    "(disk_full), the spool file refusing writes (spool_error), Kafka refusing the record for its "
    "size (refused)",
    ["reason"],
)
for _reason in (*DROP_REASONS, REFUSED):  # every reason's series exists from the start, at 0
    SPOOL_DROPPED.labels(_reason)
# a sample's encoded bytes at most: under librdkafka's default message.max.bytes (1,000,000), which
# refuses a larger record at produce(), and the pipeline's 1 MiB (MAX_MESSAGE_BYTES)
MAX_SAMPLE_BYTES = 900_000
BROKER_UP = Gauge("fleetwatch_agent_broker_up", "1 if the last delivery attempt reached Kafka")
SENT = Counter("fleetwatch_agent_sent_total", "samples acknowledged by Kafka")


class _StartFailed(Exception):
    """The source could not be made (a missing driver or device): reported, retried later."""


class SourceRunner:
    """Calls one source's sample() in a dedicated thread so a hung call cannot block the agent.

    The source is made in that thread too (NVML's init and per-GPU setup can hang as its sample
    can), under the same deadline. A call that returns after its deadline is not lost: its result
    is the next tick's, in place of a new call (a stateful source has already drained what it read:
    NVML's XID events, the kernel log's records), and `on_return` tells the agent when it comes, so
    that the next tick is then (Agent.run), dated when the values were read, not up to an interval
    later (a rate over a wrong step)."""

    def __init__(self, name: str, factory: Any, reinit_every_s: float = 60.0) -> None:
        self.name = name
        self._factory = factory
        self._reinit_every_s = reinit_every_s
        self._source: Source | None = None
        self._init_error: str | None = None
        self._next_init = 0.0
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"src-{name}")
        self._pending: Future[dict[str, Any]] | None = None
        self._collected = True  # whether the pending call's result was taken
        self.on_return: Callable[[], None] | None = None  # called (its thread) as each call ends

    def _call(self) -> dict[str, Any]:
        """In the runner's thread: the source, made first where it is not yet, then its sample."""
        if self._source is None:
            try:
                self._source = self._factory()
                self._init_error = None
            except Exception as e:  # a missing driver or device is reported, not fatal
                self._init_error = f"unavailable: {type(e).__name__}: {e}"[:200]
                self._next_init = time.monotonic() + self._reinit_every_s
                log.warning(
                    "source %s %s (retrying in %.0f s)", self.name, self._init_error, self._reinit_every_s
                )
                raise _StartFailed(self._init_error) from None
        return self._source.sample()

    def start(self) -> str | None:
        """Kick off a sample; returns an error string instead if none can start."""
        if self._pending is not None and not self._pending.done():
            if self._source is None:
                return "hung: the source's start has not returned"
            return "hung: previous call has not returned"
        if self._pending is not None and not self._collected:
            return None  # it returned after its deadline: its result is this tick's
        if self._source is None and time.monotonic() < self._next_init:
            return self._init_error or "unavailable"
        try:
            self._pending = self._pool.submit(self._call)
        except RuntimeError as e:  # no thread to be had (a thread, process or memory limit)
            # the refused call may sit in the pool's queue: drop that pool, a fresh one next time
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"src-{self.name}")
            self._pending = None
            return f"error: {type(e).__name__}: {e}"[:200]
        self._collected = False
        if self.on_return is not None:
            notify = self.on_return
            self._pending.add_done_callback(lambda _f: notify())
        return None

    def late_ready(self) -> bool:
        """A call that returned after its tick's deadline waits to be taken, with a result (one
        that failed late is reported at the next regular tick: nothing to date)."""
        p = self._pending
        return p is not None and not self._collected and p.done() and p.exception() is None

    def result(self, timeout_s: float) -> tuple[dict[str, Any] | None, str | None]:
        if self._pending is None:
            return None, "not started"
        try:
            part = self._pending.result(timeout=max(0.0, timeout_s))
        except FutureTimeout:
            return None, "timeout"  # not collected: if it returns, the next tick takes it
        except _StartFailed as e:
            self._collected = True
            return None, str(e)
        except Exception as e:
            self._collected = True
            return None, f"error: {type(e).__name__}: {e}"[:200]
        self._collected = True
        return part, None

    def close(self) -> None:
        if self._source is not None and (self._pending is None or self._pending.done()):
            try:
                self._source.close()
            except Exception:
                log.debug("error closing source %s", self.name, exc_info=True)
        self._pool.shutdown(wait=False, cancel_futures=True)


@dataclass
class Agent:
    node: str
    runners: list[SourceRunner]
    spool: Spool
    forwarder: SpoolForwarder
    interval_s: float = 1.0
    call_timeout_s: float = 5.0
    seq: int = field(init=False)

    def __post_init__(self) -> None:
        self.seq = self.spool.get_meta("next_seq", 0)
        # sources' positions (the kernel log's cursor) reached by the sample being built: stored
        # with that sample, in the same spool transaction (collectors/sources.py)
        self._cursors: dict[str, int | str] = {}
        self._sample_cursors: dict[str, int | str] = {}  # the cursors of the sample being built
        self._returned = threading.Event()  # a source's call ended (set from its runner's thread)
        self._next_at = 0.0  # when the next regular tick is due (monotonic), for _late_result
        for r in self.runners:
            r.on_return = self._returned.set

    def sample(self) -> dict[str, Any]:
        """One telemetry/1 message from all sources (partial when some fail). A source whose part
        is out of contract, or so large that the message would be, is left out of it and says so in
        `agent.source_errors`; the other sources' parts stay (one odd value on one GPU used to blank
        the whole node's sample, every second it lasted)."""
        return self._build()[0]

    def _build(self) -> tuple[dict[str, Any], bytes | None, str]:
        """The sample, its encoding once validated (None where its parts fit one by one but not
        together), and why not."""
        ts = time.time()
        errors: dict[str, str] = {}
        started = []
        for r in self.runners:
            err = r.start()
            if err is None:
                started.append(r)
            else:
                errors[r.name] = err
        deadline = time.monotonic() + self.call_timeout_s
        msg: dict[str, Any] = {"schema": schemas.TELEMETRY, "node": self.node, "ts": ts, "seq": self.seq}
        parts: dict[str, tuple[dict[str, Any], dict[str, int | str]]] = {}
        for r in started:
            part, err = r.result(deadline - time.monotonic())
            if err is not None:
                errors[r.name] = err
            elif part:
                cursor = part.pop("_cursor", None)
                # (a journal's cursor is a str)
                kept = (
                    {k: v for k, v in cursor.items() if isinstance(v, int | str)}
                    if isinstance(cursor, dict)
                    else {}
                )
                parts[r.name] = (part, kept)
        value, why = self._fit(msg, parts, errors)
        # the cursors of the parts the sample carries, stored with it once it is spooled (tick)
        self._sample_cursors = {k: v for _part, cursor in parts.values() for k, v in cursor.items()}
        for name, err in errors.items():
            SOURCE_ERRORS.labels(name, err.split(":", 1)[0]).inc()
        self.seq += 1
        return self._assemble(msg, parts, errors), value, why

    def _fit(
        self, msg: dict[str, Any], parts: dict[str, tuple[dict[str, Any], Any]], errors: dict[str, str]
    ) -> tuple[bytes | None, str]:
        """Leave out of `parts` what cannot go in the sample: a part out of contract on its own
        (checked one by one where the whole does not validate, or where a part overrides another's
        fields), then the largest while the sample is over MAX_SAMPLE_BYTES. The sample's encoding
        (validated once, as it is spooled), or None and why."""
        value, why = self._valid(msg, parts, errors)
        keys = [k for part, _cursor in parts.values() for k in part]
        if value is None or len(keys) != len(set(keys)):
            for name, (part, _cursor) in list(parts.items()):
                unfit = self._unfit(msg, part)
                if unfit is not None:
                    log.error("leaving the %s source's part out of the sample: %s", name, unfit)
                    errors[name] = unfit
                    del parts[name]  # and its cursor: what it read was not kept
            value, why = self._valid(msg, parts, errors)
        size = len(value) if value is not None else len(schemas.encode(self._assemble(msg, parts, errors)))
        while parts and size > MAX_SAMPLE_BYTES:
            name = max(parts, key=lambda n: len(schemas.encode(parts[n][0])))
            errors[name] = f"too large: {len(schemas.encode(parts[name][0]))} bytes left out"
            log.error("leaving the %s source's part out of the sample: %s", name, errors[name])
            del parts[name]
            value, why = self._valid(msg, parts, errors)
            size = (
                len(value) if value is not None else len(schemas.encode(self._assemble(msg, parts, errors)))
            )
        return value, why

    def _valid(
        self, msg: dict[str, Any], parts: dict[str, tuple[dict[str, Any], Any]], errors: dict[str, str]
    ) -> tuple[bytes | None, str]:
        """The sample these parts make, validated and encoded; or None and why."""
        try:
            return schemas.encode(schemas.validate(self._assemble(msg, parts, errors), schemas.TELEMETRY)), ""
        except schemas.MessageError as e:
            return None, str(e)
        except (TypeError, ValueError) as e:  # what the encoder refuses (a lone surrogate)
            return None, f"cannot encode: {e}"

    def _assemble(
        self, msg: dict[str, Any], parts: dict[str, tuple[dict[str, Any], Any]], errors: dict[str, str]
    ) -> dict[str, Any]:
        out: dict[str, Any] = {**msg, "gpus": []}
        for part, _cursor in parts.values():
            out.update(part)
        # an error text longer than the contract allows would make the whole sample invalid
        errs = {k: v[: schemas.MAX_ERROR_LEN] for k, v in errors.items()}
        out["agent"] = {"version": __version__, "instance": self.spool.instance, "source_errors": errs}
        return out

    def _unfit(self, msg: dict[str, Any], part: dict[str, Any]) -> str | None:
        """Why one source's part cannot go in a sample (None: it can), checked on its own."""
        value, why = self._valid(msg, {"": (part, None)}, {})
        return None if value is not None else f"invalid: {why}"[:200]

    def tick(self) -> dict[str, Any]:
        msg, value, why = self._build()
        if value is not None:
            self._cursors.update(self._sample_cursors)  # only what this sample carries
        else:
            # The parts fit one by one but not together: keep the sample's skeleton and say so.
            log.error("dropping invalid fields from sample: %s", why)
            bad = {k: msg[k] for k in ("schema", "node", "ts", "seq")}
            bad.update(
                gpus=[],
                agent={
                    "version": __version__,
                    "instance": self.spool.instance,
                    "source_errors": {"agent": f"invalid: {why}"[:200]},
                },
            )
            value = schemas.encode(bad)
        # next_seq goes in the sample's own transaction: a seq is persisted only with its sample,
        # so a restart never reuses the seq of a sample that was spooled (and maybe sent).
        drops = self.spool.append(self.node.encode(), value, meta={"next_seq": self.seq, **self._cursors})
        for reason, n in drops.items():
            SPOOL_DROPPED.labels(reason).inc(n)
        if drops.get(BOUND):  # a full disk or a failing spool is logged by the spool, once
            log.warning(
                "spool over its %d-byte bound: dropped the %d oldest samples",
                self.spool.max_bytes,
                drops[BOUND],
            )
        SAMPLES.inc()
        return msg

    def run(self, stop: StopFlag, count: int | None = None) -> int:
        """Sample at a fixed rate until stopped (or `count` samples); returns samples taken."""
        taken = 0
        next_at = time.monotonic()
        while not stop and (count is None or taken < count):
            early = time.monotonic() < next_at  # for a late call's result: the regular tick still comes
            self.tick()
            self._returned.clear()  # the calls this tick took ended; a late one is seen by late_ready
            taken += 1
            if not early:
                next_at += self.interval_s
                now = time.monotonic()
                if next_at < now:  # fell behind (e.g. a slow source): skip missed ticks, keep the cadence
                    next_at = now
            self._next_at = next_at
            sent_before, refused_before = self.forwarder.sent_total, self.forwarder.refused_total
            # cut short when a late result waits: a backlog to send must not date it later
            self.forwarder.pump(max(0.0, next_at - time.monotonic() - 0.01), until=self._late_result)
            SENT.inc(self.forwarder.sent_total - sent_before)
            SPOOL_DROPPED.labels(REFUSED).inc(self.forwarder.refused_total - refused_before)
            SPOOL_DEPTH.set(len(self.spool))
            BROKER_UP.set(1 if self.forwarder.broker_up else 0)
            if count is not None and taken >= count:
                break
            self._wait(stop)
        return taken

    def _late_result(self) -> bool:
        """A call that missed its tick's deadline has returned, and the next regular tick is at
        least half an interval away (closer, that tick takes it: two samples a few ms apart would
        make a counter's rate over a step too short to mean anything)."""
        return any(r.late_ready() for r in self.runners) and self._next_at - time.monotonic() >= (
            0.5 * self.interval_s
        )

    def _wait(self, stop: StopFlag) -> None:
        """Until the next tick is due, or at once when a call that missed its tick's deadline
        returns (_late_result): the tick then takes its result, dated when it came (its values
        were read by then), not at the next regular tick, up to an interval later; the regular
        tick still comes at its time."""
        while not stop and not self._late_result():
            left = self._next_at - time.monotonic()
            if left <= 0:
                return
            if self._returned.wait(min(0.1, left)):  # (a stop is seen within 0.1 s)
                self._returned.clear()

    def close(self, drain_timeout_s: float = 10.0) -> None:
        if not self.forwarder.drain(drain_timeout_s):
            log.warning(
                "%d samples left in the spool %s; they are sent on the next start",
                len(self.spool),
                self.spool.path,
            )
        self.forwarder.close()
        for r in self.runners:
            r.close()
        self.spool.close()


def source_options(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Each source's constructor arguments from the command line (and the config file's
    `[collect]` section, which fills the same flags): {source name: kwargs}. A source absent here
    is built with its defaults."""
    options: dict[str, dict[str, Any]] = {}
    if kernel := _kernel_options(args):
        options["kernel"] = kernel
    options["dcgm"] = _dcgm_options(args)
    if host := _host_options(args):
        options["host"] = host
    options["net"] = {
        "include_virtual": bool(getattr(args, "net_virtual", False)),
        "skip_prefixes": tuple(getattr(args, "net_skip", None) or ()),
    }
    return options


def _host_options(args: argparse.Namespace) -> dict[str, Any]:
    """The host source's node checks: the mounts and block devices this node must have (--mount,
    --blockdev) and how mounts are probed; none configured, no options. sample() waits for the
    mount probes it started at most 0.2 s, and never more than a quarter of the time the agent
    gives the whole call: a probe that takes longer is judged at the next samples."""
    from fleetwatch.collectors.blockdevs import MAX_NAMED, check_blockdev_name
    from fleetwatch.collectors.mounts import MAX_MOUNTS, check_probe_dir, parse_mount_spec

    mounts = list({s.path: s for s in map(parse_mount_spec, getattr(args, "mount", None) or [])}.values())
    blockdevs = [check_blockdev_name(n) for n in getattr(args, "blockdev", None) or []]
    if len(mounts) > MAX_MOUNTS or len(set(blockdevs) - {"all"}) > MAX_NAMED:
        raise ValueError(f"at most {MAX_MOUNTS} mounts and {MAX_NAMED} block devices can be checked")
    if not mounts and not blockdevs:
        return {}
    budget = min(getattr(args, "interval", 1.0), getattr(args, "call_timeout", 5.0))
    return {
        "mounts": mounts,
        "blockdevs": blockdevs,
        "mount_deadline_s": getattr(args, "mount_deadline", 10.0),
        "mount_interval_s": getattr(args, "mount_interval", 10.0),
        "mount_wait_s": min(0.2, 0.25 * budget),
        "mount_probe": getattr(args, "mount_probe", "write"),
        "mount_probe_dir": check_probe_dir(getattr(args, "mount_probe_dir", ".fleetwatch-probe")),
    }


def _kernel_options(args: argparse.Namespace) -> dict[str, Any]:
    """The kernel source's reader: /dev/kmsg (the default: no options), or the journal through
    journalctl with the site's own arguments (`--kernel-log journal --journal-args '--directory
    /var/log/journal'`)."""
    reader = getattr(args, "kernel_log", None) or "kmsg"
    journal_args = shlex.split(getattr(args, "journal_args", None) or "")
    if reader == "kmsg":
        if journal_args:
            raise ValueError("--journal-args is for --kernel-log journal")
        return {}
    return {"reader": reader, "journal_args": journal_args}


def _dcgm_options(args: argparse.Namespace) -> dict[str, Any]:
    """The dcgm source's endpoint and which of its series are this node's (`--node`; None: the
    source takes this host's short name, as `run` does)."""
    from fleetwatch.collectors.dcgm_exporter import DEFAULT_TIMEOUT_S, DEFAULT_URL

    return {
        "url": getattr(args, "dcgm_url", None) or DEFAULT_URL,
        "timeout_s": getattr(args, "dcgm_timeout", None) or DEFAULT_TIMEOUT_S,
        "node": getattr(args, "node", None),
        "any_host": bool(getattr(args, "dcgm_any_host", False)),
    }


def source_factory(name: str, spool: Spool, options: dict[str, Any] | None = None) -> Callable[[], Source]:
    """How the runner builds (and rebuilds) a source, with `options` (source_options) as its
    constructor's arguments; the kernel log's from the cursor in the spool, read at each build, so
    a source rebuilt after a failure goes on from what was spooled."""
    kwargs = dict(options or {})
    if name == "kernel":
        from fleetwatch.collectors.kernel_log.kmsg import Cursor

        def kernel() -> Source:
            if kwargs.get("reader") == "journal":  # the journal's cursor, a string
                return make_source(name, journal_cursor=spool.get_meta_text("journal_cursor"), **kwargs)
            boot = spool.get_meta("kmsg_boot", -1)
            cursor = Cursor(boot, spool.get_meta("kmsg_seq", -1)) if boot >= 0 else None
            return make_source(name, cursor=cursor, **kwargs)

        return kernel
    return lambda: make_source(name, **kwargs)


def default_spool_dir() -> Path:
    return Path.home() / ".cache" / "fleetwatch" / "agent"


def run(args: argparse.Namespace) -> int:
    node = args.node or socket.gethostname().split(".")[0]
    if not schemas.NAME_RE.match(node):
        raise ValueError(f"node name {node!r} is not valid ({schemas.NAME_RE.pattern}); pass --node")
    names = [s.strip() for s in args.source.split(",") if s.strip()]
    for name in names:
        if name not in SOURCE_NAMES:
            raise ValueError(f"unknown source {name!r} (choose from {','.join(SOURCE_NAMES)})")
    spool_dir = Path(args.spool_dir) if args.spool_dir else default_spool_dir()
    spool = Spool(spool_dir / f"{node}.sqlite", max_bytes=int(args.spool_max_mib * 2**20))
    serve_metrics(args.metrics_port, args.metrics_addr)
    options = source_options(args)
    runners = [SourceRunner(n, source_factory(n, spool, options.get(n))) for n in names]
    agent = Agent(
        node=node,
        runners=runners,
        spool=spool,
        forwarder=SpoolForwarder(spool, topics.TELEMETRY, args.bootstrap),
        interval_s=args.interval,
        call_timeout_s=min(args.call_timeout, args.interval),
    )
    log.info(
        "collecting %s on %s every %.2f s into %s (spool %s)",
        names,
        node,
        args.interval,
        args.bootstrap,
        spool.path,
    )
    stop = StopFlag()
    taken = 0
    try:
        taken = agent.run(stop, args.count)
    finally:
        dropped = spool.dropped_total
        agent.close()
        log.info(
            "stopped after %d samples (%d sent, %d dropped over this spool's life)",
            taken,
            agent.forwarder.sent_total,
            dropped,
        )
    return 0
