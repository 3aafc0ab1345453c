"""A small batch scheduler and synchronous data-parallel training jobs: job/1 and step/1 messages.

Jobs take 2-16 whole nodes (lowest-numbered free nodes first, as Slurm packs them), start up,
train, checkpoint now and then, and finish or fail. One rank per node. Training is synchronous:
every rank's iteration lasts as long as the slowest rank's compute, so in step/1 `step_time_s`
is a rank's OWN compute time and `wait_time_s` the time it then waited for its peers (their sum
is the iteration time, the same for all ranks). A detector comparing peers by step_time_s finds
the straggler; one comparing iteration times cannot tell it from the ranks that wait for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fleetwatch import schemas, topics
from fleetwatch.collectors.sim.cluster import CHECKPOINT, IDLE, STARTUP, TRAIN
from fleetwatch.collectors.sim.scenario import Scenario

Message = tuple[str, str, dict[str, Any]]

JOB_NOISE = 0.02  # step-to-step variation shared by all ranks (batch content, allreduce size)
RANK_NOISE = 0.01  # per rank per step


@dataclass
class Job:
    name: str
    nodes: np.ndarray  # node indices in rank order
    start_s: float
    end_s: float  # planned finish
    step_s: float  # nominal iteration time
    train_at_s: float  # first step starts here (after startup)
    next_heartbeat_s: float
    next_ckpt_s: float  # inf: no checkpoints
    ckpt_until_s: float = -1.0
    step: int = 0
    step_done_s: float | None = None  # completion time of the step in flight
    compute: np.ndarray = field(default_factory=lambda: np.zeros(0))


class Scheduler:
    def __init__(self, sc: Scenario, rng: np.random.Generator, epoch: float, names: list[str]) -> None:
        self.cfg = sc.jobs
        self.rng = rng
        self.epoch = epoch
        self.names = names
        n = sc.nodes
        self.node_job = np.full(n, -1, np.int64)  # job id per node, -1 idle
        self.free_at = np.zeros(n)  # epilog/cleanup: a freed node takes no job before this
        self.jobs: dict[int, Job] = {}
        self._next_id = 1
        self.tag = f"{int(epoch) & 0xFFFFFFFF:08x}"  # job names differ between runs started at other times
        self._reserve = int(np.floor(self.cfg.idle_fraction * n))
        self.phase = np.zeros(n, np.int8)
        self.pace = np.ones(n)
        self.started: list[Job] = []  # jobs started in the last tick

    # ------------------------------------------------------------ queries

    def job_name_of(self, node: int) -> str | None:
        jid = int(self.node_job[node])
        return self.jobs[jid].name if jid >= 0 else None

    def is_running(self, name: str) -> bool:
        return any(j.name == name for j in self.jobs.values())

    # ------------------------------------------------------------ one tick

    def tick(
        self, t: float, failing: set[int], unavailable: np.ndarray, slow: np.ndarray
    ) -> tuple[list[Message], list[Message]]:
        """Advance to time t. failing: nodes whose job fails now; unavailable: nodes that cannot take
        a new job; slow: (nodes,) compute-time multiplier per node. Returns (job msgs, step msgs)."""
        job_msgs: list[Message] = []
        step_msgs: list[Message] = []
        ts = self.epoch + t

        for jid in sorted({int(self.node_job[n]) for n in failing if self.node_job[n] >= 0}):
            job = self.jobs.pop(jid)
            job_msgs.append(self._job_msg(job, "failed", ts))
            self._release(job, t)

        for jid in list(self.jobs):
            job = self.jobs[jid]
            self._advance(job, t, slow, step_msgs)
            if t >= job.end_s:
                del self.jobs[jid]
                job_msgs.append(self._job_msg(job, "finished", ts))
                self._release(job, t)
            elif t >= job.next_heartbeat_s:
                job.next_heartbeat_s += self.cfg.heartbeat_s
                job_msgs.append(self._job_msg(job, "running", ts))

        self.started = self._start_jobs(t, unavailable, slow)
        job_msgs.extend(self._job_msg(job, "started", ts) for job in self.started)

        self._update_phases(t, slow)
        step_msgs.sort(key=lambda m: m[2]["ts"])
        return job_msgs, step_msgs

    # ------------------------------------------------------------ internals

    def _release(self, job: Job, t: float) -> None:
        self.node_job[job.nodes] = -1
        self.free_at[job.nodes] = t + self.cfg.requeue_delay_s

    def _start_jobs(self, t: float, unavailable: np.ndarray, slow: np.ndarray) -> list[Job]:
        cfg, rng = self.cfg, self.rng
        free = np.flatnonzero((self.node_job < 0) & ~unavailable & (self.free_at <= t))
        started: list[Job] = []
        budget = len(free) - self._reserve
        while True:
            fits = [s for s in cfg.sizes if s <= budget]
            if not fits:
                break
            size = int(fits[int(rng.integers(len(fits)))])
            nodes, free = free[:size], free[size:]
            budget -= size
            jid = self._next_id
            self._next_id += 1
            startup = float(rng.uniform(*cfg.startup_s))
            every = cfg.checkpoint_every_s
            job = Job(
                name=f"job-{self.tag}-{jid:05d}",
                nodes=nodes,
                start_s=t,
                end_s=t + float(rng.uniform(*cfg.duration_s)),
                step_s=float(rng.uniform(*cfg.step_time_s)),
                train_at_s=t + startup,
                next_heartbeat_s=t + cfg.heartbeat_s,
                # Offset the first checkpoint so that jobs do not all checkpoint in the same second.
                next_ckpt_s=t + startup + every * float(rng.uniform(0.3, 1.0)) if every > 0 else float("inf"),
            )
            self.jobs[jid] = job
            self.node_job[nodes] = jid
            started.append(job)
        return started

    def _start_step(self, job: Job, at: float, slow: np.ndarray) -> None:
        rng = self.rng
        k = len(job.nodes)
        shared = 1.0 + JOB_NOISE * float(np.clip(rng.standard_normal(), -3, 3))
        own = 1.0 + RANK_NOISE * np.clip(rng.standard_normal(k), -3, 3)
        job.compute = job.step_s * shared * own * slow[job.nodes]
        job.step_done_s = at + float(job.compute.max())

    def _advance(self, job: Job, t: float, slow: np.ndarray, out: list[Message]) -> None:
        if t < job.train_at_s:
            return
        if job.step_done_s is None:
            self._start_step(job, job.train_at_s, slow)
        while job.step_done_s is not None and job.step_done_s <= min(t, job.end_s):
            done = job.step_done_s
            iteration = float(job.compute.max())
            ts = round(self.epoch + done, 3)
            compute = job.compute.tolist()
            for rank, node in enumerate(job.nodes.tolist()):
                out.append(
                    (
                        topics.STEPS,
                        job.name,
                        {
                            "schema": schemas.STEP,
                            "job": job.name,
                            "node": self.names[node],
                            "rank": rank,
                            "step": job.step,
                            "step_time_s": round(compute[rank], 4),
                            "wait_time_s": round(iteration - compute[rank], 4),
                            "ts": ts,
                        },
                    )
                )
            job.step += 1
            nxt = done
            if nxt >= job.next_ckpt_s:
                job.ckpt_until_s = nxt + self.cfg.checkpoint_s
                job.next_ckpt_s += self.cfg.checkpoint_every_s
                nxt = job.ckpt_until_s
            self._start_step(job, nxt, slow)

    def _update_phases(self, t: float, slow: np.ndarray) -> None:
        self.phase.fill(IDLE)
        self.pace.fill(1.0)
        for job in self.jobs.values():
            if t < job.train_at_s:
                self.phase[job.nodes] = STARTUP
            elif t < job.ckpt_until_s:
                self.phase[job.nodes] = CHECKPOINT
            else:
                self.phase[job.nodes] = TRAIN
            self.pace[job.nodes] = float(slow[job.nodes].max())

    def _job_msg(self, job: Job, state: str, ts: float) -> Message:
        return (
            topics.JOBS,
            job.name,
            {
                "schema": schemas.JOB,
                "job": job.name,
                "nodes": [self.names[n] for n in job.nodes.tolist()],
                "state": state,
                "ts": ts,
            },
        )
