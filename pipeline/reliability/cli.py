"""`fleetwatch account` (the accounting stage) and `fleetwatch report` (the report from its store)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import orjson

from fleetwatch import census, signing, topics
from fleetwatch.bus.kafka import KafkaBus
from fleetwatch.pipeline.reliability import render, report
from fleetwatch.pipeline.reliability.args import window_config
from fleetwatch.pipeline.reliability.ingest import Ingest, IngestConfig
from fleetwatch.pipeline.reliability.stage import (
    DEADLETTER_FLUSH_S,
    Accounting,
    LiveFigures,
    StageTopics,
    run_loop,
)
from fleetwatch.pipeline.reliability.store import Store, StoreError
from fleetwatch.runtime import StopFlag, serve_metrics

log = logging.getLogger(__name__)
DRAIN_KEY_ENV = "FLEETWATCH_DRAIN_KEY"  # alerts/drain_request.py's; the pipeline does not import alerts


def report_command(args: argparse.Namespace) -> int:
    until = args.until
    since = args.since if args.since is not None else until - 28 * 86400
    if since >= until:
        print("fleetwatch report: --since must be before --until", file=sys.stderr)
        return 2
    if not Path(args.db).is_file():
        print(
            f"fleetwatch report: no accounting store at {args.db} (run `fleetwatch account`)", file=sys.stderr
        )
        return 2
    try:
        store = Store(args.db, create=False)
    except StoreError as e:
        print(f"fleetwatch report: {e}", file=sys.stderr)
        return 2
    window, cfg = window_config(args)
    try:
        with _progress(until - since > 7 * 86400 and not args.json) as step:
            with store.reading():
                r = report.build(store, since, until, window, cfg, step)
            if args.out:
                step("writing the report")
                paths = render.write(r, Path(args.out))
    finally:
        store.close()
    if args.json:
        sys.stdout.buffer.write(
            orjson.dumps(r, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY) + b"\n"
        )
    elif args.out:
        print(f"wrote {paths['markdown']} and {paths['html']}")
    else:
        print(render.markdown(r, {name: f"(plot {name}: use --out DIR)" for name, _, _ in render.PLOTS}))
    return 0


class _progress:
    """A progress bar on stderr for long ranges (rich; nothing when stderr is not a terminal)."""

    STEPS = 6

    def __init__(self, show: bool) -> None:
        self.show = show and sys.stderr.isatty()

    def __enter__(self):  # type: ignore[no-untyped-def]
        if not self.show:
            return lambda _what: None
        from rich.console import Console
        from rich.progress import Progress

        # rich's default console is stdout, which is the report's (or a pipe's) own
        self._bar = Progress(console=Console(stderr=True), transient=True)
        self._bar.start()
        task = self._bar.add_task("report", total=self.STEPS)

        def step(what: str) -> None:
            self._bar.update(task, advance=1, description=what)

        return step

    def __exit__(self, *exc: object) -> None:
        if self.show:
            self._bar.stop()


def account_command(args: argparse.Namespace) -> int:
    try:
        store = Store(args.db)
    except StoreError as e:
        print(f"fleetwatch account: {e}", file=sys.stderr)
        return 2
    census_key = census.load_key(args.census_key_file)
    drain_key = _drain_key(args.drain_key_file)
    if drain_key is None:
        log.warning(
            "no drain key: drain results and Slurm's node view are not read; the report shows no drained time"
        )
    bus = KafkaBus(args.bootstrap)
    bus.wait_for_broker(30)
    names = StageTopics(
        args.jobs_topic,
        args.steps_topic,
        args.findings_topic,
        args.results_topic,
        args.nodes_topic,
        args.slurm_nodes_topic,
    )
    bus.ensure_topics([*names.all(), topics.DEADLETTER])
    serve_metrics(args.metrics_port, args.metrics_addr)
    # dead letters given up on within a batch's wait for them (stage.DEADLETTER_FLUSH_S): one not
    # acknowledged then is not delivered later beside the copy the batch's next reading sends
    producer = bus.producer(delivery_timeout_s=DEADLETTER_FLUSH_S)
    window, cfg = window_config(args)
    accounting = Accounting(
        store,
        Ingest(store, IngestConfig(gpus_per_node=args.gpus_per_node)),
        census_key,
        drain_key,
        producer,
        names,
    )
    live = LiveFigures(args.db, args.live_window, args.refresh_every, window, cfg)
    live.start()
    stop = StopFlag()
    log.info(
        "account up: store %s, live figures over %.0f days every %.0f s",
        args.db,
        args.live_window / 86400,
        args.refresh_every,
    )
    try:
        run_loop(bus, accounting, stop, idle_exit_s=args.idle_exit)
    finally:
        live.stop()
        producer.close(10)
        store.close()
    return 0


def _drain_key(key_file: str | None) -> bytes | None:
    """The drain key (alerts/drain_request.py's: the file, else $FLEETWATCH_DRAIN_KEY), or None
    where neither is given: the stage then reads no drain results."""
    if key_file is None and not os.environ.get(DRAIN_KEY_ENV, "").strip():
        return None
    return signing.load_key("drain", DRAIN_KEY_ENV, key_file, os.environ)
