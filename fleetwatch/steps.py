"""Step times from training loops: `StepReporter` produces step/1 to fleet.steps.v1 (key = job).

Training code calls `reporter.step(step)` once per step. The call only appends a tuple to a
bounded in-memory buffer (about a microsecond; benchmarks/step_api.py checks <= 20 us, median
and p99); a daemon thread creates the Kafka producer, serialises and sends. The training thread
never waits on Kafka and nothing from the reporter ever raises into it:

- Broker down (at start or later): the thread retries the connection with backoff; the buffer
  keeps the newest `max_buffered` steps and the oldest are dropped and counted (`dropped`), so
  memory stays bounded however long the outage. Steps already handed to the producer are retried
  by it for `delivery_timeout_s`, then counted as dropped too.
- A bad argument to `step()` (a negative or non-integer step, a NaN or negative time) is counted
  in `rejected` and logged once, never raised: a training job is worth more than one step time.
  Bad configuration (job, node, rank, bootstrap) is refused by the constructor with ValueError,
  which runs once, outside the training loop.
- Interpreter exit never hangs: the thread is a daemon, and an atexit hook closes the reporter
  with a short timeout (`exit_timeout_s`), delivering what it can in that time.
- A reporter made before `os.fork()` (a fork-started multiprocessing worker, a PyTorch DataLoader
  worker) works in the child too: the child gets a sender and producer of its own, started by its
  first step (a child that never reports opens no connection), and counts only its own steps.
  The parent's sender thread, producer and buffered steps stay the parent's. A multiprocessing
  worker delivers what it reported when it exits (within `exit_timeout_s`), like interpreter exit.

Job, rank and node come from the environment when not given (see `resolve_identity`). Step times
are either given (`step_time_s`) or measured with time.perf_counter between successive calls;
the first call without a time only starts the clock. In synchronous data-parallel training the
wall time between calls is the same on every rank (all wait for the slowest), so where a rank can
measure its own compute time, pass it as `step_time_s` (and the wait as `wait_time_s`): the
straggler detector compares ranks' own compute times (detectors/straggler.py). docs/steps.md has
examples.

Counters (exact once the reporter is quiet; approximate by a record or two while it runs):
accepted steps = sent + dropped + pending. `sent` counts steps the broker acknowledged.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import math
import operator
import os
import socket
import sys
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

import orjson

from fleetwatch import schemas, topics
from fleetwatch.bus import Delivery, SendError
from fleetwatch.bus.config import ConfigError
from fleetwatch.bus.kafka import KafkaBus

log = logging.getLogger(__name__)

BOOTSTRAP_ENV = "FLEETWATCH_BOOTSTRAP"
JOB_ENV = "SLURM_JOB_ID"
RANK_ENVS = ("SLURM_PROCID", "RANK", "LOCAL_RANK")  # Slurm's task rank, then torchrun's
# Set by torchrun in each worker. Under `srun torchrun ...` (one Slurm task per node, torchrun
# starting a worker per GPU) SLURM_PROCID is the rank of the task that started torchrun, the same
# for all of a node's workers; RANK is the worker's own.
TORCHRUN_ENV = "TORCHELASTIC_RUN_ID"
NODE_ENV = "SLURMD_NODENAME"  # Slurm's node name: several slurmd may share one host

_INF = math.inf
_I64_MAX = schemas.I64_MAX
_perf = time.perf_counter
_now = time.time

# A buffered step: (step, step_time_s, ts, wait_time_s or None).
# a checkpoint mark: (the step it saved, when, how long the write blocked or None)
Checkpoint = tuple[int, float, float | None]
Record = tuple[int, float, float, float | None, Checkpoint | None]

# Every open reporter, for the fork hook below (weak: the hook must not keep one alive).
_REPORTERS: weakref.WeakSet[StepReporter] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for reporter in list(_REPORTERS):
        reporter._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def resolve_identity(
    job: str | None = None,
    rank: int | None = None,
    node: str | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[str, int, str]:
    """(job, rank, node) from the arguments, else from the environment; ValueError if invalid.

    job: SLURM_JOB_ID. rank: SLURM_PROCID, else RANK (torchrun), else LOCAL_RANK, else 0; but RANK
    first in a worker that torchrun started (TORCHELASTIC_RUN_ID set), also under Slurm.
    node: SLURMD_NODENAME (the node's name in Slurm, which the slurm-jobs feed uses too), else this
    host's short name (what `fleetwatch collect` calls the node by default)."""
    env = os.environ if env is None else env
    if job is None:
        job = env.get(JOB_ENV)
        if not job:
            raise ValueError(f"no job id: pass job=... or run under Slurm (${JOB_ENV} is not set)")
        where = f"${JOB_ENV}"
    else:
        where = "job"
    _check_name(where, job)
    if rank is None:
        rank = 0
        order = ("RANK", *RANK_ENVS) if env.get(TORCHRUN_ENV) else RANK_ENVS
        for var in order:
            text = env.get(var)
            if text is not None and text.strip():
                rank = _rank(f"${var}", text.strip())
                break
    else:
        rank = _rank("rank", rank)
    if node is None:
        node = env.get(NODE_ENV) or socket.gethostname().split(".")[0]
        where = f"${NODE_ENV} or the host name" if not env.get(NODE_ENV) else f"${NODE_ENV}"
    else:
        where = "node"
    _check_name(where, node)
    return job, rank, node


def _check_name(where: str, value: Any) -> None:
    # The readers' own rule (schemas.NAME_RE): a name they would refuse must not be sent at all.
    if not isinstance(value, str) or not schemas.NAME_RE.match(value):
        raise ValueError(
            f"{where} {str(value)[:64]!r} is not a valid fleetwatch name "
            f"(letters, digits and . _ : -, starting with a letter or digit, at most 253 characters)"
        )


def _rank(where: str, value: Any) -> int:
    try:
        if isinstance(value, bool):
            raise TypeError
        r = int(value) if isinstance(value, str) else operator.index(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where} {str(value)[:40]!r} is not an integer rank") from None
    if not 0 <= r <= schemas.MAX_RANK:
        raise ValueError(f"{where} {r} is out of range [0, {schemas.MAX_RANK}]")
    return r


def _as_step(value: Any) -> int:
    """step() slow path: an int subclass, a numpy integer, a 0-d integer tensor."""
    if isinstance(value, bool):  # True is an int to Python, not a step number
        raise TypeError("step must be an integer, got bool")
    i = operator.index(value)
    if not 0 <= i <= _I64_MAX:
        raise ValueError(f"step must be in [0, 2**63 - 1], got {i}")
    return int(i)


def _as_seconds(where: str, value: Any) -> float:
    """step() slow path for times: an int, a numpy float, a 0-d tensor (float() of a GPU tensor
    waits for the device: pass Python floats)."""
    if isinstance(value, bool | str | bytes | bytearray):  # float("1.5") would parse text
        raise TypeError(f"{where} must be a number, got {type(value).__name__}")
    f = float(value)
    if not 0.0 <= f < _INF:  # NaN fails too
        raise ValueError(f"{where} must be finite and >= 0, got {f}")
    return f


class StepReporter:
    """Reports one step/1 message per training step from a background thread.

    Use it as a context manager (`with StepReporter(...) as r:`) or call `close()`; an atexit
    hook closes it otherwise. `bootstrap` defaults to $FLEETWATCH_BOOTSTRAP. Kafka security
    settings come from the same FLEETWATCH_KAFKA_* variables as every fleetwatch client
    (fleetwatch/bus/config.py). One reporter per process (per training thread): calls from several
    threads are safe, but its counters may then be off by a few."""

    def __init__(
        self,
        bootstrap: str | None = None,
        job: str | None = None,
        rank: int | None = None,
        node: str | None = None,
        *,
        topic: str = topics.STEPS,
        max_buffered: int = 10_000,
        max_in_flight: int = 1_000,
        send_interval_s: float = 0.5,
        close_timeout_s: float = 5.0,
        exit_timeout_s: float = 2.0,
        delivery_timeout_s: float = 30.0,
        retry_backoff_s: tuple[float, float] = (0.2, 10.0),
        env: Mapping[str, str] | None = None,
        producer_config: Mapping[str, Any] | None = None,
        connect_timeout_s: float = 2.0,
    ) -> None:
        env = os.environ if env is None else env
        bootstrap = bootstrap or env.get(BOOTSTRAP_ENV)
        if not bootstrap or not isinstance(bootstrap, str):
            raise ValueError(
                f"no Kafka bootstrap servers: pass bootstrap='HOST:PORT' or set ${BOOTSTRAP_ENV}"
            )
        if max_buffered < 1 or max_in_flight < 1:
            raise ValueError("max_buffered and max_in_flight must be >= 1")
        for name, v in (
            ("send_interval_s", send_interval_s),
            ("close_timeout_s", close_timeout_s),
            ("exit_timeout_s", exit_timeout_s),
            ("delivery_timeout_s", delivery_timeout_s),
            ("connect_timeout_s", connect_timeout_s),
        ):
            if not 0 <= v < _INF:
                raise ValueError(f"{name} must be finite and >= 0, got {v}")
        if send_interval_s < 0.001:  # the sender would spin
            raise ValueError(f"send_interval_s must be >= 0.001, got {send_interval_s}")
        self.job, self.rank, self.node = resolve_identity(job, rank, node, env)
        self.bootstrap = bootstrap
        self.topic = topic
        self.max_buffered = max_buffered
        self._key = self.job.encode()
        self._max_in_flight = max_in_flight
        self._interval_s = send_interval_s
        self._close_timeout_s = close_timeout_s
        self._exit_timeout_s = exit_timeout_s
        self._delivery_timeout_s = delivery_timeout_s
        self._backoff_min_s, self._backoff_max_s = retry_backoff_s
        self._producer_config = dict(producer_config or {})
        self._connect_timeout_s = connect_timeout_s

        # The training thread's side: it writes only these.
        self._buf: collections.deque[Record] = collections.deque(maxlen=max_buffered)
        self._last: float | None = None  # perf_counter of the previous step() call
        self._accepted = 0
        self._rejected = 0
        self._warned = False
        self._last_step = 0
        self._checkpoint: Checkpoint | None = None  # the mark the next step() report carries

        # The sender thread's side.
        self._producer: Any = None
        self._in_flight: collections.deque[Delivery] = collections.deque()  # in send order
        self._taken = 0  # records taken out of the buffer (handed to the producer or abandoned)
        self._sent = 0
        self._failed = 0  # handed to the producer, never acknowledged
        self._abandoned = 0  # still buffered when the reporter closed
        self._broker_up = False
        self._outages = 0
        self._misconfigured = False

        self._stop = threading.Event()
        self._done = threading.Event()
        self._deadline = _INF
        self._thread: threading.Thread | None = None
        self._forked = False  # set in a forked child (see _after_fork)
        _REPORTERS.add(self)
        atexit.register(self._at_exit)
        self._start_sender()

    # ------------------------------------------------------------ the training thread's API

    def step(self, step: int, step_time_s: float | None = None, wait_time_s: float | None = None) -> None:
        """Record that `step` ended now. step_time_s: its duration in seconds, or None to measure it
        from the previous call (the first such call only starts the clock). wait_time_s: optional
        time this rank spent waiting for its peers. Never blocks on Kafka, never raises."""
        now = _perf()
        try:
            last = self._last
            self._last = now
            # Fast paths for plain Python numbers; anything else goes through the converters.
            if type(step) is not int or not 0 <= step <= _I64_MAX:
                step = _as_step(step)
            if step_time_s is None:
                if last is None:
                    return
                step_time_s = now - last
            elif type(step_time_s) is not float or not 0.0 <= step_time_s < _INF:
                step_time_s = _as_seconds("step_time_s", step_time_s)
            if wait_time_s is not None:
                wait_time_s = _as_seconds("wait_time_s", wait_time_s)
            # the latest mark rides on every later report (the stage keeps the latest): a report
            # lost to an outage or a full buffer does not lose it
            self._buf.append((step, step_time_s, _now(), wait_time_s, self._checkpoint))
            self._last_step = step
            self._accepted += 1
            if self._thread is None:  # the first step in a forked child: its own sender
                self._start_sender()
        except Exception as e:
            self._reject(step, step_time_s, e)

    def checkpoint(self, step: int | None = None, write_time_s: float | None = None) -> None:
        """Record that a checkpoint of `step` (default: the last step reported) was saved now;
        write_time_s: how long the save blocked training, if known. The mark travels with the next
        step() report and every later one (fields checkpoint_step, checkpoint_ts,
        checkpoint_write_s of step/1), so the accounting stage knows how much work a failure
        loses. Call it from the training thread of any one rank (rank 0). Never blocks, never
        raises."""
        try:
            saved = self._last_step if step is None else _as_step(step)
            write = None if write_time_s is None else _as_seconds("write_time_s", write_time_s)
            self._checkpoint = (saved, _now(), write)
            self._last = None  # the save is no step: the next step() without a time starts the clock
        except Exception as e:
            self._reject(step, write_time_s, e)

    def reset_clock(self) -> None:
        """Forget the previous call's time: the next step() without a time only starts the clock
        (call it after a pause that is not a step: evaluation, a checkpoint, a data reload)."""
        self._last = None

    def __enter__(self) -> StepReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, timeout_s: float | None = None) -> bool:
        """Send what is buffered, waiting at most `timeout_s` (default close_timeout_s); then stop.
        Returns True if every accepted step reached the broker. Never raises. Steps reported after
        close() are counted as dropped."""
        try:
            timeout_s = self._close_timeout_s if timeout_s is None else max(0.0, float(timeout_s))
            if self._thread is None:  # a forked child that never reported: no sender to wait for
                self._stop.set()
                self._abandon_buffer()
                self._done.set()
                atexit.unregister(self._at_exit)
                return self._sent == self._accepted
            if not self._stop.is_set():
                self._deadline = time.monotonic() + timeout_s
                self._stop.set()
                atexit.unregister(self._at_exit)
            self._done.wait(timeout_s)
            return self._done.is_set() and self._sent == self._accepted
        except Exception:
            log.exception("fleetwatch.steps: error closing the step reporter")
            return False

    # ------------------------------------------------------------ counters

    @property
    def accepted(self) -> int:
        """Steps taken into the buffer (the first measured call, which only starts the clock, and
        refused calls are not)."""
        return self._accepted

    @property
    def sent(self) -> int:
        """Steps the broker acknowledged."""
        return self._sent

    @property
    def rejected(self) -> int:
        """step() calls refused for a bad argument."""
        return self._rejected

    @property
    def dropped(self) -> int:
        """Accepted steps that will never be sent: pushed out of the full buffer (the oldest go
        first), not acknowledged by the broker within delivery_timeout_s, or left when it closed."""
        overflow = self._accepted - self._taken - len(self._buf)
        return max(0, overflow) + self._failed + self._abandoned

    @property
    def pending(self) -> int:
        """Accepted steps not yet sent nor dropped: buffered, or with the producer."""
        return len(self._buf) + len(self._in_flight)

    @property
    def broker_up(self) -> bool:
        """Whether the last thing the broker did was accept a connection or a step."""
        return self._broker_up

    @property
    def closed(self) -> bool:
        """True once the sender thread has finished (after close() or at exit)."""
        return self._done.is_set()

    def stats(self) -> dict[str, int]:
        return {
            "accepted": self.accepted,
            "sent": self.sent,
            "dropped": self.dropped,
            "pending": self.pending,
            "rejected": self.rejected,
        }

    # ------------------------------------------------------------ internals: training thread

    def _reject(self, step: Any, step_time_s: Any, err: Exception) -> None:
        self._rejected += 1
        if not self._warned:
            self._warned = True
            with contextlib.suppress(Exception):  # a hostile __repr__ must not escape either
                log.warning(
                    "fleetwatch.steps: step(%.40r, step_time_s=%.40r) refused (%s); further refusals "
                    "are only counted (StepReporter.rejected)",
                    step,
                    step_time_s,
                    err,
                )

    def _start_sender(self) -> None:
        if self._stop.is_set():  # closed (before a fork): nothing to send, ever
            return
        thread = threading.Thread(target=self._run, name=f"fleetwatch-steps-{self.job}", daemon=True)
        try:
            thread.start()
        except RuntimeError as e:  # no thread to be had (a process or thread limit): drop, counted
            log.error("fleetwatch.steps: cannot start the sender thread (%s); steps are dropped", e)
            self._stop.set()
            self._abandon_buffer()
            self._done.set()
            return
        self._thread = thread
        if self._forked:
            # A multiprocessing worker leaves through os._exit, which skips atexit; its own exit
            # hooks (run when the worker returns) close this reporter as atexit would. Registered
            # now, not at the fork: the worker clears the hooks it inherits as it starts.
            mp_util = sys.modules.get("multiprocessing.util")
            if mp_util is not None:
                mp_util.Finalize(self, StepReporter._at_exit, args=(self,), exitpriority=0)

    def _after_fork(self) -> None:
        """In a forked child: what the parent's sender had (thread, producer, buffered steps) is the
        parent's; this process starts from nothing, with a sender of its own at its first step."""
        closed = self._stop.is_set()
        self._forked = True
        # The parent's producer is inert here (fleetwatch/bus/kafka.py: its librdkafka handle is
        # never used nor destroyed in a child); this process makes its own at its first step.
        self._producer = None
        self._in_flight = collections.deque()
        self._buf = collections.deque(maxlen=0 if closed else self.max_buffered)
        self._last = None
        self._accepted = self._rejected = 0
        self._taken = self._sent = self._failed = self._abandoned = 0
        self._broker_up = False
        self._outages = 0
        self._misconfigured = False
        self._warned = False
        # fresh: the parent's sender thread may have held their locks at the fork
        self._stop = threading.Event()
        self._done = threading.Event()
        self._deadline = _INF
        self._thread = None
        if closed:  # closed in the parent: closed here too, later steps dropped and counted
            self._stop.set()
            self._done.set()

    def _at_exit(self) -> None:
        # No producer and a failed connection already: nothing is on its way, so nothing to wait for.
        hopeless = self._producer is None and self._outages > 0
        self.close(0.0 if hopeless else self._exit_timeout_s)

    # ------------------------------------------------------------ internals: sender thread

    def _run(self) -> None:
        try:
            backoff = self._backoff_min_s
            while not self._stop.is_set():
                if self._producer is None:
                    if not self._connect():
                        self._stop.wait(self._backoff_max_s if self._misconfigured else backoff)
                        backoff = min(backoff * 2, self._backoff_max_s)
                        continue
                    backoff = self._backoff_min_s
                self._pump()
                # A backlog (after an outage, or a burst beyond max_in_flight) is sent as fast as the
                # broker acknowledges it; otherwise steps wait up to send_interval_s, so that the
                # thread wakes, and the producer sends a request, rarely (CPU: benchmarks/README.md).
                backlog = self._broker_up and len(self._buf) > 0
                self._stop.wait(min(self._interval_s, 0.02) if backlog else self._interval_s)
            self._finish()
        except Exception:  # a bug here must not go unnoticed, nor take the training job with it
            log.exception("fleetwatch.steps: the sender thread failed; further steps are dropped")
        finally:
            self._abandon_buffer()
            self._done.set()

    def _connect(self) -> bool:
        linger_ms = 20  # batches a burst of steps; far below any step time worth reporting
        delivery_s = max((linger_ms + 2) / 1000, self._delivery_timeout_s)
        options: dict[str, Any] = {
            # A request waits at most this long for the broker's answer (librdkafka requires it
            # below the delivery timeout).
            "request.timeout.ms": max(1, min(5000, int(delivery_s * 1000) - linger_ms - 1)),
            # librdkafka backs reconnects off up to 10 s; steps sent after a restart would wait
            # that long. 5 s (with librdkafka's jitter) still spares a recovering broker a herd.
            "reconnect.backoff.max.ms": 5000,
        }
        options.update(self._producer_config)
        try:
            # One bootstrap attempt per try (connect_timeout_s): the thread retries with backoff,
            # and close() must not wait long for a connection that cannot be made.
            producer = KafkaBus(self.bootstrap, connect_timeout_s=self._connect_timeout_s).producer(
                linger_ms=linger_ms,
                delivery_timeout_s=delivery_s,
                # Step times are best-effort metrics: a step lost or repeated is harmless. Without
                # idempotence an outage leaves no producer sequence state to wedge (see
                # collectors/forwarder.py), so one producer reconnects by itself across outages.
                idempotent=False,
                options=options,
            )
        except (ConfigError, TypeError, ValueError) as e:
            # Not the broker's fault: say so once, loudly; retries (at the slowest pace) change nothing
            # but keep the buffer bounded as in any outage.
            if not self._misconfigured:
                self._misconfigured = True
                log.error("fleetwatch.steps: cannot create the Kafka producer (%s); steps are dropped", e)
            self._mark_down(f"bad producer configuration: {e}")
            return False
        except Exception as e:  # BrokerUnavailable, OSError, ...
            self._mark_down(f"cannot connect: {e}")
            return False
        self._producer = producer
        self._mark_up()
        return True

    def _pump(self) -> None:
        """Hand buffered steps to the producer, keeping at most max_in_flight unacknowledged, or
        while the broker is down just one: the probe that finds it back. The others wait in the
        buffer, where an outage costs the oldest steps, instead of expiring in the producer."""
        self._retire()
        buf = self._buf
        room = (self._max_in_flight if self._broker_up else 1) - len(self._in_flight)
        while room > 0:
            try:
                rec = buf.popleft()
            except IndexError:
                break
            self._taken += 1
            if not self._send(rec):
                break
            room -= 1
        self._retire()

    def _encode(self, rec: Record) -> bytes:
        step, step_time_s, ts, wait_time_s, mark = rec
        m: dict[str, Any] = {
            "schema": schemas.STEP,
            "job": self.job,
            "node": self.node,
            "rank": self.rank,
            "step": step,
            "step_time_s": step_time_s,
            "ts": ts,
        }
        if wait_time_s is not None:
            m["wait_time_s"] = wait_time_s
        if mark is not None:
            m["checkpoint_step"], m["checkpoint_ts"] = mark[0], mark[1]
            if mark[2] is not None:
                m["checkpoint_write_s"] = mark[2]
        return orjson.dumps(m)

    def _send(self, rec: Record) -> bool:
        try:
            delivery = self._producer.send(self.topic, value=self._encode(rec), key=self._key)
        except SendError as e:  # refused outright (the producer's queue is full, say): this step is lost
            self._failed += 1
            self._mark_down(f"send refused: {e}")
            return False
        except Exception as e:  # BufferError, a closed producer, ...: this step is lost, not the job
            self._failed += 1
            self._mark_down(f"send failed: {e!r}")
            return False
        self._in_flight.append(delivery)
        return True

    def _retire(self) -> None:
        # One key, so one partition: the producer completes these futures in send order.
        q = self._in_flight
        if q:
            self._producer.poll(0)  # the producer settles deliveries when asked to
        while q and q[0].done:
            delivery = q.popleft()
            if delivery.error is None:
                self._sent += 1
                if not self._broker_up:
                    self._mark_up()
            else:
                self._failed += 1
                self._mark_down(f"delivery failed: {delivery.error}")

    def _mark_down(self, why: str) -> None:
        if self._broker_up or self._outages == 0:
            self._outages += 1
            log.warning(
                "fleetwatch.steps: Kafka at %s unreachable (%s); buffering the newest %d steps, "
                "dropping older ones",
                self.bootstrap,
                why,
                self.max_buffered,
            )
        self._broker_up = False

    def _mark_up(self) -> None:
        if not self._broker_up and self._outages:
            log.info("fleetwatch.steps: Kafka at %s reachable again", self.bootstrap)
        self._broker_up = True

    def _finish(self) -> None:
        """Closing: send what is buffered until the deadline, then close the producer."""
        producer = self._producer
        if producer is None:
            return
        # Stop sending a little before the caller stops waiting, so that the producer is closed (and
        # the counts final) by then.
        until = self._deadline - min(0.25, 0.25 * max(0.0, self._deadline - time.monotonic()))
        while time.monotonic() < until:
            self._pump()
            if not self._buf and not self._in_flight:
                break
            try:
                producer.flush(max(0.0, min(0.1, until - time.monotonic())))
            except Exception as e:
                log.debug("fleetwatch.steps: flushing the producer: %r", e)
                break
        self._retire()
        self._abandon_buffer()
        if self._in_flight:
            log.warning(
                "fleetwatch.steps: closing with %d steps unacknowledged by Kafka at %s",
                len(self._in_flight),
                self.bootstrap,
            )
        try:
            # Past the deadline: what is still unacknowledged is purged, not waited for (bounded, so
            # interpreter exit with the broker down is as quick as exit_timeout_s).
            producer.close(0)
        except Exception as e:
            log.debug("fleetwatch.steps: closing the producer: %r", e)
        self._retire()
        self._failed += len(self._in_flight)  # never acknowledged: lost
        self._in_flight.clear()

    def _abandon_buffer(self) -> None:
        # Later step() calls append to a deque that keeps nothing: dropped, and counted as such.
        buf = self._buf
        self._buf = collections.deque(maxlen=0)
        n = 0
        while True:
            try:
                buf.popleft()
            except IndexError:
                break
            n += 1
        self._taken += n
        self._abandoned += n
