"""`squeue --json` answers -> SlurmJob, for Slurm 22.05 (OpenAPI v0.0.38) and the newer data
parsers (v0.0.39 on, Slurm 23.02+), which changed several field shapes:

| field | 22.05 | 23.02 and newer |
|---|---|---|
| job_state | "RUNNING" | ["RUNNING"] or ["RUNNING", "COMPLETING"] (state plus flags) |
| start_time, end_time | 1796390745 | {"set": true, "infinite": false, "number": 1796390745} |
| exit_code | 256 (wait status: code << 8, or signal) | {"status", "return_code", "signal"} objects |
| restart_cnt | 0 | 0 or {"set": true, "number": 0} |

Each job is parsed on its own: one job that does not parse is reported with its raw JSON and the
others are still taken. An answer that is not a squeue document at all (not JSON, no `jobs`, a
non-empty `errors`) is refused whole.
"""

from __future__ import annotations

import json
import re
from typing import Any

from fleetwatch.collectors.slurm_jobs.model import (
    ACTIVE,
    ENDED,
    WAITING,
    SlurmJob,
    SlurmParseError,
    expand_nodes,
    job_id,
    state_name,
)
from fleetwatch.schemas import MAX_GPUS

MAX_ANSWER_BYTES = 256 << 20  # a 100k-job queue is ~300 MB of JSON in 22.05: refuse beyond this
# "gpu:4(IDX:0-3)", "gpu:a100:4(IDX:0,2-3)", "gpu:(null):4(IDX:0-3)"; another gres may follow a comma
_GPU_GRES = re.compile(r"(?:^|,)gpu(?::[^:(),]+|:\(null\))?:(\d+)")
_BASE_STATES = ACTIVE | ENDED | WAITING
NO_TIME = 0xFFFFFFFE  # Slurm's NO_VAL; INFINITE is 0xffffffff: a time at or past it is no time


def parse(answer: bytes) -> tuple[list[SlurmJob], list[SlurmParseError]]:
    """The jobs of one squeue --json answer, and an error for each job that did not parse."""
    if len(answer) > MAX_ANSWER_BYTES:
        raw = answer[:2000].decode(errors="replace")
        raise SlurmParseError("squeue", f"answer of {len(answer)} bytes", raw)
    try:
        # Slurm writes a job's name, comment and paths as the user gave them, bytes past UTF-8
        # included (json-c passes them through): read with replacement, such a byte spoils only
        # its own string (a node name with one is refused with its job), not the whole answer
        doc = json.loads(answer.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError) as e:
        raise SlurmParseError("squeue", f"not JSON: {e}", answer[:2000].decode(errors="replace")) from e
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list):
        raise SlurmParseError("squeue", "no jobs list", answer[:2000].decode(errors="replace"))
    if doc.get("errors"):
        raise SlurmParseError("squeue", f"slurm reported errors: {doc['errors']!r:.500}", "")
    jobs: list[SlurmJob] = []
    errors: list[SlurmParseError] = []
    for entry in doc["jobs"]:
        try:
            jobs.append(parse_job(entry))
        except SlurmParseError as e:
            jid = entry.get("job_id") if isinstance(entry, dict) else None
            if isinstance(jid, int) and not isinstance(jid, bool):
                e.job = str(jid)  # still listed: the publisher must not take it for vanished
            errors.append(e)
    return jobs, errors


def parse_job(entry: Any) -> SlurmJob:
    raw = _raw(entry)
    if not isinstance(entry, dict):
        raise SlurmParseError("job", "a job entry is not an object", raw)
    try:
        state = _state(entry.get("job_state"), raw)
        nodes_text = entry.get("nodes", "")
        if not isinstance(nodes_text, str):
            raise SlurmParseError("job", "nodes is not a string", raw)
        nodes = expand_nodes(nodes_text, raw)
        _check_allocation(entry, nodes, raw)
        exit_code, signal = _exit(entry.get("exit_code"), raw)
        return SlurmJob(
            job=job_id(entry.get("job_id"), raw),
            state=state,
            nodes=nodes,
            gpus=_gpus(entry, nodes, raw),
            start_ts=_time(entry.get("start_time"), raw),
            end_ts=_time(entry.get("end_time"), raw) if state in ENDED else None,
            exit_code=exit_code if state in ENDED else None,
            signal=signal if state in ENDED else None,
            restarts=_number(entry.get("restart_cnt", 0), raw) or 0,
        )
    except (TypeError, KeyError, AttributeError) as e:  # a field of an unexpected shape
        raise SlurmParseError("job", f"{type(e).__name__}: {e}", raw) from e


def _raw(entry: Any) -> str:
    try:
        return json.dumps(entry)[:2000]
    except (TypeError, ValueError):
        return repr(entry)[:2000]


def _number(value: Any, raw: str) -> int | None:
    """An integer field, plain (22.05) or {"set", "infinite", "number"} (newer); None if unset."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite", False):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int):
        raise SlurmParseError("job", f"{value!r:.80} is not an integer", raw)
    return value


def _time(value: Any, raw: str) -> float | None:
    t = _number(value, raw)
    # 0 is "not yet"; 22.05 gives a running job's end_time as start + time limit (or a year on);
    # NO_VAL and INFINITE (0xfffffffe, 0xffffffff, and their 64-bit forms) are no time at all
    return float(t) if t is not None and 0 < t < NO_TIME else None


def _state(value: Any, raw: str) -> str:
    if isinstance(value, str):
        return state_name(value, raw)
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        # newer Slurm: the base state first, then flags (COMPLETING, REQUEUED, ...)
        names = [state_name(v, raw) for v in value]
        base = [n for n in names if n in _BASE_STATES and n not in ("COMPLETING", "REQUEUED")]
        if "COMPLETING" in names:  # still holds its nodes; its end is reported when it clears
            return "COMPLETING"
        return base[0] if base else names[0]
    raise SlurmParseError("job", f"job_state {value!r:.80} is neither a name nor a list of names", raw)


def _exit(value: Any, raw: str) -> tuple[int | None, int | None]:
    """(exit code, signal). 22.05 gives the wait status; newer Slurm spells both out."""
    if value is None:
        return None, None
    if isinstance(value, dict):
        code = _number(value.get("return_code", {"set": False}), raw)
        sig = value.get("signal", {})
        signal = _number(sig.get("id", {"set": False}), raw) if isinstance(sig, dict) else None
        return code, signal or None
    status = _number(value, raw)
    if status is None:
        return None, None
    if status & 0x7F:  # killed by a signal (WIFSIGNALED)
        return None, status & 0x7F
    return (status >> 8) & 0xFF, None


def _allocated(entry: dict[str, Any]) -> list[Any] | None:
    """The allocated nodes' names one by one where the answer lists them, in Slurm's node order
    (slurm.conf's), the order of gres_detail too."""
    res = entry.get("job_resources")
    if not isinstance(res, dict):
        return None
    alloc = res.get("allocated_nodes")  # 22.05: [{"nodename": ...}]
    names = [a.get("nodename") for a in alloc if isinstance(a, dict)] if isinstance(alloc, list) else None
    if not names and isinstance(res.get("nodes"), dict):  # 23.11+: nodes.allocation[].name
        alloc = res["nodes"].get("allocation")
        names = [a.get("name") for a in alloc if isinstance(a, dict)] if isinstance(alloc, list) else None
    return names


def _check_allocation(entry: dict[str, Any], nodes: tuple[str, ...], raw: str) -> None:
    """Where the answer also lists the allocated nodes one by one, they must be `nodes`."""
    names = _allocated(entry)
    if names and sorted(names, key=str) != sorted(nodes):
        raise SlurmParseError("job", f"nodes {nodes[:4]}... differ from the allocation {names[:4]}...", raw)


def _gpus(entry: dict[str, Any], nodes: tuple[str, ...], raw: str) -> tuple[int, ...] | None:
    """GPUs on each of `nodes`: from gres_detail (one entry per node, while the job runs), else from
    a per-node request (tres_per_node "gres:gpu:4" in 22.05, "gres/gpu:4" later).

    gres_detail follows Slurm's node order (slurm.conf's) and `nodes` the host list's, which Slurm
    prints sorted: where slurm.conf does not list its nodes sorted the two differ, and a job on an
    8-GPU and a 4-GPU node had its counts swapped. The allocated nodes, listed one by one in
    Slurm's order, pair each entry with its node."""
    if not nodes:
        return None
    detail = entry.get("gres_detail")
    if isinstance(detail, list) and len(detail) == len(nodes) and all(isinstance(d, str) for d in detail):
        counts = [_gpu_count(d.replace("gres/", ""), raw) for d in detail]
        names = _allocated(entry)  # the same nodes as `nodes` (_check_allocation), in detail's order
        if names and len(names) == len(nodes):
            by_name = dict(zip(names, counts, strict=True))
            return tuple(by_name[n] for n in nodes)
        return tuple(counts)
    per = entry.get("tres_per_node")
    if isinstance(per, str) and _GPU_GRES.search(per.replace("gres:", "").replace("gres/", "")):
        return (_gpu_count(per.replace("gres:", "").replace("gres/", ""), raw),) * len(nodes)
    return None


def _gpu_count(text: str, raw: str) -> int:
    count = sum(int(m) for m in _GPU_GRES.findall(text[:1000]))
    if count > MAX_GPUS:
        raise SlurmParseError("job", f"{count} GPUs on one node", raw)
    return count
