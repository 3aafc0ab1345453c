"""Message schemas of docs/contract.md ("Messages") and their validation.

Messages travel as JSON objects and are handled as plain dicts (cheap to build and to
serialise). `decode()` turns raw Kafka bytes into a validated dict or raises
`MessageError`, whose `reason` is one of `REASONS`: a short, fixed label that the
dead-letter topic and the rejected-message counters use, so the label set stays bounded.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from fleetwatch import strict_json

TELEMETRY = "telemetry/1"
JOB = "job/1"
STEP = "step/1"
TRUTH = "truth/1"
NODE_FEATURES = "nodefeatures/1"  # internal: per-node signals re-keyed by job for peer comparison

MAX_MESSAGE_BYTES = 1 << 20  # a telemetry/1 message of 8 GPUs is ~3 KiB; 1 MiB is a generous cap
# Bounds on list sizes and GPU indices: detectors size arrays by them, so one message claiming GPU
# index 10^9 must be rejected, not allocated. Real nodes have 4-16 GPUs and a few NICs.
MAX_GPU_INDEX = 63
MAX_GPUS = 64
MAX_PORTS = 256
MAX_XIDS = 1024  # XID events of one GPU in one sample (the NVML collector drains at most 1024)
# Integers have declared ranges: detectors hold them in int64/float64 arrays, and one value beyond
# them must be refused here, not overflow there. A GPU counter's range is its NVML field's C type
# (unsigned long long: 64-bit, unsigned int: 32-bit; its "not available" sentinel, -1 in that type,
# is handled as absent: detectors.batch); other counters are unsigned 64-bit; seq and steps int64.
U64_MAX = 2**64 - 1
U32_MAX = 2**32 - 1
I64_MAX = 2**63 - 1
MAX_XID = 2**32 - 1  # XIDs are small numbers (1-160 today) in the driver's 32-bit field
MAX_PORT_NUMBER = 65535
MAX_RANK = 2**31 - 1
MAX_JOB_NODES = 32768  # a job of 256k GPUs; the 1 MiB message cap bounds it anyway
# Strings have lengths: a 400 KB port name must not become a 1.2 MB finding (evidence quotes it).
MAX_ID_LEN = 128  # uuid, IB device/port/state, interface names: real ones are < 64 characters
MAX_SOURCE_ERRORS = 16  # agent.source_errors entries (one per collector source)
MAX_ERROR_LEN = 512  # one source error's text

REASONS = (
    "oversized",
    "not_utf8",
    "not_json",
    "not_object",
    "unknown_schema",
    "missing_field",
    "wrong_type",
    "out_of_range",
    "clock_skew",
    "duplicate_key",
    "key_mismatch",
    "internal_error",
    # refused by a task after decoding (pipeline/tasks.Refused): a step or node-feature record for
    # a node its job's job/1 does not list, or for a job no job/1 named in time
    "not_in_job",
    "unknown_job",
    # refused by act (alerts/actor.py): a finding/1 without a `sig`, or one that does not verify
    # under detect's key (issue 23)
    "unsigned",
    "bad_signature",
    # refused by the node stage (pipeline/node_stage.py): a sample of a new node name past the
    # names one partition holds (max_nodes)
    "too_many_nodes",
)

# Node and job names end up in Kafka keys, Prometheus labels and scontrol argv: keep them plain.
# \\Z, not $: "$" also matches before a final newline, so "node\\n" would pass.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,252}\Z"
NAME_RE = re.compile(NAME_PATTERN)
SLURM_STATE_RE = re.compile(r"[A-Z_]{1,32}\Z")  # COMPLETED, NODE_FAIL, OUT_OF_MEMORY, ...


class MessageError(ValueError):
    """A message that cannot be accepted; `reason` is one of REASONS."""

    def __init__(self, reason: str, detail: str) -> None:
        assert reason in REASONS, reason
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.skew_s: float | None = None  # clock_skew: the message's time - its reference time


# ---------------------------------------------------------------- field checks


def _number(where: str, value: Any, lo: float | None = None, hi: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MessageError("wrong_type", f"{where} must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise MessageError("out_of_range", f"{where} must be finite, got {value}")
    if lo is not None and value < lo:
        raise MessageError("out_of_range", f"{where} must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise MessageError("out_of_range", f"{where} must be <= {hi}, got {value}")


def _integer(where: str, value: Any, lo: int = 0, hi: int = I64_MAX) -> None:
    if isinstance(value, float) and value.is_integer() and abs(value) >= 2**63:
        # orjson reads an integer beyond 64 bits as a float: say what it was
        raise MessageError("out_of_range", f"{where} must be in [{lo}, {hi}], got {value:.6g}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise MessageError("wrong_type", f"{where} must be an integer, got {type(value).__name__}")
    if value < lo:
        raise MessageError("out_of_range", f"{where} must be >= {lo}, got {str(value)[:40]}")
    if value > hi:
        raise MessageError("out_of_range", f"{where} must be <= {hi}, got {str(value)[:40]}")


def _string(where: str, value: Any, max_len: int | None = None) -> None:
    if not isinstance(value, str):
        raise MessageError("wrong_type", f"{where} must be a string, got {type(value).__name__}")
    if max_len is not None and len(value) > max_len:
        raise MessageError("out_of_range", f"{where} has {len(value)} characters, more than {max_len}")


def _ident(where: str, value: Any) -> None:
    """An identifier a collector reports (uuid, IB device, port state, interface): a short string."""
    _string(where, value, MAX_ID_LEN)


def _name(where: str, value: Any) -> None:
    _string(where, value)
    if not NAME_RE.match(value):
        raise MessageError("out_of_range", f"{where} {value[:64]!r} is not a valid name ({NAME_RE.pattern})")


def _object(where: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise MessageError("wrong_type", f"{where} must be an object, got {type(value).__name__}")
    return value


def _list(where: str, value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise MessageError("wrong_type", f"{where} must be an array, got {type(value).__name__}")
    return value


def _required(obj: Mapping[str, Any], where: str, fields: tuple[str, ...]) -> None:
    for f in fields:
        if f not in obj:
            raise MessageError("missing_field", f"{where}.{f} is required")


Check = Callable[[str, Any], None]


def _pct(where: str, v: Any) -> None:
    _number(where, v, 0, 100)


def _frac(where: str, v: Any) -> None:
    _number(where, v, 0, 1)


def _nonneg(where: str, v: Any) -> None:
    _number(where, v, 0)


def _counter(where: str, v: Any) -> None:
    _integer(where, v, 0, U64_MAX)


def _counter32(where: str, v: Any) -> None:
    """A count NVML reports in an unsigned int: a value past 2**32 - 1 is no reading of it."""
    _integer(where, v, 0, U32_MAX)


def _temp(where: str, v: Any) -> None:
    _number(where, v, -60, 250)


# PCIe link state (GPUs from NVML, HCAs from sysfs). A generation is 1 (2.5 GT/s) up to 6 (64 GT/s)
# today; the Link Capabilities register's speed field is 4 bits, so 15 bounds any future one. A
# width is a lane count: x1..x32 are the widths PCIe defines, 0 a link that is not trained.
MAX_PCIE_GEN = 15
MAX_PCIE_WIDTH = 32


def _pcie_gen(where: str, v: Any) -> None:
    _integer(where, v, 1, MAX_PCIE_GEN)


def _pcie_width(where: str, v: Any) -> None:
    _integer(where, v, 0, MAX_PCIE_WIDTH)


def _enum8(where: str, v: Any) -> None:
    """A small enumerated code (NVML's nvmlDeviceGpuRecoveryAction_t): what holds now, not a count."""
    _integer(where, v, 0, 255)


def _port(where: str, v: Any) -> None:
    """An IB port: its number (1, 2, ...) or its name as a string."""
    if isinstance(v, str):
        _ident(where, v)
    elif isinstance(v, int | float) and not isinstance(v, bool):
        _integer(where, v, 0, MAX_PORT_NUMBER)
    else:
        raise MessageError("wrong_type", f"{where} must be a string or integer")


def _bounded_list(where: str, v: Any, max_len: int) -> list[Any]:
    items = _list(where, v)
    if len(items) > max_len:
        raise MessageError("out_of_range", f"{where} has {len(items)} entries, more than {max_len}")
    return items


def _xids(where: str, v: Any) -> None:
    for i, x in enumerate(_bounded_list(where, v, MAX_XIDS)):
        _integer(f"{where}[{i}]", x, 0, MAX_XID)


# Optional fields: absent is fine ("missing fields are absent, never invented"); present must be valid.
# Each GPU counter's check is its NVML field's width (nvml.h; collectors/nvml.py reads them):
# unsigned long long for nvmlDeviceGetCurrentClocksEventReasons, nvmlDeviceGetTotalEccErrors and
# nvmlDeviceGetNvLinkErrorCounter; unsigned int for nvmlDeviceGetRetiredPages' pageCount,
# nvmlDeviceGetRemappedRows' corrRows/uncRows/isPending/failureOccurred,
# nvmlDeviceGetPcieReplayCounter, and the NVLink count (links are numbered by an unsigned int).
GPU_FIELDS: dict[str, Check] = {
    "uuid": _ident,
    "util": _pct,
    "mem_util": _pct,
    "mem_used_mib": _nonneg,
    "temp_c": _temp,
    "power_w": _nonneg,
    "sm_clock_mhz": _nonneg,
    "throttle_reasons": _counter,
    "ecc_sbe_volatile": _counter,
    "ecc_dbe_volatile": _counter,
    "ecc_sbe_aggregate": _counter,
    "ecc_dbe_aggregate": _counter,
    "retired_pages": _counter32,
    "remapped_rows_pending": _counter32,
    "remapped_rows_failure": _counter32,
    "nvlink_crc_errors": _counter,
    "nvlink_replay_errors": _counter,
    "pcie_replay": _counter32,
    # what the NVML collector reads beside (collectors/nvml.py): the remapped row counts behind the
    # pending/failure flags, and the NVLinks up (a link going down drops out of the error sums)
    "remapped_rows_correctable": _counter32,
    "remapped_rows_uncorrectable": _counter32,
    "nvlink_links_active": _counter32,
    # PCIe link (NVML's current and max generation and width; the max is what this GPU and its slot
    # allow) and NVML's recovery action for the GPU (field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)
    "pcie_link_gen": _pcie_gen,
    "pcie_link_gen_max": _pcie_gen,
    "pcie_link_width": _pcie_width,
    "pcie_link_width_max": _pcie_width,
    "recovery_action": _enum8,
    "xids": _xids,
}
# Cumulative GPU counters (detectors derive deltas and rates); the bitmask and the link count are
# integers too, but say what holds now.
GPU_COUNTERS = tuple(
    k
    for k, c in GPU_FIELDS.items()
    if c in (_counter, _counter32) and k not in ("throttle_reasons", "nvlink_links_active")
)
# NVML's "not available" values (pynvml NVML_VALUE_NOT_AVAILABLE_ulonglong / _uint: -1 in the
# field's C type), by the width of the NVML field each GPU counter is read from. They are valid
# input and mean "absent" (detectors.batch turns them into NaN), never a count of 2**64 - 1.
NVML_NOT_AVAILABLE: dict[str, int] = {
    **dict.fromkeys(
        (
            "throttle_reasons",
            "ecc_sbe_volatile",
            "ecc_dbe_volatile",
            "ecc_sbe_aggregate",
            "ecc_dbe_aggregate",
            "nvlink_crc_errors",
            "nvlink_replay_errors",
        ),
        U64_MAX,
    ),
    **dict.fromkeys(
        (
            "retired_pages",
            "remapped_rows_pending",
            "remapped_rows_failure",
            "remapped_rows_correctable",
            "remapped_rows_uncorrectable",
            "pcie_replay",
        ),
        U32_MAX,
    ),
}

HOST_FIELDS: dict[str, Check] = {
    "cpu_util": _pct,
    "mem_used_frac": _frac,
    "load1": _nonneg,
    "disk_used_frac": _frac,
    "procs_d_state": _counter,
    # The node checks (collectors/mounts.py, collectors/blockdevs.py): counts over the mounts and
    # block devices `collect --mount/--blockdev` requires, absent when none is configured; which
    # ones failed is named in the `checks` section (CHECKS_* below)
    "mounts_missing": _counter,
    "mounts_readonly": _counter,
    "mounts_unwritable": _counter,
    "mounts_failed": _counter,
    "mounts_hung": _counter,
    "mounts_slowest_s": _nonneg,
    "blockdevs_missing": _counter,
    "blockdevs_readonly": _counter,
    "inodes_used_frac": _frac,
}

IB_FIELDS: dict[str, Check] = {
    "device": _ident,
    "port": _port,
    "state": _ident,
    "rate_gbps": _nonneg,
    "symbol_errors": _counter,
    "link_downed": _counter,
    "rcv_errors": _counter,
    "xmit_discards": _counter,
    "tx_bytes": _counter,
    "rx_bytes": _counter,
    # the port's other error counters (counters/link_error_recovery, local_link_integrity_errors,
    # excessive_buffer_overrun_errors, port_rcv_remote_physical_errors, port_xmit_wait) and its
    # HCA's PCIe link (sysfs; collectors/net.py)
    "link_error_recovery": _counter,
    "local_link_integrity_errors": _counter,
    "excessive_buffer_overrun_errors": _counter,
    "rcv_remote_physical_errors": _counter,
    "xmit_wait": _counter,
    "pcie_link_gen": _pcie_gen,
    "pcie_link_gen_max": _pcie_gen,
    "pcie_link_width": _pcie_width,
    "pcie_link_width_max": _pcie_width,
}

ETH_FIELDS: dict[str, Check] = {
    "iface": _ident,
    "state": _ident,
    "rx_bytes": _counter,
    "tx_bytes": _counter,
    "rx_errors": _counter,
    "tx_errors": _counter,
    "rx_dropped": _counter,
    "tx_dropped": _counter,
    # link flaps: /sys/class/net/<iface>/carrier_changes, and its up and down halves where the kernel has them
    "carrier_changes": _counter,
    "carrier_up_count": _counter,
    "carrier_down_count": _counter,
}


# The kernel log's events since the last sample (collectors/kernel_log, `fleetwatch collect --source
# ...,kernel`): telemetry/1 `kernel`. `kind` is open (xid, sxid, fallen_off_bus, aer today): a kind
# a consumer does not know is still a valid event, so an agent newer than its pipeline is never
# dead-lettered for it.
MAX_KERNEL_EVENTS = 256  # distinct events a sample carries (repeats are one event with a count)
MAX_KERNEL_TEXT = 512
PCI_PATTERN = r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$"
PCI_RE = re.compile(PCI_PATTERN)


def _kernel_text(where: str, v: Any) -> None:
    _string(where, v, MAX_KERNEL_TEXT)


def _short_text(where: str, v: Any) -> None:
    _string(where, v, 64)


def _pci(where: str, v: Any) -> None:
    _string(where, v, 16)
    if not PCI_RE.match(v):
        raise MessageError("out_of_range", f"{where} {v!r} is not a PCI address (dddd:bb:dd.f)")


def _link(where: str, v: Any) -> None:
    _integer(where, v, -1, MAX_PORT_NUMBER)  # -1: the driver names no single link


def _gpu_index(where: str, v: Any) -> None:
    _integer(where, v, 0, MAX_GPU_INDEX)


def _error_names(where: str, v: Any) -> None:
    for i, x in enumerate(_bounded_list(where, v, 32)):
        _string(f"{where}[{i}]", x, 48)


KERNEL_EVENT_FIELDS: dict[str, Check] = {
    "kind": _ident,
    "code": _counter32,
    "pci": _pci,
    "gpu": _gpu_index,
    "uuid": _ident,
    "severity": _ident,
    "text": _kernel_text,
    "ts": _nonneg,
    "since_boot_s": _nonneg,
    "seq": _counter,
    "count": _counter,
    "pid": _counter32,
    "process": _short_text,
    "unit": _ident,
    "link": _link,
    "recovery_action": _counter32,
    "recovery_action_before": _counter32,
    "recovery_action_name": _short_text,
    "switch": _counter32,
    "severity_level": _counter32,
    "engine": _counter32,
    "data": _kernel_text,
    "port": _pci,
    "hca": _ident,  # an AER error's InfiniBand HCA (mlx5_0), where one is at or below its device
    "device": _ident,  # an I/O error's block device (sda, nvme0n1p2, dm-1)
    "server": _short_text,  # an NFS timeout's server
    "error_type": _short_text,
    "pci_id": _short_text,
    "errors": _error_names,
}
KERNEL_COUNTS = (
    "records",
    "unknown",
    "rejected",
    "missed",
    "overruns",
    "gone_before_start",
    "coalesced",
    "dropped",
)


def _kernel_section(where: str, v: Any) -> None:
    section = _object(where, v)
    if "boot" in section:
        _ident(f"{where}.boot", section["boot"])
    for k in KERNEL_COUNTS:
        if k in section:
            _counter(f"{where}.{k}", section[k])
    for i, e in enumerate(_bounded_list(f"{where}.events", section.get("events", []), MAX_KERNEL_EVENTS)):
        at = f"{where}.events[{i}]"
        event = _object(at, e)
        _required(event, at, ("kind",))
        _fields(at, event, KERNEL_EVENT_FIELDS)


# Which required mount or block device failed (telemetry/1 `checks`, sent only when one did; the
# counts are host fields). `problem` is open like a kernel event's kind (missing, readonly,
# unwritable, failed, hung; missing, empty, readonly today): a newer agent's problem is still valid.
MAX_CHECK_ENTRIES = 64  # entries of each list; also the most mounts or devices `collect` takes by name
MAX_PATH_LEN = 256
# an absolute path of printable characters: no C0/C1 control, DEL, line or paragraph separator, or
# lone surrogate (a path that is not UTF-8), so that it prints on one line wherever it is quoted
MOUNT_PATH_PATTERN = r"^/[^\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]{0,255}\Z"
MOUNT_PATH_RE = re.compile(MOUNT_PATH_PATTERN)


def _mount_path(where: str, v: Any) -> None:
    _string(where, v, MAX_PATH_LEN)
    if not MOUNT_PATH_RE.match(v):
        raise MessageError(
            "out_of_range", f"{where} {v[:64]!r} is not an absolute path of printable characters"
        )


CHECK_MOUNT_FIELDS: dict[str, Check] = {
    "path": _mount_path,
    "problem": _ident,
    "fstype": _ident,  # what /proc/self/mountinfo says is mounted there (nfs4, lustre, ...)
    "took_s": _nonneg,  # the probe's time: so far, for a hung one
    "error": _ident,  # the errno's name (ESTALE, EACCES, EIO, ...)
}
CHECK_BLOCKDEV_FIELDS: dict[str, Check] = {"name": _ident, "problem": _ident}
CHECK_LISTS = (
    ("mounts", CHECK_MOUNT_FIELDS, ("path", "problem")),
    ("blockdevs", CHECK_BLOCKDEV_FIELDS, ("name", "problem")),
)


def _checks_section(where: str, v: Any) -> None:
    section = _object(where, v)
    for key, spec, required in CHECK_LISTS:
        if key not in section:
            continue
        for i, e in enumerate(_bounded_list(f"{where}.{key}", section[key], MAX_CHECK_ENTRIES)):
            at = f"{where}.{key}[{i}]"
            entry = _object(at, e)
            _required(entry, at, required)
            _fields(at, entry, spec)


_BIG = 1.7976931348623157e308  # the largest float: `inf <= _BIG` is False, and NaN fails every comparison
# Numeric checks as (lo, hi, integers only), for the fast path below.
_RANGES: dict[Check, tuple[float, float, bool]] = {
    _pct: (0, 100, False),
    _frac: (0, 1, False),
    _nonneg: (0, _BIG, False),
    _counter: (0, U64_MAX, True),  # an exact int bound: float(U64_MAX) would also pass 2**64
    _counter32: (0, U32_MAX, True),
    _temp: (-60, 250, False),
    _link: (-1, MAX_PORT_NUMBER, True),
    _gpu_index: (0, MAX_GPU_INDEX, True),
    _pcie_gen: (1, MAX_PCIE_GEN, True),
    _pcie_width: (0, MAX_PCIE_WIDTH, True),
    _enum8: (0, 255, True),
}
_FAST: dict[int, dict[str, tuple[float, float, bool]]] = {}


def _fields(where: str, obj: Mapping[str, Any], spec: Mapping[str, Check]) -> None:
    # Hot path (every GPU of every sample): one type test and one range test per numeric field.
    # Anything that fails it goes through the field's own check, which names the problem.
    fast = _FAST.get(id(spec))
    if fast is None:
        fast = _FAST[id(spec)] = {k: _RANGES[c] for k, c in spec.items() if c in _RANGES}
    for key, value in obj.items():
        rng = fast.get(key)
        if rng is not None:
            t = type(value)
            if (t is int or (t is float and not rng[2])) and rng[0] <= value <= rng[1]:
                continue
        check = spec.get(key)
        if check is not None:
            check(f"{where}.{key}", value)
        # Unknown keys are tolerated: producers may extend messages (docs/contract.md 1.3).


def outside(where: str, obj: Mapping[str, Any], spec: Mapping[str, Check]) -> list[str]:
    """The keys of `obj` whose value its field's check in `spec` refuses: what a collector leaves
    out of what it read, so that one such value does not make its whole part invalid."""
    bad = []
    for key, value in obj.items():
        check = spec.get(key)
        if check is None:
            continue
        try:
            check(f"{where}.{key}", value)
        except MessageError:
            bad.append(key)
    return bad


def _ts(where: str, v: Any) -> None:
    _number(where, v, 0)


# ---------------------------------------------------------------- per-schema validators


def validate_telemetry(m: Mapping[str, Any]) -> None:
    _required(m, "telemetry", ("node", "ts", "seq", "gpus"))
    _name("telemetry.node", m["node"])
    _ts("telemetry.ts", m["ts"])
    _integer("telemetry.seq", m["seq"])
    seen: set[int] = set()
    for i, g in enumerate(_bounded_list("telemetry.gpus", m["gpus"], MAX_GPUS)):
        where = f"telemetry.gpus[{i}]"
        gpu = _object(where, g)
        _required(gpu, where, ("index",))
        _integer(f"{where}.index", gpu["index"], 0)
        if gpu["index"] > MAX_GPU_INDEX:
            raise MessageError(
                "out_of_range", f"{where}.index must be <= {MAX_GPU_INDEX}, got {gpu['index']}"
            )
        if gpu["index"] in seen:
            raise MessageError("out_of_range", f"{where}.index {gpu['index']} appears twice")
        seen.add(gpu["index"])
        _fields(where, gpu, GPU_FIELDS)
    if "host" in m:
        _fields("telemetry.host", _object("telemetry.host", m["host"]), HOST_FIELDS)
    if "net" in m:
        net = _object("telemetry.net", m["net"])
        for kind, spec in (("ib", IB_FIELDS), ("eth", ETH_FIELDS)):
            if kind in net:
                for i, port in enumerate(_bounded_list(f"telemetry.net.{kind}", net[kind], MAX_PORTS)):
                    where = f"telemetry.net.{kind}[{i}]"
                    _fields(where, _object(where, port), spec)
    if "kernel" in m:
        _kernel_section("telemetry.kernel", m["kernel"])
    if "checks" in m:
        _checks_section("telemetry.checks", m["checks"])
    if "agent" in m:
        agent = _object("telemetry.agent", m["agent"])
        if "version" in agent:
            _ident("telemetry.agent.version", agent["version"])
        if "instance" in agent:  # who numbered `seq` (a new install or spool: a new sequence)
            _ident("telemetry.agent.instance", agent["instance"])
        if "source_errors" in agent:
            errors = _object("telemetry.agent.source_errors", agent["source_errors"])
            if len(errors) > MAX_SOURCE_ERRORS:
                raise MessageError(
                    "out_of_range", f"telemetry.agent.source_errors has more than {MAX_SOURCE_ERRORS} entries"
                )
            for k, v in errors.items():
                _string("telemetry.agent.source_errors key", k, MAX_ID_LEN)
                _string(f"telemetry.agent.source_errors.{k}", v, MAX_ERROR_LEN)


JOB_STATES = frozenset({"started", "running", "finished", "failed"})


def validate_job(m: Mapping[str, Any]) -> None:
    _required(m, "job", ("job", "nodes", "state", "ts"))
    _name("job.job", m["job"])
    nodes = _bounded_list("job.nodes", m["nodes"], MAX_JOB_NODES)
    for i, n in enumerate(nodes):
        _name(f"job.nodes[{i}]", n)
    _string("job.state", m["state"])
    if m["state"] not in JOB_STATES:
        raise MessageError("out_of_range", f"job.state {m['state']!r} is not one of {sorted(JOB_STATES)}")
    _ts("job.ts", m["ts"])
    # Optional (issue 16, from `fleetwatch slurm-jobs`): Slurm's own end state, the exit code and
    # signal, the GPUs on each node (aligned with `nodes`), when the run started, who published it.
    if "end_state" in m:
        _string("job.end_state", m["end_state"], 32)
        if not SLURM_STATE_RE.match(m["end_state"]):
            raise MessageError("out_of_range", f"job.end_state {m['end_state']!r} is not a Slurm state name")
    if "exit_code" in m:
        _integer("job.exit_code", m["exit_code"], 0, 255)
    if "signal" in m:
        _integer("job.signal", m["signal"], 0, 255)
    if "gpus" in m:
        gpus = _bounded_list("job.gpus", m["gpus"], MAX_JOB_NODES)
        if len(gpus) != len(nodes):
            raise MessageError("out_of_range", f"job.gpus has {len(gpus)} entries for {len(nodes)} nodes")
        for i, g in enumerate(gpus):
            _integer(f"job.gpus[{i}]", g, 0, MAX_GPUS)
    if "start_ts" in m:
        _ts("job.start_ts", m["start_ts"])
    if "source" in m:
        _ident("job.source", m["source"])


def validate_step(m: Mapping[str, Any]) -> None:
    _required(m, "step", ("job", "node", "rank", "step", "step_time_s", "ts"))
    _name("step.job", m["job"])
    _name("step.node", m["node"])
    _integer("step.rank", m["rank"], 0, MAX_RANK)
    _integer("step.step", m["step"])
    _number("step.step_time_s", m["step_time_s"], 0)
    if "wait_time_s" in m:  # optional: time spent waiting for peers (collective wait), see simulator
        _number("step.wait_time_s", m["wait_time_s"], 0)
    _ts("step.ts", m["ts"])
    # Optional (issue 27, StepReporter.checkpoint()): the job's latest checkpoint, carried by the
    # next step report: the step it saved, when it was saved, and how long the write blocked
    if "checkpoint_step" in m:
        _integer("step.checkpoint_step", m["checkpoint_step"])
        _required(m, "step", ("checkpoint_ts",))
    if "checkpoint_ts" in m:
        _ts("step.checkpoint_ts", m["checkpoint_ts"])
    if "checkpoint_write_s" in m:
        _number("step.checkpoint_write_s", m["checkpoint_write_s"], 0, 86400.0)


def validate_truth(m: Mapping[str, Any]) -> None:
    _required(m, "truth", ("node", "fault", "onset_ts"))
    _name("truth.node", m["node"])
    if "gpu" in m and m["gpu"] is not None:
        _integer("truth.gpu", m["gpu"], 0, MAX_GPU_INDEX)
    _string("truth.fault", m["fault"])
    _ts("truth.onset_ts", m["onset_ts"])
    if m.get("end_ts") is not None:
        _ts("truth.end_ts", m["end_ts"])
        if m["end_ts"] < m["onset_ts"]:
            raise MessageError("out_of_range", "truth.end_ts is before truth.onset_ts")


def validate_node_features(m: Mapping[str, Any]) -> None:
    _required(m, "nodefeatures", ("node", "job", "ts", "seq"))
    _name("nodefeatures.node", m["node"])
    _name("nodefeatures.job", m["job"])
    _ts("nodefeatures.ts", m["ts"])
    _integer("nodefeatures.seq", m["seq"])
    for k, check in (
        ("util", _pct),
        ("sm_clock_mhz", _nonneg),
        ("power_w", _nonneg),
        ("gpus_lost", _counter),
    ):
        if k in m:
            check(f"nodefeatures.{k}", m[k])


# ---------------------------------------------------------------- what the stages write
#
# finding/1 (detect), node/1 (detect's census), drain/1 (act) and drain_result/1 (the Slurm
# adapter) are checked here, beside the rest, so that the one decoder knows every schema without
# importing an upper layer: their writers (detectors/findings.py, fleetwatch/census.py,
# alerts/drain_request.py, alerts/drain_result.py) build and sign them with these checks.

FINDING = "finding/1"
NODE = "node/1"
DRAIN = "drain/1"
DRAIN_RESULT = "drain_result/1"
CONTROL = "control/1"
SLURM_NODE = "slurm_node/1"

# The kinds this release's detectors write (a new detector adds its kind here). A finding of a
# kind not listed is still valid, for its name is a kind name: a detect newer than its act (a
# rolling upgrade) must never have its findings dead-lettered; act alerts them as generic findings.
KIND_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
FINDING_KINDS = frozenset(
    {
        "xid",
        "ecc",
        "row_remap",
        "nvlink",
        "pcie",
        "thermal",
        "ib_link",
        "eth_link",
        "host",
        "statistical",
        "straggler",
        "lemon",
        "nvswitch",
        "kernel_log",
        "mount",
        "block_device",
        "disk",
        "hung_tasks",
        "pcie_link",
        "device_count",
    }
)
SEVERITIES = ("info", "warning", "critical")
# A finding stays far below the broker's message limit whatever a sample held: its summary is cut
# (and its evidence bounded, detectors/findings.py).
MAX_SUMMARY = 500
MAX_FINDING_ID = 64
DRAIN_ACTIONS = frozenset({"drain", "resume"})
MAX_REASON = 400  # scontrol stores the reason; keep it a line, not an essay
MAX_FINDINGS = 256  # finding ids one drain request lists
MAX_DETAIL = 400  # a drain result's detail: one line
REQUEST_ID_RE = re.compile(r"^[0-9a-f]{32}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
# executed: scontrol did it (or Slurm shows it was done before a crash). duplicate: handled before;
# its first result says how. undetermined: a request was interrupted by a crash and Slurm's state
# can no longer tell whether it took effect (an operator changed the node since): nothing is done,
# a human decides.
DRAIN_OUTCOMES = frozenset(
    {
        "executed",
        "duplicate",
        "rejected_unknown_node",
        "rejected_forged",
        "rejected_malformed",
        "rejected_stale",
        "rejected_not_ours",
        "failed",
        "undetermined",
        "rejected_validation",
        "deferred",
    }
)
REQUEST_SIGNATURE = "request_signature"  # drain_result/1's binding to its request; optional (older adapters)
DRAIN_FIELDS = ("schema", "request_id", "node", "action", "reason", "severity", "findings", "issued_at")
RESULT_FIELDS = ("schema", "request_id", "node", "action", "outcome", "detail", "ts")
# drain/1's optional mark of a request from `act --dry-run`: published to its own topic, never to be
# executed (an adapter of an earlier release refuses it as an unknown field; this one by name)
DRY_RUN = "dry_run"
# control/1: an operator's fleet-wide switch (alerts/drain_pause.py); `control` names the switch,
# which is also the record's Kafka key, so the compacted topic keeps each switch's latest record
CONTROLS = frozenset({"drain_pause"})
CONTROL_FIELDS = ("schema", "control", "paused", "reason", "by", "issued_at", "until")
MAX_PAUSE_S = 7 * 86400.0  # a pause nobody lifts ends by itself within a week
# slurm_node/1: a node as Slurm shows it, from the adapter (alerts/slurm_nodes.py): sinfo's state
# (%T: lower case, with its flag characters), reason, features, and whether an active MAINT
# reservation holds it
SLURM_NODE_FIELDS = ("schema", "node", "state", "reason", "features", "maintenance", "ours", "ts")
SLURM_STATE_TEXT_RE = re.compile(r"^[a-z][a-z+_]{0,62}[*~#!%$@^+-]?\Z")
MAX_FEATURES = 32


def validate_finding(m: Mapping[str, Any]) -> None:
    _required(
        m,
        "finding",
        ("id", "node", "kind", "severity", "score", "summary", "evidence", "first_seen", "ts", "resolved"),
    )
    if not isinstance(m["id"], str) or not m["id"]:
        raise MessageError("wrong_type", "finding.id must be a non-empty string")
    _string("finding.id", m["id"], MAX_FINDING_ID)
    _name("finding.node", m["node"])
    if m.get("gpu") is not None:
        _integer("finding.gpu", m["gpu"], 0, MAX_GPU_INDEX)
    if m.get("job") is not None:
        _name("finding.job", m["job"])
    # strings first: a list or an object in a set test would raise TypeError (unhashable), not this
    _string("finding.kind", m["kind"], 32)
    if not KIND_RE.match(m["kind"]):
        raise MessageError(
            "out_of_range", f"finding.kind {m['kind']!r} is not a kind name ({KIND_RE.pattern})"
        )
    _string("finding.severity", m["severity"])
    if m["severity"] not in SEVERITIES:
        raise MessageError("out_of_range", f"finding.severity {m['severity']!r} is not one of {SEVERITIES}")
    _number("finding.score", m["score"], 0, 1)
    _string("finding.summary", m["summary"], MAX_SUMMARY)
    if not isinstance(m["evidence"], dict):
        raise MessageError("wrong_type", "finding.evidence must be an object")
    _number("finding.first_seen", m["first_seen"], 0)
    _number("finding.ts", m["ts"], 0)
    if m["ts"] < m["first_seen"]:
        raise MessageError("out_of_range", "finding.ts is before finding.first_seen")
    if not isinstance(m["resolved"], bool):
        raise MessageError("wrong_type", "finding.resolved must be a boolean")
    # issue 23: optional for the decoder (readers other than act, such as the scorecard, need no
    # key); act refuses a finding whose `sig` is missing or does not verify (signature_error)
    if "sig" in m:
        _string("finding.sig", m["sig"], 128)


def validate_node(m: Mapping[str, Any]) -> None:
    _required(m, "node", ("node", "first_seen", "last_seen"))
    _name("node.node", m["node"])
    _ts("node.first_seen", m["first_seen"])
    _ts("node.last_seen", m["last_seen"])
    if m["last_seen"] < m["first_seen"]:
        raise MessageError("out_of_range", "node.last_seen is before node.first_seen")
    # issue 23: optional for the decoder (an older detect writes none of them); act refuses a
    # record without a valid `sig` (Census.apply), and every signed record carries them all
    for f in ("steady_since", "seen_at"):
        if f in m:
            _ts(f"node.{f}", m[f])
    if "steady_since" in m and "seen_at" in m and m["seen_at"] < m["steady_since"]:
        raise MessageError("out_of_range", "node.seen_at is before node.steady_since")
    if "gone" in m and not isinstance(m["gone"], bool):
        raise MessageError("wrong_type", "node.gone must be a boolean")
    if "sig" in m:
        _string("node.sig", m["sig"])


def check_signature_field(name: str, value: Any) -> None:
    _string(name, value)
    if not _HEX64.match(value):
        raise MessageError("out_of_range", f"{name} must be 64 lowercase hex digits")


def check_envelope(
    m: Mapping[str, Any], what: str, fields: tuple[str, ...], optional: tuple[str, ...] = ()
) -> None:
    """What drain/1 and drain_result/1 share: exactly `fields` (and any of `optional`) and a
    signature (unknown fields would be signed but unchecked by older readers: refused outright), a
    request id, a node, an action, a signature of the right shape."""
    for f in (*fields, "signature"):
        if f not in m:
            raise MessageError("missing_field", f"{what}.{f} is required")
    extra = set(m) - set(fields) - set(optional) - {"signature"}
    if extra:
        raise MessageError("out_of_range", f"{what} has unknown fields {sorted(extra)[:5]}")
    _string(f"{what}.request_id", m["request_id"])
    if not REQUEST_ID_RE.match(m["request_id"]):
        raise MessageError("out_of_range", f"{what}.request_id must be 32 hex digits")
    _name(f"{what}.node", m["node"])
    _string(f"{what}.action", m["action"])  # before the set test: an unhashable value would raise TypeError
    if m["action"] not in DRAIN_ACTIONS:
        raise MessageError("out_of_range", f"{what}.action must be one of {sorted(DRAIN_ACTIONS)}")
    check_signature_field(f"{what}.signature", m["signature"])


def validate_drain(m: Mapping[str, Any]) -> None:
    """Shape check (no signature check: that needs the key, alerts/drain_request.verify)."""
    check_envelope(m, "drain", DRAIN_FIELDS, (DRY_RUN,))
    if DRY_RUN in m and m[DRY_RUN] is not True:
        raise MessageError("out_of_range", "drain.dry_run must be true when present")
    _string("drain.reason", m["reason"])
    if not m["reason"] or len(m["reason"]) > MAX_REASON or any(c in m["reason"] for c in "\r\n\0"):
        raise MessageError("out_of_range", f"drain.reason must be one line of 1..{MAX_REASON} characters")
    _string("drain.severity", m["severity"])
    if m["severity"] not in SEVERITIES:
        raise MessageError("out_of_range", f"drain.severity must be one of {sorted(SEVERITIES)}")
    ids = _list("drain.findings", m["findings"])
    if len(ids) > MAX_FINDINGS:
        raise MessageError("out_of_range", f"drain.findings has more than {MAX_FINDINGS} ids")
    for i, f in enumerate(ids):
        _string(f"drain.findings[{i}]", f)
    _number("drain.issued_at", m["issued_at"], 0)


def validate_result(m: Mapping[str, Any]) -> None:
    """Shape check; the signature is checked with alerts/drain_request.verify (needs the key)."""
    check_envelope(m, "drain_result", RESULT_FIELDS, (REQUEST_SIGNATURE,))
    if REQUEST_SIGNATURE in m:
        check_signature_field(f"drain_result.{REQUEST_SIGNATURE}", m[REQUEST_SIGNATURE])
    _string("drain_result.outcome", m["outcome"])
    if m["outcome"] not in DRAIN_OUTCOMES:
        raise MessageError("out_of_range", f"drain_result.outcome must be one of {sorted(DRAIN_OUTCOMES)}")
    _string("drain_result.detail", m["detail"])
    if len(m["detail"]) > MAX_DETAIL or any(c in m["detail"] for c in "\r\n\0"):
        raise MessageError(
            "out_of_range", f"drain_result.detail must be one line of <= {MAX_DETAIL} characters"
        )
    _number("drain_result.ts", m["ts"], 0)


def _exact_fields(m: Mapping[str, Any], what: str, fields: tuple[str, ...]) -> None:
    """Every one of `fields` and a `signature`, and nothing else (an unknown field would be signed
    but unchecked by an older reader: refused outright)."""
    for f in (*fields, "signature"):
        if f not in m:
            raise MessageError("missing_field", f"{what}.{f} is required")
    extra = set(m) - set(fields) - {"signature"}
    if extra:
        raise MessageError("out_of_range", f"{what} has unknown fields {sorted(extra)[:5]}")


def _one_line(where: str, v: Any, max_len: int) -> None:
    _string(where, v)
    if not v or len(v) > max_len or any(c in v for c in "\r\n\0"):
        raise MessageError("out_of_range", f"{where} must be one line of 1..{max_len} characters")


def validate_control(m: Mapping[str, Any]) -> None:
    """Shape check of an operator's switch; the signature is checked with the drain key
    (alerts/drain_pause.verify)."""
    _exact_fields(m, "control", CONTROL_FIELDS)
    _string("control.control", m["control"])
    if m["control"] not in CONTROLS:
        raise MessageError("out_of_range", f"control.control must be one of {sorted(CONTROLS)}")
    if not isinstance(m["paused"], bool):
        raise MessageError("wrong_type", "control.paused must be a boolean")
    _one_line("control.reason", m["reason"], MAX_REASON)
    _one_line("control.by", m["by"], MAX_ID_LEN)
    _ts("control.issued_at", m["issued_at"])
    _ts("control.until", m["until"])
    if not 0 <= m["until"] - m["issued_at"] <= MAX_PAUSE_S:
        raise MessageError(
            "out_of_range", f"control.until must be within {MAX_PAUSE_S:.0f} s after control.issued_at"
        )
    check_signature_field("control.signature", m["signature"])


def validate_slurm_node(m: Mapping[str, Any]) -> None:
    """Shape check; the signature (drain key) is checked by act (alerts/slurm_nodes.py)."""
    _exact_fields(m, "slurm_node", SLURM_NODE_FIELDS)
    _name("slurm_node.node", m["node"])
    _string("slurm_node.state", m["state"], 64)
    if not SLURM_STATE_TEXT_RE.match(m["state"]):
        raise MessageError("out_of_range", "slurm_node.state is not a sinfo state (%T)")
    _string("slurm_node.reason", m["reason"], MAX_REASON)
    if any(c in m["reason"] for c in "\r\n\0"):
        raise MessageError("out_of_range", "slurm_node.reason must be one line")
    feats = _bounded_list("slurm_node.features", m["features"], MAX_FEATURES)
    for i, f in enumerate(feats):
        _ident(f"slurm_node.features[{i}]", f)
    for f in ("maintenance", "ours"):
        if not isinstance(m[f], bool):
            raise MessageError("wrong_type", f"slurm_node.{f} must be a boolean")
    _ts("slurm_node.ts", m["ts"])
    check_signature_field("slurm_node.signature", m["signature"])


# ---------------------------------------------------------------- the schema table
#
# Every schema the decoder knows, named here and nowhere else: importing fleetwatch.schemas alone
# decodes each of them (tests/unit/test_schemas.py checks it in a fresh interpreter).

VALIDATORS: dict[str, Callable[[Mapping[str, Any]], None]] = {
    TELEMETRY: validate_telemetry,
    JOB: validate_job,
    STEP: validate_step,
    TRUTH: validate_truth,
    NODE_FEATURES: validate_node_features,
    FINDING: validate_finding,
    NODE: validate_node,
    DRAIN: validate_drain,
    DRAIN_RESULT: validate_result,
    CONTROL: validate_control,
    SLURM_NODE: validate_slurm_node,
}

# The timestamp field each schema is judged by for clock skew.
TS_FIELD = {
    TELEMETRY: "ts",
    JOB: "ts",
    STEP: "ts",
    TRUTH: "onset_ts",
    NODE_FEATURES: "ts",
    FINDING: "ts",
    NODE: "last_seen",
    DRAIN: "issued_at",
    DRAIN_RESULT: "ts",
    CONTROL: "issued_at",
    SLURM_NODE: "ts",
}
# The field a message's Kafka key must equal (docs/contract.md 4.1): a key that names another
# node than the message would put its state on one worker and its findings on another's node.
KEY_FIELD = {
    TELEMETRY: "node",
    JOB: "job",
    STEP: "job",
    TRUTH: "node",
    NODE_FEATURES: "job",
    FINDING: "node",
    NODE: "node",
    DRAIN: "node",
    DRAIN_RESULT: "node",
    CONTROL: "control",
    SLURM_NODE: "node",
}


def validate(m: Any, expected: str | frozenset[str] | None = None) -> dict[str, Any]:
    """Check an already parsed message; returns it (typed as a dict) or raises MessageError."""
    if not isinstance(m, dict):
        raise MessageError("not_object", f"message must be a JSON object, got {type(m).__name__}")
    schema = m.get("schema")
    if schema is None:
        raise MessageError("missing_field", "schema is required")
    if not isinstance(schema, str):
        raise MessageError("wrong_type", "schema must be a string")
    validator = VALIDATORS.get(schema)
    if validator is None:
        raise MessageError("unknown_schema", f"unknown schema {schema[:64]!r} (known: {sorted(VALIDATORS)})")
    if expected is not None and schema != expected and (isinstance(expected, str) or schema not in expected):
        raise MessageError(
            "unknown_schema", f"schema {schema[:64]!r} does not belong on this topic ({expected})"
        )
    validator(m)
    return m


@dataclass(frozen=True)
class ClockLimits:
    """How far a message's own timestamp may lie from its reference time: when it reached the broker
    (topics fleetwatch creates keep LogAppendTime), or when it was read, where a topic keeps the
    producers' times instead (fleetwatch.record_block.RecordBlock.reference_times).

    Ahead is tight: a node whose clock runs ahead would otherwise move its event time forward and
    make its next correct samples look stale. Behind is loose: an agent that spooled through a
    broker outage delivers hours-old samples in order, and they still count."""

    ahead_s: float = 60.0
    behind_s: float = 86400.0


DEFAULT_CLOCK = ClockLimits()


def clock_error(ts: float, ref_ts: float, clock: ClockLimits) -> MessageError | None:
    """Why a timestamp is outside the limits around its reference time, or None."""
    skew = ts - ref_ts
    if skew > clock.ahead_s or -skew > clock.behind_s:
        e = MessageError(
            "clock_skew",
            f"timestamp {ts:.3f} is {skew:+.0f} s from the time the broker took it "
            f"(limits +{clock.ahead_s:.0f} s / -{clock.behind_s:.0f} s)",
        )
        e.skew_s = skew
        return e
    return None


def clock_ok(ts: np.ndarray, ref_ts: np.ndarray, clock: ClockLimits) -> np.ndarray:
    """clock_error(...) is None, for arrays (NaN times fail)."""
    skew = ts - ref_ts
    return (skew <= clock.ahead_s) & (-skew <= clock.behind_s)


class _NoKey:
    """decode()'s key when the message did not come from Kafka (a file, a test): nothing to match."""


NO_KEY: Any = _NoKey()


def key_error(schema: str, value: Any, key: bytes | None) -> MessageError | None:
    """Why a record's Kafka key does not name what its message names (KEY_FIELD), or None."""
    field = KEY_FIELD.get(schema)
    if field is None or key is NO_KEY:
        return None
    if key is None or key != value.encode():
        shown = "no key" if key is None else f"key {key[:64]!r}"
        return MessageError("key_mismatch", f"{shown} but {field} {value[:64]!r}: the key must equal it")
    return None


def decode(
    raw: bytes | None,
    expected: str | frozenset[str] | None = None,
    *,
    key: bytes | None = NO_KEY,
    ref_ts: float | None = None,
    clock: ClockLimits | None = None,
    max_bytes: int = MAX_MESSAGE_BYTES,
    struct: bool = False,
) -> Any:
    """Raw Kafka value -> validated message dict, or MessageError naming what is wrong.

    The one validation of every reader: the JSON itself (fleetwatch.strict_json: UTF-8, no duplicate
    keys, bounded nesting), the schema, the record's key (`key`: the Kafka key; NO_KEY when the
    message did not come from Kafka), and with `clock` its timestamp against `ref_ts` (the time the
    broker took it; now when None).

    struct=True: a valid telemetry/1 message comes back as fleetwatch.fast_schema's decoded struct
    (attributes, NaN for absent numbers) instead of a dict; every other message, and one that only
    the Python validator accepts, still comes back as a dict.
    """
    if raw is None:
        raise MessageError("not_json", "empty message (tombstone)")
    if len(raw) > max_bytes:
        raise MessageError("oversized", f"{len(raw)} bytes exceeds the {max_bytes}-byte limit")
    try:
        m = strict_json.loads(raw)
    except strict_json.JSONRefused as e:
        raise MessageError(e.reason, e.detail) from None
    wants_telemetry = type(m) is dict and m.get("schema") == TELEMETRY and _wants_telemetry(expected)
    out: Any = m
    if wants_telemetry and struct:
        t = _fast_schema().decode_telemetry(raw)
        out = m if t is None else t
        if t is None:
            validate(m, expected)  # names what is wrong, or accepts what msgspec may not
    elif not (wants_telemetry and _fast_schema().telemetry_ok(raw)):
        validate(m, expected)  # the slow path names what is wrong (or accepts what the fast one may not)
    schema = m["schema"]
    field = KEY_FIELD.get(schema)
    if field is not None and (e := key_error(schema, m[field], key)) is not None:
        raise e
    if clock is not None:
        e = clock_error(m[TS_FIELD[schema]], time.time() if ref_ts is None else ref_ts, clock)
        if e is not None:
            raise e
    return out


def decode_batch(
    raws: Sequence[bytes | None],
    expected: str | frozenset[str] | None = None,
    *,
    keys: Sequence[bytes | None] | None = None,
    ref_ts: float | Sequence[float] | np.ndarray | None = None,
    clock: ClockLimits | None = None,
    max_bytes: int = MAX_MESSAGE_BYTES,
    struct: bool = False,
) -> tuple[list[Any], list[tuple[int, MessageError]]]:
    """decode() over a batch of raw values, with their keys (None: not from Kafka) and reference
    times (one for all, one each, or None: now): (the valid messages in order, [(index, error)] of
    the rest)."""
    refs = np.broadcast_to(np.asarray(time.time() if ref_ts is None else ref_ts, dtype=np.float64), len(raws))
    ok: list[Any] = []
    bad: list[tuple[int, MessageError]] = []
    for i, raw in enumerate(raws):
        key = NO_KEY if keys is None else keys[i]
        try:
            ok.append(
                decode(
                    raw,
                    expected,
                    key=key,
                    ref_ts=float(refs[i]),
                    clock=clock,
                    max_bytes=max_bytes,
                    struct=struct,
                )
            )
        except MessageError as e:
            bad.append((i, e))
    return ok, bad


def _wants_telemetry(expected: str | frozenset[str] | None) -> bool:
    return (
        expected is None or expected == TELEMETRY or (not isinstance(expected, str) and TELEMETRY in expected)
    )


def _fast_schema() -> Any:
    # fast_schema builds its types from this module's tables, so it is imported on first use.
    from fleetwatch import fast_schema

    return fast_schema


def encode(m: Mapping[str, Any]) -> bytes:
    """Message dict -> JSON bytes. orjson writes NaN/Inf as null, so validate() before encoding."""
    try:
        # numpy scalars (a float64 from a detector) are numbers too; serialising them beats a crash
        return orjson.dumps(m, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError as e:
        raise MessageError("wrong_type", f"cannot encode: {e}") from None
