"""Talking to Slurm through its own CLI: `sinfo` to read nodes, `scontrol update` to drain/resume.

Always argv lists, never a shell: a node name or reason can then never become a command. Node names
are checked against fleetwatch.schemas.NAME_RE before they get here (drain/1 validation) and
against the nodes Slurm knows before any update. pyslurm has no release for Slurm 22.05, and the
CLI is the interface Slurm keeps stable.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import IO

import hostlist

from fleetwatch.slurm_state import DOWN_STATES, DRAINED_STATES, state_is, state_parts

log = logging.getLogger(__name__)

_FIELD_END = "\x1e"  # ASCII record separator: a suffix sinfo -O appends to each field
MAX_OUTPUT_BYTES = 4 * 1024 * 1024  # of each stream of a validation's output kept (the rest is dropped)
_READ_CHUNK = 64 * 1024
_READER_JOIN_S = 5.0  # how long the output of a job that has ended may take to drain
# sinfo -N, one row per node and partition: name, state, features, then the reason, which is free
# text (it may hold newlines, or "|"); each field ends with _FIELD_END, so none can pass for a row
_NODE_FIELDS = ("NodeList", "StateLong", "Features", "Reason")
TAG = "fleetwatch"  # every reason fleetwatch writes starts with it; resume only lifts those drains
# ... and ends with its request's token: a human's "fleetwatch false positive? keep drained" starts
# with the word too, and must not be taken for fleetwatch's drain (lifted by a resume, overwritten)
_OURS_RE = re.compile(r"\[fw:[0-9a-f]{12}\]\Z")


def reason_token(request_id: str) -> str:
    """What ends every Reason fleetwatch writes: its request's id, shortened (Slurm shows Reasons in
    narrow columns). `ours` looks for it."""
    return f"[fw:{request_id[:12]}]"


def ours(reason: str) -> bool:
    """Whether a drain's Reason is one fleetwatch wrote: TAG first, its request's token last."""
    return reason.startswith(TAG) and _OURS_RE.search(reason.rstrip()) is not None


class SlurmError(RuntimeError):
    pass


class SlurmOutputNotUnderstood(SlurmError):
    """Slurm answered, with something this cannot read (a reservation's node list): not an outage
    to wait out by retrying."""


class ReservationsNotUnderstood(SlurmOutputNotUnderstood):
    """Some reservation's node list could not be read; `nodes`: the MAINT nodes of the others (one
    unreadable reservation must not hide what the rest say)."""

    def __init__(self, message: str, nodes: set[str]) -> None:
        super().__init__(message)
        self.nodes = nodes


class ReservationRefused(Exception):
    """Slurm refused the validation's reservation for a reason that retrying does not change (the
    configured user does not exist, the adapter's account may not create reservations, the node
    is unknown): not an outage to wait out."""


# scontrol's answers that stay the same however often it is asked (Slurm's own error strings)
_LASTING_REFUSALS = ("Invalid user id", "Access/permission denied", "Invalid node name")


class JobTimeout(Exception):
    """A job (the validation) ran past its time and was cancelled: the job's failure, not Slurm's."""


@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: str  # sinfo %T, e.g. idle, drained, draining, mixed, idle*, idle+drain
    reason: str  # sinfo's Reason, whole ("" when unset)

    @property
    def drained(self) -> bool:
        """Drained or draining (the drain flag, in any part of a compound state)."""
        return state_is(self.state, *DRAINED_STATES)

    @property
    def draining(self) -> bool:
        """Drained with jobs still running on it (draining, mixed+drain, allocated+drain)."""
        parts = state_parts(self.state)
        busy = any(part.startswith(("mix", "alloc", "completing")) for part in parts)
        return "draining" in parts or (self.drained and busy)

    @property
    def down(self) -> bool:
        """DOWN or FAIL (people or Slurm hold it), in any part of a compound state."""
        return state_is(self.state, *DOWN_STATES)

    @property
    def held_by_others(self) -> bool:
        """Drained or down under a Reason fleetwatch did not write: theirs, not to be tested,
        resumed or drained again over them."""
        return (self.drained or self.down) and not ours(self.reason)


class JobOutput(subprocess.CompletedProcess[str]):
    """A job's exit status and output; `truncated`: a stream printed more than MAX_OUTPUT_BYTES,
    and only that much of it was kept."""

    def __init__(self, args: list[str], returncode: int, stdout: str, stderr: str, truncated: bool) -> None:
        super().__init__(args, returncode, stdout, stderr)
        self.truncated = truncated


class _CappedReader(threading.Thread):
    """Reads a pipe to its end, keeping its first `limit` bytes: the rest is read and dropped, so a
    job that prints without end neither blocks on a full pipe nor fills this host."""

    def __init__(self, stream: IO[bytes], limit: int) -> None:
        super().__init__(daemon=True)
        self.stream, self.limit = stream, limit
        self.kept = bytearray()
        self.truncated = False

    def run(self) -> None:
        with self.stream:
            while chunk := self.stream.read(_READ_CHUNK):
                room = self.limit - len(self.kept)
                if room > 0:
                    self.kept += chunk[:room]
                if len(chunk) > room:
                    self.truncated = True

    def text(self) -> str:
        return bytes(self.kept).decode("utf-8", "replace")


def _one_row(text: str) -> str:
    """The field of a one-field sinfo -O output that repeats it once per partition ("C<sep>\\n" k
    times): the shortest row that, repeated, makes the whole. The field may hold the separator
    itself (cut at its first one, an operator's Comment was written back cut); where no row
    repeats, all of it up to its last separator."""
    # Its rows, repeated, make the whole: all are powers of the text's shortest root, whose length
    # is the first place the text recurs in itself doubled (linear: str.find's two-way search), and
    # they all end as that root does. (Trying each separator as a row's end copied the text up to
    # it: 30 s for 1 MB of separators; then each divisor of the length: 0.8 s at 2.9 MB.)
    root = (text + text).find(text, 1) if text else -1
    if root >= 2 and text[root - 2 : root] == _FIELD_END + "\n":
        return text[: root - 2]
    return text[: text.rfind(_FIELD_END)]


def _sinfo_rows(text: str) -> list[tuple[str, str, str, str]]:
    """The rows of `sinfo -N -O` with _NODE_FIELDS, each field ended by the separator: name, state
    and features hold no newline and no separator; the reason is free text (newlines, even the
    separator) that ends at the separator after which a row starts (three plain fields) or the
    answer ends (and the row's newline). Text that is no row is skipped: a row starts after the
    last newline of a field (or at the answer's start).

    Linear in the answer's size, whatever it holds: a regex search restarted at each character took
    30 s on 100 KB that held no separator."""
    parts = text.split(_FIELD_END)  # parts[:-1] each end at a separator; parts[-1] follows the last
    fields = len(parts) - 1
    plain = ["\n" not in p for p in parts]

    def row_follows(k: int) -> bool:
        """Three plain fields start at part k: part k less one leading newline (the row before
        ends with it), and the two after."""
        if k + 2 >= fields:
            return False
        return "\n" not in parts[k].removeprefix("\n") and plain[k + 1] and plain[k + 2]

    # next_end[j]: the first j' >= j at whose separator a reason may end (a row or the answer's end
    # follows it), or -1; found from the back in one pass
    next_end = [-1] * (fields + 1)
    for j in range(fields - 1, -1, -1):
        at_end = j + 1 == fields and parts[fields] in ("", "\n")
        next_end[j] = j if at_end or row_follows(j + 1) else next_end[j + 1]
    rows: list[tuple[str, str, str, str]] = []
    i = 0
    while i + 3 < fields:
        name = parts[i].rpartition("\n")[2]
        end = next_end[i + 3]
        if not (plain[i + 1] and plain[i + 2]) or end == -1:
            i += 1  # no row starts here: the next may start in the next part
            continue
        reason = _FIELD_END.join(parts[i + 3 : end + 1])
        rows.append((name, parts[i + 1], parts[i + 2], reason))
        i = end + 1
    return rows


def _reservation_fields(line: str) -> dict[str, str]:
    """One reservation of `scontrol show reservation -o`: its fields up to its Comment, which Slurm
    prints last and which is free text (a "State=" or "Nodes=" in it must not pass for a field)."""
    fixed = line.split(" Comment=", 1)[0]
    return dict(kv.split("=", 1) for kv in fixed.split() if "=" in kv)


class SlurmClient:
    def __init__(
        self,
        slurm_conf: str | None = None,
        timeout_s: float = 30.0,
        node_cache_s: float = 60.0,
        tools: tuple[str, ...] = (),
    ) -> None:
        """`tools`: the other Slurm commands the caller needs (a validation's srun and scancel),
        checked here with sinfo and scontrol: one missing is found at start, not by each request."""
        for tool in ("sinfo", "scontrol", *tools):
            if shutil.which(tool) is None:
                raise SlurmError(f"{tool} not found (apt-get install slurm-client)")
        self.env = dict(os.environ)
        if slurm_conf:
            self.env["SLURM_CONF"] = slurm_conf
        self.timeout_s = timeout_s
        self.node_cache_s = node_cache_s
        self._nodes: set[str] = set()
        self._nodes_at = 0.0

    def _run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        try:
            # errors="replace": a node's Reason or Comment is whatever an admin typed, in any
            # encoding; strict UTF-8 raised out of every sinfo, the adapter exiting at each restart
            return subprocess.run(
                argv,
                env=self.env,
                capture_output=True,
                text=True,
                encoding="utf-8",
                errors="replace",
                timeout=self.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{argv[0]} did not answer in {self.timeout_s:.0f} s") from None
        except OSError as e:  # the tool gone, no memory to start it: Slurm unusable for now, retried
            raise SlurmError(f"{argv[0]} could not be run: {e}") from None

    def nodes(self, refresh: bool = False) -> set[str]:
        """Node names Slurm knows (cached; refreshed when asked or when the cache is old)."""
        if refresh or not self._nodes or time.monotonic() - self._nodes_at > self.node_cache_s:
            r = self._run(["sinfo", "-h", "-N", "-o", "%N"])
            if r.returncode != 0:
                raise SlurmError(f"sinfo failed (rc {r.returncode}): {r.stderr.strip()[:300]}")
            self._nodes = {line.strip() for line in r.stdout.splitlines() if line.strip()}
            self._nodes_at = time.monotonic()
        return self._nodes

    def knows(self, node: str) -> bool:
        return node in self.nodes() or node in self.nodes(refresh=True)

    def _node_line(self, node: str, *fmt: str) -> str:
        """sinfo's first line for one node in the format `fmt` (one line per partition it is in)."""
        r = self._run(["sinfo", "-h", "-N", "-n", node, *fmt])
        if r.returncode != 0 or not r.stdout.strip():
            raise SlurmError(f"sinfo -n {node} failed (rc {r.returncode}): {r.stderr.strip()[:300]}")
        return r.stdout.splitlines()[0]

    def node(self, node: str) -> NodeInfo:
        """The node's state and Reason ("" when it has none), read as node_states reads every node's:
        an operator's Reason with a line break is whole (its first line was kept)."""
        rows = self._node_rows("-n", node)
        if node not in rows:
            raise SlurmError(f"sinfo -n {node}: no such node in its answer")
        return rows[node][0]

    def comment(self, node: str) -> str:
        """The node's Comment ("" when unset), all of it: an operator's may span lines, and sinfo
        prints it as it is (its first line alone was kept, and the drain wrote it back so). Slurm
        keeps it across a RESUME (checked on 22.05), which is why the drainer records its request
        id there (alerts/slurm_drainer.py)."""
        # `:0` = unpadded; the suffix ends the field, wherever its lines end (one row per partition)
        r = self._run(["sinfo", "-h", "-N", "-n", node, "-O", f"Comment:0{_FIELD_END}"])
        if r.returncode != 0 or _FIELD_END not in r.stdout:
            raise SlurmError(f"sinfo -n {node} failed (rc {r.returncode}): {r.stderr.strip()[:300]}")
        text = _one_row(r.stdout).strip()
        return "" if text == "(null)" else text

    def update(self, node: str, state: str, reason: str | None = None, comment: str | None = None) -> None:
        argv = ["scontrol", "update", f"NodeName={node}", f"State={state}"]
        if reason is not None:
            argv.append(f"Reason={reason}")  # one argv element: spaces are fine, no quoting needed
        if comment is not None:
            argv.append(f"Comment={comment}")  # same update message as the state: applied together
        r = self._run(argv)
        if r.returncode != 0:
            raise SlurmError(f"scontrol update {node} State={state} failed: {r.stderr.strip()[:300]}")

    def node_states(self) -> list[tuple[NodeInfo, tuple[str, ...]]]:
        """Every node with its state, reason and features (one sinfo call)."""
        return list(self._node_rows().values())

    def _node_rows(self, *select: str) -> dict[str, tuple[NodeInfo, tuple[str, ...]]]:
        """sinfo -N's nodes (`select`: e.g. -n NODE) with their state, reason ("" for sinfo's
        "none") and features, by name: `-N` repeats a node once per partition, the first is kept."""
        fields = ",".join(f"{field}:0{_FIELD_END}" for field in _NODE_FIELDS)
        r = self._run(["sinfo", "-h", "-N", *select, "-O", fields])
        if r.returncode != 0:
            where = f" {' '.join(select)}" if select else ""
            raise SlurmError(f"sinfo{where} failed (rc {r.returncode}): {r.stderr.strip()[:300]}")
        out: dict[str, tuple[NodeInfo, tuple[str, ...]]] = {}
        for row in _sinfo_rows(r.stdout):
            name, state, features, reason = (p.strip() for p in row)
            if not name or name in out:
                continue
            feats = () if features in ("", "(null)") else tuple(f for f in features.split(",") if f)
            out[name] = (NodeInfo(name, state, "" if reason == "none" else reason), feats)
        return out

    def maintenance_nodes(self, except_prefix: str = "") -> set[str]:
        """Nodes of the ACTIVE reservations flagged MAINT (scontrol show reservation, one per line),
        but those named `except_prefix...` (the adapter's own validations). A reservation whose
        node list cannot be read raises ReservationsNotUnderstood, with the nodes of the others."""
        r = self._run(["scontrol", "show", "reservation", "-o"])
        if r.returncode != 0:
            if "No reservations" in r.stdout + r.stderr:
                return set()
            raise SlurmError(
                f"scontrol show reservation failed (rc {r.returncode}): {r.stderr.strip()[:300]}"
            )
        nodes: set[str] = set()
        unread: list[str] = []
        for line in r.stdout.splitlines():
            fields = _reservation_fields(line)
            flags = set(fields.get("Flags", "").split(","))
            ours = bool(except_prefix) and fields.get("ReservationName", "").startswith(except_prefix)
            if (
                not ours
                and fields.get("State") == "ACTIVE"
                and "MAINT" in flags
                and fields.get("Nodes", "(null)") != "(null)"
            ):
                try:
                    nodes.update(hostlist.expand_hostlist(fields["Nodes"]))
                except (hostlist.BadHostlist, RecursionError, ValueError, OverflowError) as e:
                    # (a range bound of thousands of digits is past int(): ValueError)
                    why = str(e)[:200] or type(e).__name__
                    unread.append(f"{fields.get('ReservationName', '?')[:80]}: {why}")
        if unread:
            raise ReservationsNotUnderstood(
                f"a reservation's node list not understood ({'; '.join(unread[:3])})", nodes
            )
        return nodes

    # ------------------------------------------------------------ validation (alerts/validation.py)

    def placement(self, node: str) -> tuple[int, str | None]:
        """(the node's configured GPU count, a partition it is in): what a job that must take the
        whole node needs. sinfo %G is gpu:8, gpu:a100:8(S:0-1), ... (0 for none); %P its first
        partition (the default one marked *)."""
        gres, _, partitions = self._node_line(node, "-o", "%G|%P").partition("|")
        total = 0
        for entry in gres.split(","):
            parts = entry.strip().split("(")[0].split(":")
            if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
                total += int(parts[-1])
        first = partitions.split()[0].rstrip("*") if partitions.split() else ""
        return total, first or None

    def reservation_exists(self, name: str) -> bool:
        """Whether Slurm has the reservation. Only Slurm's own "Reservation NAME not found" (exit 1,
        scontrol/info_res.c) means it has not: any other failure (slurmctld not answering) raises
        SlurmError. Taken for absent, it ended a failed test `rejected_not_ours` with the node left
        in service inside a reservation without end."""
        r = self._run(["scontrol", "show", "reservation", name, "-o"])
        if r.returncode == 0 and f"ReservationName={name} " in r.stdout:
            return True
        if r.returncode != 0 and f"Reservation {name} not found" in r.stdout + r.stderr:
            return False
        raise SlurmError(
            f"scontrol show reservation {name} failed (rc {r.returncode}): "
            f"{(r.stderr.strip() or r.stdout.strip())[:300]}"
        )

    def create_reservation(self, name: str, node: str, user: str) -> None:
        """A MAINT reservation of `node` for `user` from now, with no end: no job but that user's can
        start there until it is deleted (an adapter that dies in the middle leaves the node held,
        never open untested). IGNORE_JOBS: it is made while the node is drained, whatever jobs are
        still ending on it."""
        argv = [
            "scontrol",
            "create",
            "reservation",
            f"ReservationName={name}",
            f"Nodes={node}",
            "StartTime=now",
            "Duration=UNLIMITED",
            f"Users={user}",
            "Flags=MAINT,IGNORE_JOBS",
        ]
        r = self._run(argv)
        if r.returncode != 0:
            said = (r.stderr.strip() or r.stdout.strip())[:300]
            if any(refusal in said for refusal in _LASTING_REFUSALS):
                raise ReservationRefused(said)
            raise SlurmError(f"scontrol create reservation {name} failed: {said}")

    def delete_reservation(self, name: str) -> None:
        r = self._run(["scontrol", "delete", f"ReservationName={name}"])
        if r.returncode != 0 and self.reservation_exists(name):
            raise SlurmError(f"scontrol delete reservation {name} failed: {r.stderr.strip()[:300]}")

    def run_on(
        self,
        node: str,
        reservation: str,
        argv: list[str],
        timeout_s: float,
        gpus: int = 0,
        partition: str | None = None,
    ) -> JobOutput:
        """Run `argv` as a one-task job on `node` inside `reservation` (srun: its output and exit
        status come back here); the whole node and all its GPUs, so the test sees every GPU and
        nothing else runs beside it. Past timeout_s the job is cancelled and JobTimeout says so."""
        minutes = max(1, int(timeout_s // 60) + 1)
        cmd = [
            "srun",
            f"--reservation={reservation}",
            f"--nodelist={node}",
            "--nodes=1",
            "--ntasks=1",
            "--exclusive",
            f"--time={minutes}",
            f"--job-name={reservation}",
            "--quiet",
        ]
        if gpus:
            cmd.append(f"--gres=gpu:{gpus}")
        if partition:
            cmd.append(f"--partition={partition}")
        # Output through pipes, each kept up to MAX_OUTPUT_BYTES and the rest dropped: whatever the
        # node prints fills neither this process nor this host's disk
        proc = subprocess.Popen(
            [*cmd, *argv], env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0
        )
        readers = [_CappedReader(stream, MAX_OUTPUT_BYTES) for stream in (proc.stdout, proc.stderr) if stream]
        for reader in readers:
            reader.start()
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            self.cancel_reservation_jobs(reservation)  # srun is killed; its job too
            raise JobTimeout(f"the validation on {node} did not finish in {timeout_s:.0f} s") from None
        finally:
            for reader in readers:
                reader.join(_READER_JOIN_S)
        out, err = readers
        return JobOutput(cmd, rc, out.text(), err.text(), out.truncated or err.truncated)

    def cancel_reservation_jobs(self, reservation: str) -> None:
        """scancel every job of `reservation` (a validation cut short by a stop); best effort."""
        try:
            self._run(["scancel", f"--reservation={reservation}"])
        except SlurmError as e:
            log.warning("could not cancel the jobs of %s: %s", reservation, e)

    def drain(self, node: str, reason: str, comment: str | None = None) -> None:
        self.update(node, "DRAIN", reason, comment)

    def resume(self, node: str) -> None:
        self.update(node, "RESUME")
