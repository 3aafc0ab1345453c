"""`fleetwatch slurm-drainer`: executes signed drain/1 requests from scheduler.drain.v1 with scontrol.

Per request, in order:
1. decode + validate drain/1 (malformed -> dead-letter, counted);
2. check the HMAC signature with the shared key (forged or tampered -> dead-letter, counted); a
   request marked `dry_run` (`act --dry-run`) is dead-lettered and counted, never executed;
3. skip it if the journal already has it (a duplicate delivery or a replaying `act`), but for a
   deferred one asked again in a copy act signed anew (the copy deferred gets its answer again);
4. check the node against the nodes Slurm knows (unknown -> journal + dead-letter, counted);
5. a request the journal holds as `executing` was interrupted by a crash: decide from Slurm's own
   state whether it took effect (below) and never run it a second time if it did;
6. freshness: refuse a request issued more than --max-age ago or more than --max-skew ahead of
   this clock (stale -> journal + dead-letter, counted): a drain that sat in Kafka through a long
   outage describes a node as it was then, not as it is;
7. never overrule a human: a drain does not overwrite someone else's drain reason, and a resume
   only lifts a drain whose reason fleetwatch wrote;
8. not now: while an operator's pause is in force (fleet.control.v1, as act reads it), and for a
   node people or Slurm hold (DOWN, FAIL, a maintenance reservation not one of its validations) or
   whose validation is under way, the request is answered `deferred`, nothing done, and act asks
   again later (a pause holds what act asked just before it; a node taken down after the request
   was issued is theirs now). A validation already begun runs to its end;
9. journal `executing` (with the node's Slurm Comment as it was), run scontrol, journal the outcome.
Every request handled gets one signed drain_result/1 on scheduler.drain.results.v1 (key = node,
alerts/drain_result.py), so `act` learns what really happened; results and dead letters are
flushed before the batch's offsets are committed. Only a request whose signature verified is
answered, and its answer carries that signature (`request_signature`): a forged or malformed
request gets a dead letter, a counter and a log line, never a signed result, since our signature
on its request id would vouch for content nobody authenticated (a forged copy of a pending
request's id, or a real one made malformed in its unsigned Kafka key, would otherwise free that
request's budget slot in act).
Slurm being down is not the request's fault: the batch stops, offsets stay, and it is retried
with backoff (up to MAX_ATTEMPTS, then recorded as failed and dead-lettered).

Crash idempotency (step 5): a drain writes `[fw:<request_id>]` into the node's Comment in the
same `scontrol update` as State=DRAIN, and Slurm keeps the Comment across a RESUME (unlike the
Reason). So after a crash: our token in the Comment = the drain happened, even if an operator has
resumed the node since (it is not drained again); the Comment exactly as journalled before the
command = it never ran (it runs now); anything else = someone edited the node since, and Slurm
cannot tell: nothing is done and the request ends `undetermined` (result, dead letter, metric),
because never overruling an operator comes first.
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import Counter, Gauge

from fleetwatch import schemas, topics
from fleetwatch.alerts import drain_request, drain_result
from fleetwatch.alerts.drain_pause import Pause, PauseBook, load_control_key
from fleetwatch.alerts.journal import Entry, Journal
from fleetwatch.alerts.slurm import (
    TAG,
    NodeInfo,
    ReservationRefused,
    SlurmClient,
    SlurmError,
    SlurmOutputNotUnderstood,
    ours,
    reason_token,
)
from fleetwatch.alerts.slurm_nodes import DRAINED_BY_OTHER, NodeStatePublisher, held_by
from fleetwatch.alerts.validation import (
    RESERVATION_PREFIX,
    ValidationSettings,
    Validator,
    reservation_name,
)
from fleetwatch.alerts.validation import TOOLS as VALIDATION_TOOLS  # srun, scancel
from fleetwatch.bus import TopicPart
from fleetwatch.bus.kafka import KafkaBus, KafkaGroupConsumer
from fleetwatch.deadletter import send_deadletter
from fleetwatch.follow import BrokerTimedFollower
from fleetwatch.pipeline.worker import JOIN_WAIT_S  # the same allowance the workers give a join
from fleetwatch.refusal_log import RefusalLog
from fleetwatch.runtime import StopFlag, serve_metrics

log = logging.getLogger(__name__)

REQUESTS = Counter("fleetwatch_drainer_requests_total", "drain/1 requests handled, by outcome", ["outcome"])
PAUSED = Gauge("fleetwatch_drainer_paused", "1 while an operator's pause defers this adapter's requests")
CONTROL_REFUSED = Counter(
    "fleetwatch_drainer_control_refused_total",
    "control/1 records (the drain pause) refused: malformed, bad_signature, clock_skew",
    ["reason"],
)
MAX_ATTEMPTS = 5
DEFAULT_GROUP = "fleetwatch-slurm"
DEFAULT_MAX_AGE_S = 600.0
DEFAULT_MAX_SKEW_S = 60.0
# The drainer's outcome labels (its metric, dead-letter reasons) -> drain_result/1 outcomes.
# `forged` and `malformed` have none on purpose: such a request is not authenticated, so it is
# never answered (a signed answer carrying its id would free a real request's budget slot).
RESULT_OUTCOME = {
    "executed": "executed",
    "duplicate": "duplicate",
    "unknown_node": "rejected_unknown_node",
    "stale": "rejected_stale",
    "not_ours": "rejected_not_ours",
    "failed": "failed",
    "undetermined": "undetermined",
    "validation_failed": "rejected_validation",
    "deferred": "deferred",
}
DRAINING_POLL_S = 30.0  # how often a validation waiting for a draining node's jobs looks again
RECOVER_EVERY_S = 60.0  # how often the main loop takes up validations left without an answer
# the journal's status for an outcome (the answer itself is kept beside it: Entry.outcome)
JOURNAL_STATUS = {
    "executed": "executed",
    "validation_failed": "rejected",
    "not_ours": "rejected",
    "unknown_node": "rejected",
    "stale": "rejected",
    "failed": "failed",
    "undetermined": "undetermined",
}
# a token with the spaces before it; matched only where a run of spaces begins (the look-behind): tried
# at every position inside a long run, `\s*` rescanned the run each time (64 KiB of an operator's
# Comment took 3.6 s)
_TOKEN = re.compile(r"(?<!\s)\s*\[fw:[0-9a-f]{32}\]")


def comment_token(request_id: str) -> str:
    return f"[fw:{request_id}]"


def with_token(comment: str, request_id: str) -> str:
    """The Comment a drain writes: the operator's text kept, an older fleetwatch token replaced."""
    return f"{_TOKEN.sub('', comment).strip()} {comment_token(request_id)}".strip()


def took_effect(msg: dict[str, Any], prior: Entry, info: NodeInfo, comment: str) -> bool | None:
    """Did an interrupted request change Slurm? True, False, or None when Slurm cannot tell."""
    if msg["action"] == "resume":
        return not info.drained  # a node drained by someone else since is refused later, not resumed
    rid = msg["request_id"]
    if comment_token(rid) in comment:
        return True  # written by the drain's own scontrol call; a resume since does not remove it
    if info.drained and reason_token(rid) in info.reason:
        return True  # drained by a release that wrote no Comment token
    if prior.comment_before is None or comment == prior.comment_before:
        return False  # as it was before the command (or a journal row older than the pre-image)
    return None


Target = tuple[str, str, str, str]  # (request_id, node, action, signature) of a verified request


def target_of(msg: dict[str, Any]) -> Target:
    return msg["request_id"], msg["node"], msg["action"], msg["signature"]


class Retry(Exception):
    """Slurm did not answer; try this request again later."""


class TakenOver(Exception):
    """Before its test, the node stopped being fleetwatch's to validate: someone drained it or set
    it DOWN with a Reason of their own, or resumed it by hand. The validation ends not_ours."""


class Drainer:
    def __init__(
        self,
        slurm: SlurmClient,
        journal: Journal,
        key: bytes,
        producer: Any,
        *,
        results_topic: str = topics.DRAIN_RESULTS,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        max_skew_s: float = DEFAULT_MAX_SKEW_S,
        clock: Callable[[], float] = time.time,
        validator: Validator | None = None,
        pause: Callable[[float], Pause | None] = lambda _now: None,
    ) -> None:
        self.slurm = slurm
        self.journal = journal
        self._key = key
        self.producer = producer
        self.results_topic = results_topic
        self.max_age_s = max_age_s
        self.max_skew_s = max_skew_s
        self.clock = clock
        # the test a node passes before a resume lifts our drain (alerts/validation.py); None: none
        self.validator = validator if validator is not None and validator.settings.enabled else None
        # an operator's pause in force at a wall time (drain_pause.PauseBook.active, as act asks it)
        self.pause = pause
        self._attempts: dict[str, int] = {}
        # validations running on their own threads, by request id; their ends, for the main loop
        # (the copy that started each: its answer is the validation's)
        self._running: dict[str, tuple[Target, threading.Thread]] = {}
        # the main loop reads _running while validation threads remove their entries: every access
        # under this lock (iterated bare, it raised "dictionary changed size during iteration")
        self._running_lock = threading.Lock()
        self._finished: queue.Queue[tuple[Target, str, str]] = queue.Queue()
        self._unacked: list[tuple[Target, str, str]] = []  # answers sent, not yet acknowledged
        self._stopping = threading.Event()
        self._unauthenticated = RefusalLog(log)  # rejected requests nobody can be told of

    # ------------------------------------------------------------ outcomes

    def _result(self, target: Target, outcome: str, detail: str) -> None:
        """The signed answer to an AUTHENTICATED request (`target` from a verified signature)."""
        rid, node, action, signature = target
        res = drain_result.make_result(
            request_id=rid,
            node=node,
            action=action,
            outcome=RESULT_OUTCOME[outcome],
            detail=detail,
            ts=self.clock(),
            request_signature=signature,
            key=self._key,
        )
        self.producer.send(self.results_topic, key=node.encode(), value=schemas.encode(res))

    def _done(self, msg: dict[str, Any], outcome: str, detail: str = "") -> str:
        REQUESTS.labels(outcome).inc()
        self._result(target_of(msg), outcome, detail)
        return outcome

    def _reject(
        self, raw: bytes, target: Target | None, outcome: str, detail: str, source: str, topic: str
    ) -> str:
        """Dead-letter a request; answer it only if `target` (its verified identity) is given."""
        REQUESTS.labels(outcome).inc()
        send_deadletter(self.producer, raw, outcome, detail, source, topic)
        if target is None:  # anyone can write these: a flood of them must not flood the log
            self._unauthenticated(
                outcome,
                f"rejected drain request from {source}: {detail[:200]} (not authenticated: no result sent)",
            )
            return outcome
        log.warning("rejected drain request from %s: %s: %s", source, outcome, detail)
        self._result(target, outcome, detail)
        return outcome

    def _settle(
        self, msg: dict[str, Any], prior: Entry | None, outcome: str, detail: str, source: str
    ) -> None:
        """Journal a request that ends without running scontrol (now, or after an interruption),
        with the answer it gets."""
        rid, status = msg["request_id"], JOURNAL_STATUS[outcome]
        if prior is not None:
            self.journal.finish(rid, status, detail, outcome)
        else:
            self.journal.record(
                rid, msg["node"], msg["action"], status, detail, msg["issued_at"], source, outcome
            )

    # ------------------------------------------------------------ handling

    def handle(
        self, raw: bytes, source: str, topic: str = topics.DRAIN, key: bytes | None = schemas.NO_KEY
    ) -> str:
        """Handle one record; returns its outcome. Raises Retry when Slurm is unreachable."""
        try:
            msg = schemas.decode(raw, drain_request.DRAIN, key=key)
        except schemas.MessageError as e:
            # Never answered, even when its signature verifies over its JSON: the Kafka key and
            # the JSON's form (a duplicate key, say) are not signed, so anyone could make a copy
            # of a real request malformed and have us sign a refusal bound to that request.
            return self._reject(raw, None, "malformed", str(e), source, topic)
        if not drain_request.verify(msg, self._key):
            return self._reject(raw, None, "forged", "signature does not match", source, topic)
        if msg.get(schemas.DRY_RUN):
            # `act --dry-run`'s would-be request (on its own topic; here only if a topic was mixed
            # up): never executed, and not answered (that act waits for no result)
            return self._reject(raw, None, "dry_run", "a dry-run request is never executed", source, topic)
        rid, node, action = msg["request_id"], msg["node"], msg["action"]
        running = self._running_target(rid)
        if running is not None:
            if running != target_of(msg):
                # another copy of the request under validation (act asked again): its answer is the
                # validation's, to the copy that started it; this one waits, nothing done
                return self._done(msg, "deferred", f"a validation of {node} before its resume is under way")
            return "validating"  # a redelivery of the copy whose validation is running
        prior = self.journal.get(rid)
        if (
            prior is not None
            and prior.status == "deferred"
            and prior.issued_at is not None
            and msg["issued_at"] > prior.issued_at
        ):
            # a copy act signed anew after the deferral: nothing was done then, so judged afresh.
            # The copy deferred, or an older one (offsets rewound), gets the same answer below: a
            # copy's answer never changes, and an older copy judged afresh could be refused for
            # good as stale.
            self.journal.forget(rid)
            prior = None
        if prior is not None and prior.status != "executing":
            log.info("request %s (%s %s) already %s; skipping", rid, action, node, prior.status)
            answered = prior.outcome or ("executed" if prior.status == "executed" else None)
            if answered in RESULT_OUTCOME:
                # Its answer again, not `duplicate`: act resolves a duplicate from the first answer,
                # and where that never reached Kafka (a crash after the journal, a result the
                # broker refused) act waited for good and raised adapter:no_result.
                REQUESTS.labels("duplicate").inc()
                self._result(target_of(msg), answered, f"already {prior.status} {prior.detail}".rstrip())
                return "duplicate"
            return self._done(msg, "duplicate", f"already {prior.status}")  # a row of an earlier release
        try:
            outcome = self._execute(raw, msg, prior, source, topic)
        except SlurmError as e:
            n = self._attempts[rid] = self._attempts.get(rid, 0) + 1
            if n < MAX_ATTEMPTS:
                raise Retry(str(e)) from None
            self._attempts.pop(rid, None)
            self.journal.record(rid, node, action, "failed", str(e), msg["issued_at"], source, "failed")
            self.journal.finish(rid, "failed", str(e), "failed")
            return self._reject(raw, target_of(msg), "failed", str(e), source, topic)
        self._attempts.pop(rid, None)
        return outcome

    def _stale(self, msg: dict[str, Any]) -> str | None:
        """Why the request is too old or too far in the future to act on, or None if it is fresh."""
        age = self.clock() - msg["issued_at"]
        if age > self.max_age_s:
            return f"issued {age:.0f} s ago (limit {self.max_age_s:.0f} s)"
        if -age > self.max_skew_s:
            return f"issued {-age:.0f} s in the future (limit {self.max_skew_s:.0f} s)"
        return None

    def _execute(self, raw: bytes, msg: dict[str, Any], prior: Entry | None, source: str, topic: str) -> str:
        rid, node, action = msg["request_id"], msg["node"], msg["action"]
        if not self.slurm.knows(node):
            self._settle(msg, prior, "unknown_node", "unknown node", source)
            why = f"Slurm has no node {node}"
            return self._reject(raw, target_of(msg), "unknown_node", why, source, topic)
        info = self.slurm.node(node)
        comment = self.slurm.comment(node) if action == "drain" else ""
        if prior is not None and action == "resume" and self.validator is not None:
            return self._validated_resume(raw, msg, info, source, topic, interrupted=True)
        if prior is not None:  # died between journal and outcome last time: did it happen?
            done = took_effect(msg, prior, info, comment)
            if done:
                self.journal.finish(rid, "executed", "found done after a restart", "executed")
                return self._done(msg, "executed", "found done after a restart")
            if done is None:
                why = f"interrupted by a crash; the node's Comment has changed since ({comment!r})"
                self.journal.finish(rid, "undetermined", why, "undetermined")
                log.error("not %s %s (request %s): %s; a human decides", action, node, rid, why)
                return self._reject(raw, target_of(msg), "undetermined", why, source, topic)
        stale = self._stale(msg)
        if stale:
            self._settle(msg, prior, "stale", stale, source)
            return self._reject(raw, target_of(msg), "stale", stale, source, topic)
        theirs = info.drained and not ours(info.reason)
        if action == "resume" and theirs:
            return self._refuse(msg, prior, source, f"drained by someone else: {info.reason}")
        if action == "drain" and theirs:
            return self._refuse(msg, prior, source, f"already drained: {info.reason}")
        deferred = self._validating(node) or self._deferral(info)
        if deferred is not None:
            # not final (act asks again later): the pause holds what act asked before it, and a node
            # people took down or into maintenance after the request was issued is theirs now
            self.journal.defer(rid, node, action, deferred, msg["issued_at"], source, msg["signature"])
            log.info("%s %s deferred (request %s): %s", action, node, rid, deferred)
            return self._done(msg, "deferred", deferred)
        if action == "resume" and info.drained and self.validator is not None:
            self.journal.begin(rid, node, action, msg["issued_at"], source, None, msg["signature"])
            return self._validated_resume(raw, msg, info, source, topic, interrupted=False)
        self.journal.begin(
            rid, node, action, msg["issued_at"], source, comment if action == "drain" else None
        )
        if action == "drain":
            reason = msg["reason"] if msg["reason"].startswith(TAG) else f"{TAG}: {msg['reason']}"
            self.slurm.drain(node, f"{reason} {reason_token(rid)}", with_token(comment, rid))
        elif info.drained:
            self.slurm.resume(node)
        self.journal.finish(rid, "executed", "", "executed")
        log.info("%s %s done (request %s: %s)", action, node, rid, msg["reason"])
        return self._done(msg, "executed")

    def _validated_resume(
        self, raw: bytes, msg: dict[str, Any], info: NodeInfo, source: str, topic: str, interrupted: bool
    ) -> str:
        """Lift our drain only once the node passes its test (alerts/validation.py); a node that
        fails is drained again, its Reason naming the test and the GPU. The test runs on a thread
        of its own (it may take minutes): requests behind it are not held up, and this one's
        result is sent when it ends (deliver_finished). Journalled `executing` before the first
        step: after a crash it runs again from the start (every step is idempotent), unless Slurm
        shows how it ended."""
        assert self.validator is not None
        rid, node = msg["request_id"], msg["node"]
        # a verdict journalled before the interruption is carried out, whatever Slurm's state
        # suggests (a failed test's node, in service inside its reservation, read as a pass)
        if interrupted and self.journal.verdict(rid) is None:
            held = self.slurm.reservation_exists(reservation_name(node))
            if not info.drained and not held:
                self.journal.finish(rid, "executed", "found done after a restart", "executed")
                return self._done(msg, "executed", "found done after a restart")
            if info.drained and comment_token(rid) in self.slurm.comment(node):
                if held:
                    self.validator.release(node)
                why = info.reason.removeprefix(f"{TAG}: ")
                self.journal.finish(rid, "rejected", why, "validation_failed")
                return self._done(msg, "validation_failed", why)
            if info.held_by_others:
                if held:  # left, only the adapter's user could run jobs there after their RESUME
                    self.validator.release(node)
                prior = Entry(rid, node, "resume", "executing", "", None)
                why = f"taken over by someone else: {info.state}: {info.reason}"
                return self._refuse(msg, prior, source, why)
        self._submit(target_of(msg))
        return "validating"

    # ------------------------------------------------------------ validations on their own threads

    def _submit(self, target: Target) -> None:
        rid, node = target[0], target[1]
        t = threading.Thread(
            target=self._validation_job, args=(target,), name=f"validate-{node}", daemon=True
        )
        with self._running_lock:
            if rid in self._running:
                return  # a redelivery of the request whose test is running now
            self._running[rid] = (target, t)
        t.start()
        log.info("validating %s before its resume (request %s): %s", node, rid, self.validator_label())

    @property
    def busy(self) -> bool:
        """A validation is running or waits to be answered."""
        with self._running_lock:
            return bool(self._running)

    def _running_target(self, rid: str) -> Target | None:
        """The copy of request `rid` whose validation runs now, or None."""
        with self._running_lock:
            entry = self._running.get(rid)
        return None if entry is None else entry[0]

    def _running_now(self) -> list[tuple[Target, threading.Thread]]:
        with self._running_lock:
            return list(self._running.values())

    def _forget_running(self, rid: str) -> None:
        with self._running_lock:
            self._running.pop(rid, None)

    def validator_label(self) -> str:
        return self.validator.label() if self.validator is not None else "no validation (--validate none)"

    def _validation_job(self, target: Target) -> None:
        """On the validation's thread: Slurm only (the journal and the results are the main loop's,
        in deliver_finished). The test runs once: Slurm not answering before it has a verdict is
        retried with backoff (those steps are idempotent), and after it only the steps that carry
        the verdict out are retried, never the test (a flaky GPU must not pass on a second try).
        Whatever ends without an answer (Slurm down for good, a stop, an error) stays `executing`
        in the journal and is taken up again by recover(); the node meanwhile is drained or held in
        its reservation, which has no end, so no job lands on it untested."""
        rid, node = target[0], target[1]
        answered = False
        try:
            done = self._validate(node, rid)
            if done is None:
                return
            self._finished.put((target, *done))
            answered = True
        except Exception:
            log.exception("the validation of %s failed; it is taken up again later", node)
        finally:
            if not answered:
                self._forget_running(rid)  # recover() finds it `executing` and submits it again

    def _validate(self, node: str, rid: str) -> tuple[str, str] | None:
        """The validation's (outcome, detail), or None when it ends without one (Slurm away, a stop)."""
        # a verdict reached before a crash or before Slurm went away: carried out, not tested again
        verdict = self.journal.verdict(rid)
        if verdict is None:
            try:
                verdict = self._retrying(node, "its test", lambda: self._test(node))
            except TakenOver as e:
                why = str(e)
                return self._retrying(node, "its reservation", lambda: self._not_ours(node, rid, why))
            if verdict is None:
                return None
            self.journal.save_verdict(rid, *verdict)
        passed, line = verdict
        return self._retrying(node, "the verdict", lambda: self._carry_out(node, rid, passed, line))

    def _retrying(self, node: str, what: str, step: Callable[[], tuple[Any, Any]]) -> tuple[Any, Any] | None:
        """step() until it answers without a SlurmError (MAX_ATTEMPTS, with backoff); None when
        Slurm stays away or the adapter is stopping."""
        backoff = 1.0
        for _attempt in range(MAX_ATTEMPTS):
            if self._stopping.is_set():
                return None
            try:
                return step()
            except SlurmError as e:
                log.warning(
                    "validating %s (%s): Slurm unavailable (%s); again in %.0f s", node, what, e, backoff
                )
                if self._stopping.wait(backoff):
                    return None
                backoff = min(backoff * 2, 30.0)
        log.error("validating %s: Slurm did not answer for %s; taken up again later", node, what)
        return None

    def _test(self, node: str) -> tuple[bool, str] | None:
        """Steps 1-3: (passed, the summary line); None when the adapter stops. TakenOver when the
        node is not fleetwatch's to test any more."""
        assert self.validator is not None
        info = self.slurm.node(node)
        while info.draining:  # jobs still running: the test waits for them
            if self._stopping.wait(DRAINING_POLL_S):
                return None
            info = self.slurm.node(node)
        taken = self._taken_over(node, info)
        if taken is not None:
            raise TakenOver(taken)
        try:
            self.validator.prepare(node, drained=info.drained)
        except ReservationRefused as e:  # retried every minute for ever before: a failed verdict now
            log.error("cannot reserve %s for its test: %s", node, e)
            return False, f"cannot reserve {node} for its test: {e}"
        outcome, label = self.validator.run(node)
        if self._stopping.is_set():
            return None  # cut short by the stop's scancel: no verdict
        return outcome.passed, self.validator.reason(outcome, label)

    def _taken_over(self, node: str, info: NodeInfo) -> str | None:
        """Why the node, once its jobs have ended, is not fleetwatch's to test any more, or None:
        drained or set DOWN with someone else's Reason, or neither drained nor in our reservation
        (resumed by hand while its jobs drained: reserved and tested anyway, a failure drained it
        again under fleetwatch's Reason)."""
        if info.held_by_others:
            return f"taken over before its test: {info.state}: {info.reason}"
        if not info.drained and not self.slurm.reservation_exists(reservation_name(node)):
            return f"not drained by fleetwatch any more before its test: {info.state}"
        return None

    def _not_ours(self, node: str, rid: str, why: str) -> tuple[str, str]:
        """The validation ends not_ours: the node is left as they made it, and our reservation goes
        (left, only the adapter's user could run jobs there after their RESUME, for ever)."""
        assert self.validator is not None
        self.validator.release(node)
        log.warning("not resuming %s (request %s): %s", node, rid, why)
        return "not_ours", why

    def _carry_out(self, node: str, rid: str, passed: bool, line: str) -> tuple[str, str]:
        """Step 4: pass, the reservation goes; fail, the node is drained again first. Someone who
        took the node over meanwhile (drained it or set it DOWN with a reason of their own, or
        removed our reservation) keeps it: not_ours."""
        assert self.validator is not None
        if passed:
            self.validator.release(node)
            log.info("resume %s done after validation (request %s): %s", node, rid, line)
            return "executed", f"validated: {line}"
        info = self.slurm.node(node)
        if info.held_by_others:
            # a failed test's DRAIN would overwrite their Reason: theirs to decide, told what failed
            why = f"taken over during the validation: {info.state}: {info.reason} (its test: {line})"
            return self._not_ours(node, rid, why)
        if not info.drained and not self.slurm.reservation_exists(reservation_name(node)):
            return "not_ours", "the validation's reservation was removed during the test"
        reason = f"{TAG}: validation failed: {line}"
        self.slurm.drain(node, f"{reason} {reason_token(rid)}", with_token(self.slurm.comment(node), rid))
        self.validator.release(node)
        log.warning("not resuming %s (request %s): %s", node, rid, line)
        return "validation_failed", line

    def deliver_finished(self) -> list[str]:
        """Send the answers of the validations that ended (the main loop, before its flush); the
        journal records them once Kafka has them (acknowledged). Their outcomes."""
        done: list[str] = []
        while True:
            try:
                target, outcome, detail = self._finished.get_nowait()
            except queue.Empty:
                return done
            self._result(target, outcome, detail)
            self._unacked.append((target, outcome, detail))
            done.append(outcome)

    def acknowledged(self, ok: bool) -> None:
        """After the main loop's flush: journal the answers Kafka took; send the others again."""
        unacked, self._unacked = self._unacked, []
        for target, outcome, detail in unacked:
            if not ok:
                self._finished.put((target, outcome, detail))
                continue
            rid = target[0]
            self._forget_running(rid)
            self.journal.finish(rid, JOURNAL_STATUS[outcome], detail, outcome)
            REQUESTS.labels(outcome).inc()

    def settle(self, timeout_s: float = 120.0) -> list[str]:
        """Wait for every running validation and deliver them (tests; a clean stop does not wait)."""
        deadline = time.monotonic() + timeout_s
        done: list[str] = []
        while True:
            done += self.deliver_finished()
            self.acknowledged(not self.producer.flush(10))
            if not self.busy or time.monotonic() > deadline:
                return done
            time.sleep(0.05)

    def recover(self) -> int:
        """The validations journalled `executing` that no thread runs (interrupted by a crash or a
        stop, or given up while Slurm was away) are run again, or answered from what Slurm shows.
        At start, and every RECOVER_EVERY_S from the main loop. Returns how many were taken up."""
        if self.validator is None:
            return 0
        n = 0
        for e in self.journal.executing("resume"):
            if self._running_target(e.request_id) is not None or not e.request_signature:
                continue
            msg = {
                "request_id": e.request_id,
                "node": e.node,
                "action": "resume",
                "signature": e.request_signature,
            }
            try:
                self._validated_resume(
                    b"", msg, self.slurm.node(e.node), "journal", topics.DRAIN, interrupted=True
                )
                n += 1
            except SlurmError as err:
                log.warning("interrupted validation of %s not taken up yet: %s", e.node, err)
        return n

    def stop(self, timeout_s: float = 10.0) -> None:
        """Cancel the running tests (their jobs); they stay `executing` and run again after a restart."""
        self._stopping.set()
        running = self._running_now()
        for target, _t in running:
            self.slurm.cancel_reservation_jobs(reservation_name(target[1]))
        for _target, t in running:
            t.join(timeout_s)

    def _validating(self, node: str) -> str | None:
        """Why a request for a node whose validation (another request's) is under way waits: a
        drain carried out meanwhile was lifted by the validation's own resume of the node before
        its test, and a second resume would test it twice at once. act sends neither (it asks
        nothing of a node it is resuming); another sender, or a backlog, could."""
        for target, _thread in self._running_now():
            if target[1] == node:
                return f"a validation of {node} before its resume is under way"
        return None

    def _deferral(self, info: NodeInfo) -> str | None:
        """Why a request is not carried out now but may be later, or None: an operator's pause in
        force, or the node held in Slurm by people or by Slurm itself (DOWN, FAIL, an active MAINT
        reservation that is not one of the adapter's validations), as act's view classes them
        (slurm_nodes.held_by). A drain over them overwrote the admin's Reason, a RESUME cleared
        their DOWN."""
        pause = self.pause(self.clock())
        if pause is not None:
            return pause.note()
        view = {"state": info.state, "maintenance": False, "features": (), "ours": ours(info.reason)}
        why = held_by(view)
        if why is None:
            try:
                maintenance = self.slurm.maintenance_nodes(except_prefix=RESERVATION_PREFIX)
            except SlurmOutputNotUnderstood as e:
                # Slurm answered, with a reservation's node list this cannot read: not known, so
                # not now (retried, it would end the request `failed` for good); Slurm not
                # answering is an outage, retried as for every other call
                return f"Slurm's maintenance reservations could not be read: {e}"[:300]
            view["maintenance"] = info.name in maintenance
            why = held_by(view)
        if why is None or why == DRAINED_BY_OTHER:  # (refused as not ours before this is asked)
            return None
        reason = f": {info.reason}" if info.reason else ""
        return f"held in Slurm ({why}): {info.state}{reason}"

    def _refuse(self, msg: dict[str, Any], prior: Entry | None, source: str, why: str) -> str:
        self._settle(msg, prior, "not_ours", why, source)
        log.warning("not %s %s (request %s): %s", msg["action"], msg["node"], msg["request_id"], why)
        return self._done(msg, "not_ours", why)


def idle_for(idle_since: float, last_assigned: list[float]) -> float:
    """Seconds idle as --idle-exit counts them; before the first assignment, only past JOIN_WAIT_S."""
    now = time.monotonic()
    if not last_assigned:
        return now - idle_since - JOIN_WAIT_S
    return now - max(idle_since, last_assigned[0])


def run(args: argparse.Namespace) -> int:
    key = drain_request.load_key(args.drain_key_file)
    control_key = load_control_key(args.control_key_file, args.drain_key_file)
    settings = ValidationSettings.from_flags(
        args.validate, args.validate_level, args.validate_command, args.validate_timeout, args.dcgmi
    )
    try:
        # a validation's srun and scancel checked now: missing, every resume retried for ever
        slurm = SlurmClient(args.slurm_conf, tools=VALIDATION_TOOLS if settings.enabled else ())
        known = slurm.nodes()
    except SlurmError as e:
        print(f"fleetwatch slurm-drainer: Slurm is not reachable: {e}", file=sys.stderr)
        return 3
    state_dir = Path(
        args.state_dir or Path(os.environ.get("FLEETWATCH_HOME", ".fleetwatch")) / "slurm-drainer"
    )
    journal = Journal(state_dir / "journal.sqlite")
    bus = KafkaBus(args.bootstrap)
    bus.wait_for_broker(30)
    bus.ensure_topics(
        [args.drain_topic, args.results_topic, topics.DEADLETTER, args.slurm_nodes_topic, args.control_topic]
    )
    # An operator's pause (fleetwatch pause) defers the requests act issued before it: answered
    # `deferred`, nothing done, act asks again once the pause is over. Read to the end once before
    # the first request (below), as act does before its first decision (the switch fails closed);
    # started here, to read while the rest starts.
    pause = PauseBook(
        control_key,
        lambda why: CONTROL_REFUSED.labels(why).inc(),
        read=lambda: control.caught_up.is_set(),
    )
    control = BrokerTimedFollower(args.control_topic, pause.apply, bus)
    control.start()
    serve_metrics(args.metrics_port, args.metrics_addr)
    producer = bus.producer(linger_ms=5)
    # --idle-exit counts from the last record or the last assignment, whichever is later: a group
    # join can take longer than the idle time (librdkafka's first rebalance waits), and a drainer
    # that gave up before it was assigned would leave the topic unread.
    last_assigned: list[float] = []

    def on_assign(parts: list[TopicPart]) -> dict[TopicPart, int]:
        last_assigned[:] = [time.monotonic()]
        # Each batch's offsets are committed once handled, so a new owner starts where the group stands.
        assert consumer is not None  # (subscribed once made)
        return consumer.group_offsets(parts)

    consumer: KafkaGroupConsumer | None = None

    def close() -> None:
        control.stop()
        if consumer is not None:
            consumer.close()
        producer.close(10)
        journal.close()

    stop = StopFlag()
    PAUSED.set(1)  # (fail closed until the switch has been read)
    waited = 0
    while not control.caught_up.wait(1.0) and not stop:
        waited += 1
        if waited % 60 == 10:
            log.error(
                "the control topic %s is not read yet (unreachable, or its ACL missing): no request is "
                "handled until it is",
                args.control_topic,
            )
        if args.idle_exit is not None and waited > args.idle_exit + JOIN_WAIT_S:
            log.error("the control topic %s was never read: exiting (--idle-exit)", args.control_topic)
            stop.set()
    if stop:  # stopped before a request was read: nothing begun, nothing to finish
        close()
        return 0
    # made once it is polled: a client not polled piles up its statistics reports (every 5 s)
    consumer = bus.group_consumer(args.group, client_id=f"slurm-drainer-{socket.gethostname()}")
    consumer.subscribe([args.drain_topic], on_assign, lambda _parts: None)
    drainer = Drainer(
        slurm,
        journal,
        key,
        producer,
        results_topic=args.results_topic,
        max_age_s=args.max_age,
        max_skew_s=args.max_skew,
        validator=Validator(slurm, settings),
        pause=pause.active,
    )
    # Nodes as Slurm shows them, for act (maintenance, down, drained by someone else): read here,
    # where sinfo is, between batches; the batch's flush below delivers them too.
    states = (
        NodeStatePublisher(slurm, producer, key, args.slurm_nodes_topic, every_s=args.node_states_every)
        if args.node_states_every
        else None
    )
    taken_up = drainer.recover()
    if taken_up:
        log.warning("%d validations interrupted before this start taken up again", taken_up)
    log.info(
        "slurm-drainer up: %d Slurm nodes, journal %s, group %s; before a resume: %s",
        len(known),
        state_dir,
        args.group,
        drainer.validator_label(),
    )
    backoff = 1.0
    recover_at = time.monotonic() + RECOVER_EVERY_S
    idle_since = time.monotonic()
    try:
        while not stop:
            PAUSED.set(0 if pause.active(time.time()) is None else 1)
            polled = consumer.poll(100, 0.2)
            if polled:
                idle_since = time.monotonic()
            elif drainer.busy:
                idle_since = time.monotonic()  # a validation running is not idle
            elif args.idle_exit is not None and idle_for(idle_since, last_assigned) > args.idle_exit:
                break
            done: dict[TopicPart, int] = {}
            retry_at: dict[TopicPart, int] = {}
            acted = False  # Slurm's view of a node changed by the adapter's hand
            for tp, block in polled.items():
                for k, offset in enumerate(block.offsets.tolist()):
                    try:
                        outcome = drainer.handle(
                            block.value(k), f"{tp.topic}:{tp.partition}:{offset}", tp.topic, block.key(k)
                        )
                        acted = acted or outcome == "executed"
                    except Retry as e:
                        log.warning("Slurm unavailable (%s); retrying in %.0f s", e, backoff)
                        retry_at[tp] = offset
                        break
                    done[tp] = offset + 1
            # validations that ended on their threads: journal, results
            acted = bool(drainer.deliver_finished()) or acted
            # the view at once after the adapter changed a node, not at the next period: a drain
            # lifted by hand within the period would otherwise show no change at all, and the
            # accounting stage, which ends a drain at the view showing the node back in service,
            # would count it drained until the next one
            if states is not None and (acted or states.due()):
                states.publish()
            # Results and dead letters first, then the commit that forgets the input.
            unsent = producer.flush(30)
            drainer.acknowledged(not unsent)  # validations' answers: journalled once Kafka has them
            if time.monotonic() >= recover_at:
                recover_at = time.monotonic() + RECOVER_EVERY_S
                drainer.recover()
            if unsent:
                # Not committed: the batch is read again once Kafka answers, and its requests,
                # journalled now, are answered from the journal (a signed `duplicate` result).
                log.warning(
                    "%d results or dead letters were not acknowledged by Kafka; reading their batch again",
                    len(unsent),
                )
                done = {}
                retry_at = {tp: int(block.offsets[0]) for tp, block in polled.items()}
            if done:
                consumer.commit(done, asynchronous=False)
            for tp, off in retry_at.items():
                consumer.seek(tp, off)
            if retry_at:
                if stop.wait(backoff):
                    break
                backoff = min(backoff * 2, 30.0)
            else:
                backoff = 1.0
    finally:
        drainer.stop()  # (its running validations first: they use the journal)
        close()
    return 0
