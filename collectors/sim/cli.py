"""`fleetwatch simulate`: drive the simulation core into Kafka, paced against the wall clock.

speed = simulated seconds per wall second (1 = real time; 0 = as fast as the producer takes it).
Simulated time starts at the wall clock ("now"), so live consumers see current timestamps.
SIGTERM/SIGINT stop between ticks; the producer is flushed before exit either way.
"""

from __future__ import annotations

import argparse
import logging
import time

from prometheus_client import Counter, Gauge

from fleetwatch import schemas
from fleetwatch.bus import SendError
from fleetwatch.bus.kafka import KafkaBus
from fleetwatch.collectors.sim.scenario import load_scenario
from fleetwatch.collectors.sim.simulation import Simulation
from fleetwatch.runtime import StopFlag, serve_metrics

log = logging.getLogger("fleetwatch.simulate")

PROGRESS_EVERY_S = 10.0  # wall seconds between progress lines

SENT = Counter("fleetwatch_sim_messages_total", "messages the simulator produced", ["topic"])
TICK = Gauge("fleetwatch_sim_tick", "the last simulated tick sent")
FAULTS_ACTIVE = Gauge("fleetwatch_sim_faults_active", "injected faults active now")


def live_epoch(now: float, duration_s: float, speed: float) -> float:
    """The simulated start for a run that begins now: early enough that no tick is stamped after
    the wall time it is sent at (tick k goes out at wall0 + k*dt/speed). Faster than real time,
    the simulation would otherwise run ahead of every clock, and a detector refuses samples from
    the future (fleetwatch.schemas.ClockLimits); slower than real time it trails the wall clock."""
    if speed == 0:  # flat out: all of it as fast as the broker takes it
        return now - duration_s
    return now - duration_s * max(0.0, 1.0 - 1.0 / speed)


def run(args: argparse.Namespace) -> int:
    overrides = {"nodes": args.nodes, "gpus": args.gpus, "seed": args.seed, "duration": args.duration}
    scenario = load_scenario(args.scenario, overrides)  # ValueError/FileNotFoundError: cli.main reports
    speed = float(args.speed)
    stop = StopFlag()

    serve_metrics(args.metrics_port, args.metrics_addr)
    bus = KafkaBus(args.bootstrap)
    bus.wait_for_broker()  # BrokerUnavailable: cli.main reports it
    bus.ensure_topics()
    producer = bus.producer(linger_ms=5)

    epoch = args.epoch if args.epoch is not None else live_epoch(time.time(), scenario.duration_s, speed)
    sim = Simulation(scenario, epoch=epoch)
    log.info(
        "simulating %s: %d nodes x %d GPUs, %d ticks of %.3g s, %d faults planned, speed %s",
        scenario.name,
        scenario.nodes,
        scenario.gpus_per_node,
        sim.n_ticks,
        sim.dt,
        len(sim.faults),
        "flat out" if speed == 0 else f"{speed:g}x",
    )

    errors: list[str] = []
    sent = 0
    ticks_sent = 0
    wall0 = time.monotonic()
    last_log = wall0
    try:
        for messages in sim.ticks():
            k = sim.k - 1
            if speed > 0:
                # Send tick k at wall0 + k*dt/speed; sleeping on the stop flag keeps SIGTERM prompt.
                delay = wall0 + k * sim.dt / speed - time.monotonic()
                if delay > 0 and stop.wait(delay):
                    break
            if stop:
                break
            for topic, key, msg in messages:
                producer.send(topic, key=key.encode(), value=schemas.encode(msg))
                SENT.labels(topic).inc()
            sent += len(messages)
            ticks_sent += 1
            TICK.set(k)
            FAULTS_ACTIVE.set(sum(f.status == "active" for f in sim.faults))
            now = time.monotonic()
            if now - last_log >= PROGRESS_EVERY_S:
                last_log = now
                active = sum(f.status == "active" for f in sim.faults)
                log.info("tick %d/%d: %d messages sent, %d faults active", k + 1, sim.n_ticks, sent, active)
    except SendError as e:
        errors.append(str(e))
        log.error("producer error: %s", e)
    finally:
        errors += [f"to {item.topic}: not acknowledged by the broker" for item in producer.flush(30)]
        producer.close(10)

    log.info(
        "%s after %d/%d ticks: %d messages in %.1f s",
        "stopped" if stop else "done",
        ticks_sent,
        sim.n_ticks,
        sent,
        time.monotonic() - wall0,
    )
    if errors:
        log.error("%d messages were not delivered (first: %s)", len(errors), errors[0])
        return 1
    return 0
