"""The clock-free simulation core: one call per sample interval, no Kafka, no sleeping.

    sim = Simulation(load_scenario(None))
    for messages in sim.ticks():          # one list per tick
        for topic, key, msg in messages:  # fleetwatch.topics name, Kafka key, message dict
            ...

Within a tick the order is: truth (faults that start or end now), job/1, telemetry/1 (one per
reporting node, `seq` = tick index, so a gap in seq is a missed sample), step/1 (by completion
time). Message timestamps are `epoch + simulated seconds`; the same scenario, seed and epoch give
byte-identical messages.

Random streams are independent per concern (healthy noise, scheduler, background faults, each
fault's own), all derived from the scenario seed, so e.g. adding an explicit fault does not change
the healthy noise of every other node.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from fleetwatch import schemas, topics
from fleetwatch.collectors.sim import background
from fleetwatch.collectors.sim.cluster import ClusterState
from fleetwatch.collectors.sim.faults import ACTIVE, ENDED, PENDING, Fault, make_fault, tick_of
from fleetwatch.collectors.sim.jobs import Message, Scheduler
from fleetwatch.collectors.sim.scenario import DEFAULT_EPOCH, Scenario
from fleetwatch.runtime import gc_paused


class Simulation:
    def __init__(self, scenario: Scenario, *, epoch: float | None = None) -> None:
        """epoch: unix time of simulated second 0; default the scenario's, else DEFAULT_EPOCH.
        A live driver passes time.time() so that timestamps track the wall clock."""
        sc = scenario
        self.scenario = sc
        if epoch is None:
            epoch = sc.epoch if sc.epoch is not None else DEFAULT_EPOCH
        self.epoch = float(epoch)
        self.dt = sc.interval_s
        self.n_ticks = sc.n_ticks
        self.k = 0  # next tick to run

        root = np.random.SeedSequence(sc.seed)
        noise_ss, sched_ss, bg_ss, self._fault_ss = root.spawn(4)
        self.state = ClusterState(sc, np.random.default_rng(noise_ss))
        self.scheduler = Scheduler(sc, np.random.default_rng(sched_ss), self.epoch, self.state.names)
        self._bg_rng = np.random.default_rng(bg_ss)
        self.tag = self.scheduler.tag  # per-run tag in job names and truth ids
        self.faults: list[Fault] = []
        for spec in [*sc.faults, *background.draw(sc, self._bg_rng)]:
            self._add_fault(spec)
        self.cordoned = np.zeros(sc.nodes, bool)

    # ------------------------------------------------------------ public API

    @property
    def done(self) -> bool:
        return self.k >= self.n_ticks

    def tick_ts(self, k: int) -> float:
        """Timestamp of tick k (also the ts of its telemetry)."""
        return round(self.epoch + k * self.dt, 6)

    @property
    def nodes(self) -> list[str]:
        return self.state.names

    def cordon(self, node: str | int, on: bool = True) -> None:
        """Keep the scheduler from placing new jobs on a node (e.g. when a detector drained it);
        running jobs continue. on=False resumes it."""
        i = node if isinstance(node, int) else self.state.names.index(node)
        self.cordoned[i] = on

    def ticks(self) -> Iterator[list[Message]]:
        """The messages of each remaining tick. The simulation is single-pass: state advances."""
        while not self.done:
            yield self.step()

    def run(self) -> Iterator[Message]:
        """Every remaining message, flattened."""
        for messages in self.ticks():
            yield from messages

    def step(self) -> list[Message]:
        """Run one tick and return its messages."""
        if self.done:
            raise RuntimeError("the simulation has finished; it runs once")
        # A tick allocates ~10^5 acyclic dicts at 1024 nodes; the cyclic collector scanning them
        # again and again cost ~40% of the tick, so it is paused for the tick (and only that).
        with gc_paused():
            return self._step()

    def _step(self) -> list[Message]:
        k, st, sched = self.k, self.state, self.scheduler
        t = k * self.dt
        ts = self.tick_ts(k)
        st.begin_tick()

        truth = self._faults_tick(k, ts)
        job_msgs, step_msgs = sched.tick(
            t, st.fail_requests, st.unavailable() | self.cordoned, st.node_slowdown()
        )
        for job in sched.started:
            spec = background.straggler_for_job(self.scenario, self._bg_rng, job.nodes, t + self.dt)
            if spec is not None:
                fault = self._add_fault(spec)
                fault.bound_job = job.name

        st.evolve(self.dt, sched.phase, sched.pace)
        telemetry = [(topics.TELEMETRY, node, msg) for node, msg in st.telemetry(ts, k)]
        self.k += 1
        return truth + job_msgs + telemetry + step_msgs

    # ------------------------------------------------------------ faults and truth

    def _add_fault(self, spec: Any) -> Fault:
        rng = np.random.default_rng(self._fault_ss.spawn(1)[0])
        fault = make_fault(f"{self.tag}-f{len(self.faults):04d}", spec, self.dt, rng)
        self.faults.append(fault)
        return fault

    def _faults_tick(self, k: int, ts: float) -> list[Message]:
        st, sched = self.state, self.scheduler
        out: list[Message] = []
        for f in self.faults:
            if f.status == ENDED:
                continue
            began = False
            if f.status == PENDING:
                if f.onset_k > k:
                    continue
                f.status = ACTIVE
                f.onset_ts = ts
                f.job = sched.job_name_of(f.node) if f.kind.category == "straggler" else None
                f.begin(st, k)
                began = True
            ended = (f.end_k is not None and k >= f.end_k) or (
                f.bound_job is not None and not sched.is_running(f.bound_job)
            )
            if ended:
                f.finish(st, k)
                f.status = ENDED
                out.append(self._truth(f, end_ts=ts))
                continue
            f.apply(st, k)
            if began:
                out.append(self._truth(f))
        return out

    def _truth(self, f: Fault, end_ts: float | None = None) -> Message:
        name = self.state.names[f.node]
        msg: dict[str, Any] = {
            "schema": schemas.TRUTH,
            "node": name,
            "fault": f.kind.name,
            "onset_ts": f.onset_ts,
            "id": f.id,
            "category": f.kind.category,
            "finding": f.kind.finding,
            "hardware": f.kind.hardware,
            "source": f.spec.source,
        }
        if f.gpu is not None:
            msg["gpu"] = f.gpu
        if end_ts is not None:
            msg["end_ts"] = end_ts
        if f.failure_k is not None:
            msg["failure_ts"] = self.tick_ts(f.failure_k)
        msg.update(f.truth_extra())
        return (topics.TRUTH, name, msg)


__all__ = ["Message", "Simulation", "tick_of"]
