"""GPU telemetry read from a dcgm-exporter endpoint that a site already runs (source `dcgm`).

A site that runs NVIDIA's dcgm-exporter on its GPU nodes can feed fleetwatch's detectors from it
instead of starting a second NVML poller: each sample GETs the exporter's Prometheus text (default
http://127.0.0.1:9400/metrics), parses it with prometheus_client's own parser and returns
{"gpus": [...]} in exactly the shape collectors/nvml.py produces (telemetry/1 `gpus[]`,
docs/contract.md). Names and units are the exporter's (etc/default-counters.csv and
etc/dcp-metrics-included.csv of NVIDIA/dcgm-exporter, commit d5e5f51, 2026-05-12):

    index                   label `gpu`                                (0..63)
    uuid                    label `UUID` (`uuid` under --use-old-namespace)
    util                    DCGM_FI_DEV_GPU_UTIL                       %
    mem_util                DCGM_FI_DEV_MEM_COPY_UTIL                  %
    mem_used_mib            DCGM_FI_DEV_FB_USED                        MiB
    temp_c                  DCGM_FI_DEV_GPU_TEMP                       C
    power_w                 DCGM_FI_DEV_POWER_USAGE                    W
    sm_clock_mhz            DCGM_FI_DEV_SM_CLOCK                       MHz
    throttle_reasons        DCGM_FI_DEV_CLOCKS_EVENT_REASONS (older name ..._CLOCK_THROTTLE_REASONS)
    ecc_{sbe,dbe}_volatile  DCGM_FI_DEV_ECC_{SBE,DBE}_VOL_TOTAL        (commented out by default:
    ecc_{sbe,dbe}_aggregate DCGM_FI_DEV_ECC_{SBE,DBE}_AGG_TOTAL         sent where a site enables them)
    retired_pages           DCGM_FI_DEV_RETIRED_SBE + DCGM_FI_DEV_RETIRED_DBE, only when both are there
    remapped_rows_correctable    DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS
    remapped_rows_uncorrectable  DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS
    remapped_rows_failure   DCGM_FI_DEV_ROW_REMAP_FAILURE              0 or 1
    remapped_rows_pending   DCGM_FI_DEV_ROW_REMAP_PENDING              0 or 1 (not a default counter)
    pcie_replay             DCGM_FI_DEV_PCIE_REPLAY_COUNTER
    nvlink_crc_errors       DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL + ..._CRC_DATA_ERROR_COUNT_TOTAL
    nvlink_replay_errors    DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL
    xids                    DCGM_FI_DEV_XID_ERRORS (below)

`nvlink_links_active` and `lost` have no exporter counterpart and are never sent. Series with an
`nvlink` or `nvswitch` label (the exporter's per-link and NVSwitch entities) are not GPU rows.

Which series belong to this node. The exporter labels its series with the host it runs on:
`Hostname` until the rename of 2026-05-12 (NVIDIA/dcgm-exporter #655, commit d5e5f51 "Rename
Hostname label to hostname"), `hostname` after; both are read. By default a series is kept only
when its host label names this node: equal ignoring case, or equal up to the first dot (an
exporter that says `ip-10-1-2-3.ec2.internal` for the node `ip-10-1-2-3`). A series without the
label (an exporter run with --no-hostname), or one of another host, is left out, and the source
logs once what it saw. The exporter normally runs one per node, on the node, so its host label is
the node; where it names something else (a Kubernetes pod's name when NODE_NAME is not set, a
remote hostengine's address) and the endpoint serves this node only, `any_host=True`
(`collect --dcgm-any-host`) takes every series.

Values. A value that is not a finite number in its field's range (the contract's: pct 0..100,
temperature -60..250, u32 and u64 counters integral and non-negative, flags 0 or 1) is left out,
as is any of DCGM's blank sentinels that older exporters printed as numbers (DCGM_INT32_BLANK
0x7ffffff0, DCGM_INT64_BLANK 0x7ffffffffffffff0, DCGM_FP64_BLANK 2**47, each with the +1..+3 of
NOT_FOUND, NOT_SUPPORTED, NOT_PERMISSIONED; the exporter's README still shows
`DCGM_FI_DEV_MEMORY_TEMP{...} 9223372036854775794`). A field the exporter repeats for one GPU (MIG
instances with GPU_I_ID; one series per pod sharing a GPU under Kubernetes) is taken from the
GPU-level series when there are any, else from the instance series, and only when all of them
agree: a disagreement is left out, never averaged. A GPU index whose series carry two different
UUIDs (two hosts' exporters behind one endpoint) is left out whole.

XIDs. DCGM_FI_DEV_XID_ERRORS is a gauge holding the *last* XID code a GPU reported (0: none yet;
exporters since 3.3.6-3.4.2 repeat the code as the `err_code` label, with `err_msg`). The source
keeps each GPU's codes between scrapes and sends as `xids` the codes that appear (a changed value
or a new `err_code`); the first scrape of a GPU is the baseline and sends no `xids` key, and a
scrape without the gauge leaves the state as it was. So: a repeat of the same code is invisible
(13, 13, 13 is one XID 13), several XIDs between two scrapes are at most their last, and an XID
from before the agent started is not sent. DCGM also misses some codes altogether (XID 62 in
NVIDIA/DCGM#235) and the gauge keeps its last value until the exporter restarts
(NVIDIA/dcgm-exporter#500). Where the kernel log is read too (source `kernel`), it stays the
source of truth for XIDs; this gauge is what a site without it gets.

Reading. http.client, so no proxy (a node's http_proxy must not carry a loopback scrape), only
http and https URLs without credentials in them, no redirects (a 30x answer is an error naming
it: give the URL it points to), at most 8 MiB, a body shorter than its Content-Length refused, and
one deadline, `timeout_s`, for the whole scrape: connection, status line, headers and body (over
https the TLS handshake may take one more `timeout_s`: the cut cannot reach a socket while it is
being wrapped). A socket's timeout bounds each read, not the
answer (a server that sends its headers a byte at a time held a scrape, and the agent's thread for
the source, for as long as it liked): at the deadline the connection's socket is shut, which ends a
read blocked on it. An endpoint that is down, slow,
answers an HTTP error or sends too much leaves the sample without GPU data (`{}`, which does not
overwrite another source's `gpus`) and is logged once per outage; text the parser refuses is read
line by line so that one bad line costs only itself. `sample()` raises on none of these.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import math
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from prometheus_client.parser import text_string_to_metric_families

from fleetwatch import __version__, schemas
from fleetwatch.collectors.sources import SingleFlight, SourceUnavailable

log = logging.getLogger(__name__)

DEFAULT_URL = "http://127.0.0.1:9400/metrics"  # the exporter's default listen address, :9400
# Past the agent's call budget at 1 s samples (min(--call-timeout, --interval) = 1 s): a scrape of
# 1-2 s is not lost but taken late (its values dated when read, by an early tick); a shorter
# deadline would fail every scrape of such an exporter instead
DEFAULT_TIMEOUT_S = 2.0
MAX_BODY_BYTES = 8 * 2**20  # a node of 8 GPUs x 7 MIG instances with pod labels is ~1 MiB
READ_CHUNK = 64 * 1024
MAX_XID_STATE = 4 * schemas.MAX_GPUS  # GPUs whose last XID codes are kept (pruned past this)

HOST_LABELS = ("hostname", "Hostname")  # after and before the exporter's rename (d5e5f51)
UUID_LABELS = ("UUID", "uuid")  # `uuid` is the exporter's --use-old-namespace spelling
INSTANCE_LABEL = "GPU_I_ID"  # a MIG instance's series
NOT_GPU_LABELS = ("nvlink", "nvswitch")  # per-link and NVSwitch entities also carry `gpu`
XID_METRIC = "DCGM_FI_DEV_XID_ERRORS"

Kind = Literal["pct", "nonneg", "int", "temp", "u32", "u64", "flag"]

# exporter metric -> (telemetry/1 GPU field, kind of value)
FIELDS: dict[str, tuple[str, Kind]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("util", "pct"),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("mem_util", "pct"),
    "DCGM_FI_DEV_FB_USED": ("mem_used_mib", "nonneg"),
    "DCGM_FI_DEV_GPU_TEMP": ("temp_c", "temp"),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", "nonneg"),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", "int"),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("throttle_reasons", "u64"),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("throttle_reasons", "u64"),  # the same field (112), older name
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("ecc_sbe_volatile", "u64"),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("ecc_dbe_volatile", "u64"),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": ("ecc_sbe_aggregate", "u64"),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ("ecc_dbe_aggregate", "u64"),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("remapped_rows_correctable", "u32"),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("remapped_rows_uncorrectable", "u32"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("remapped_rows_failure", "flag"),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": ("remapped_rows_pending", "flag"),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("pcie_replay", "u32"),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": ("nvlink_replay_errors", "u64"),
}
# telemetry/1 fields that are sums of exporter metrics: (parts, kind, every part needed)
SUMS: dict[str, tuple[tuple[str, ...], Kind, bool]] = {
    # like collectors/nvml.py: a sum of one of the two retirement causes would under-report
    "retired_pages": (("DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_DBE"), "u32", True),
    # flow-control and data CRC both count corruption on the links; data CRC is absent on some GPUs
    "nvlink_crc_errors": (
        ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"),
        "u64",
        False,
    ),
}
_SUM_PARTS = {part: kind for parts, kind, _ in SUMS.values() for part in parts}
WANTED = frozenset(FIELDS) | frozenset(_SUM_PARTS) | {XID_METRIC}

# DCGM's blank values (dcgm_structs.h: *_BLANK, then +1 NOT_FOUND, +2 NOT_SUPPORTED, +3
# NOT_PERMISSIONED), which exporters before the skip of blank values printed as numbers.
_INT32_BLANK = 0x7FFFFFF0
_INT64_BLANK = 0x7FFFFFFFFFFFFFF0
_FP64_BLANK = 140737488355328.0  # 2**47
_BLANKS = frozenset(
    [_INT32_BLANK + i for i in range(4)]
    + [_INT64_BLANK + i for i in range(4)]
    + [_FP64_BLANK + i for i in range(4)]
)
_INT64_BLANK_AS_FLOAT = float(_INT64_BLANK)  # 2**63: the four int64 sentinels printed as "%f"


@dataclass(frozen=True)
class Series:
    """One sample line of the exporter's text: the metric's name as written, labels, value."""

    name: str
    labels: dict[str, str]
    value: float | int


class ScrapeError(Exception):
    """The endpoint gave no usable body (down, slow, an HTTP error, too large)."""


def _shut(conn: http.client.HTTPConnection) -> None:
    """At a scrape's deadline (a timer's thread): shut its socket, which ends a read blocked on it."""
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):  # already closed
            sock.shutdown(socket.SHUT_RDWR)


# ---------------------------------------------------------------- parsing


def parse(text: str) -> list[Series]:
    """The samples of a Prometheus text exposition, by prometheus_client's parser.

    The parser stops at the first line it refuses (ValueError); the text is then parsed again
    line by line, so that a bad line costs only itself. Names are as written: the parser appends
    `_total` to the samples of a family typed `counter` (DCGM_FI_DEV_PCIE_REPLAY_COUNTER becomes
    ..._COUNTER_total), which is taken off again."""
    text = _wanted_lines(text)
    try:
        return list(_samples(text))
    except Exception:  # the third-party parser on hostile text: reread it line by line
        out: list[Series] = []
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            try:
                out.extend(_samples(line))
            except Exception:
                continue
        return out


MAX_LINE = 16_384  # a DCGM sample line with pod labels is under 2 KiB


def _wanted_lines(text: str) -> str:
    """Only the lines about the metrics read here (their samples, TYPE and HELP), none longer than
    MAX_LINE: prometheus_client's parser takes time quadratic in a line's length (a 1.5 MiB comment
    line, or one sample with 40,000 labels, timed the source out at every scrape), and the lines of
    every other metric are work for nothing."""
    keep = []
    for line in text.splitlines():
        if len(line) > MAX_LINE or not line.strip():
            continue
        if line.startswith("#"):
            words = line.split(None, 3)
            if len(words) >= 3 and words[1] in ("TYPE", "HELP") and _wanted(words[2]):
                keep.append(line)
            continue
        head = line.split("{", 1)[0].split(None, 1)  # the metric's name: before its labels or value
        if head and _wanted(head[0]):
            keep.append(line)
    return "\n".join(keep) + "\n" if keep else ""


def _wanted(name: str) -> bool:
    return name in WANTED or name.removesuffix("_total") in WANTED


def _samples(text: str) -> Iterator[Series]:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name = s.name
            if family.type == "counter" and name == family.name + "_total" and name not in WANTED:
                name = family.name
            yield Series(name, s.labels, s.value)


# ---------------------------------------------------------------- values


def _number(value: Any) -> float | int | None:
    """A finite int or float that is not one of DCGM's blank sentinels, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value in _BLANKS or value == _INT64_BLANK_AS_FLOAT:
        return None
    return value


def _integral(value: float | int, hi: int) -> int | None:
    if isinstance(value, float) and not value.is_integer():
        return None
    n = int(value)
    return n if 0 <= n <= hi else None


def convert(value: Any, kind: Kind) -> float | int | None:
    """The value as the contract's field of this kind takes it, or None (left out)."""
    v = _number(value)
    if v is None:
        return None
    if kind == "u64":
        return _integral(v, schemas.U64_MAX)
    if kind == "u32":
        return _integral(v, schemas.U32_MAX)
    if kind == "flag":
        return int(v) if v in (0, 1) else None
    if kind == "pct":
        ok = 0 <= v <= 100
    elif kind == "temp":
        ok = -60 <= v <= 250
    else:  # nonneg, int
        ok = v >= 0
    if not ok:
        return None
    if kind == "nonneg":
        return float(v)
    return int(v) if float(v).is_integer() else float(v)


def _xid_code(series: Series) -> int | None:
    """The XID code of one DCGM_FI_DEV_XID_ERRORS series: its `err_code` label where it is a
    number, else its value; None where neither is a code (0 is "no XID yet", and is a code here)."""
    code: Any = None
    label = series.labels.get("err_code")
    text = label.strip() if label is not None else ""
    # ASCII digits, at most 10 (an XID is a 32-bit number): str.isdigit() takes '²', which int()
    # refuses, and 5000 nines pass it to int()'s digit limit; either raised out of every scrape
    if text.isascii() and text.isdigit() and len(text) <= 10:
        code = int(text)
    else:
        v = _number(series.value)
        if v is not None and (isinstance(v, int) or v.is_integer()):
            code = int(v)
    if code is None or not 0 <= code <= schemas.MAX_XID:
        return None
    return code


# ---------------------------------------------------------------- hosts


def _short(name: str) -> str:
    return name.split(".", 1)[0]


def host_matches(label: str, node: str) -> bool:
    """The exporter's host label names this node: equal ignoring case, or equal up to the first
    dot (an FQDN for a short name, or the reverse)."""
    a, b = label.strip().lower(), node.strip().lower()
    return bool(a) and (a == b or _short(a) == _short(b))


# ---------------------------------------------------------------- one scrape's GPUs


@dataclass
class _Gpu:
    uuids: set[str] = field(default_factory=set)
    device: dict[str, list[Any]] = field(default_factory=dict)  # metric -> values, GPU-level series
    instance: dict[str, list[Any]] = field(default_factory=dict)  # metric -> values, MIG instances
    xid_codes: set[int] = field(default_factory=set)  # readable XID gauge codes; empty: no gauge


@dataclass
class Selection:
    """What a scrape held for this node, and what was left out because of its host."""

    gpus: dict[int, _Gpu]
    foreign_hosts: set[str]
    unlabelled: int


def select(series: Iterable[Series], node: str, any_host: bool) -> Selection:
    gpus: dict[int, _Gpu] = {}
    foreign: set[str] = set()
    unlabelled = 0
    for s in series:
        if s.name not in WANTED:
            continue
        labels = s.labels
        if any(k in labels for k in NOT_GPU_LABELS):
            continue
        index = _index(labels.get("gpu"))
        if index is None:
            continue
        if not any_host:
            hosts = [labels[k] for k in HOST_LABELS if k in labels]
            if not hosts:
                unlabelled += 1
                continue
            if not any(host_matches(h, node) for h in hosts):
                if len(foreign) < 8:
                    foreign.update(h[:64] for h in hosts)
                continue
        gpu = gpus.setdefault(index, _Gpu())
        for k in UUID_LABELS:
            uuid = labels.get(k)
            if uuid:
                gpu.uuids.add(uuid)
                break
        if s.name == XID_METRIC:
            code = _xid_code(s)  # a gauge with no readable code counts as no gauge
            if code is not None:
                gpu.xid_codes.add(code)
            continue
        bucket = gpu.instance if INSTANCE_LABEL in labels else gpu.device
        bucket.setdefault(s.name, []).append(s.value)
    return Selection(gpus, foreign, unlabelled)


def _index(label: str | None) -> int | None:
    if label is None or not label.isascii() or not label.isdigit() or len(label) > 3:
        return None
    index = int(label)
    return index if index <= schemas.MAX_GPU_INDEX else None


def _agreed(gpu: _Gpu, metric: str, kind: Kind) -> float | int | None:
    """The metric's one value for this GPU: from its GPU-level series if any, else from its MIG
    instances' series; None when missing, unreadable, or when the series disagree."""
    values = gpu.device.get(metric) or gpu.instance.get(metric)
    if not values:
        return None
    converted = {convert(v, kind) for v in values}
    if len(converted) != 1:
        return None
    return converted.pop()


def gpu_fields(gpu: _Gpu) -> dict[str, Any]:
    """The telemetry/1 fields of one GPU (without index, uuid and xids)."""
    out: dict[str, Any] = {}
    for metric, (key, kind) in FIELDS.items():
        if key in out:  # throttle_reasons under its newer name already
            continue
        value = _agreed(gpu, metric, kind)
        if value is not None:
            out[key] = value
    for key, (parts, kind, need_all) in SUMS.items():
        values = [_agreed(gpu, p, kind) for p in parts]
        present = [v for v in values if v is not None]
        if not present or (need_all and len(present) < len(values)):
            continue
        total = sum(int(v) for v in present)
        if total <= (schemas.U32_MAX if kind == "u32" else schemas.U64_MAX):
            out[key] = total
    return out


# ---------------------------------------------------------------- the source


class DcgmExporterSource:
    """`sample()` -> {"gpus": [{"index": 0, "uuid": ..., "util": ..., ...}, ...]} from a
    dcgm-exporter endpoint, or {} when the endpoint gives nothing (see the module docstring)."""

    name = "dcgm"

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        node: str | None = None,
        any_host: bool = False,
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SourceUnavailable(f"dcgm: {url!r} is not an http(s) URL of the exporter's metrics")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as e:  # a port out of range or not a number
            raise SourceUnavailable(f"dcgm: {url!r}: {e}") from None
        if parts.username is not None or parts.password is not None:
            raise SourceUnavailable(f"dcgm: {parts.hostname}: credentials in the URL are not supported")
        if not (timeout_s > 0 and math.isfinite(timeout_s)):
            raise SourceUnavailable(f"dcgm: timeout {timeout_s!r} must be a positive number of seconds")
        self.url = url
        self._parts = parts
        # the port always given: http.client reads a bare IPv6 literal's last group as one
        self._port = port
        self._tls = ssl.create_default_context() if parts.scheme == "https" else None
        self.timeout_s = float(timeout_s)
        self.node = node or socket.gethostname().split(".")[0]
        self.any_host = any_host
        self._guard = SingleFlight(self.name)
        self._xids: dict[str, frozenset[int]] = {}  # GPU key -> its codes at the last scrape
        self._closed = False
        self._down: str | None = None  # why the endpoint gave nothing, while it does not
        self._noted: set[str] = set()

    def sample(self) -> dict[str, Any]:
        with self._guard():
            if self._closed:
                raise RuntimeError("dcgm: sample() after close()")
            try:
                text = self._fetch()
            except ScrapeError as e:
                if self._down is None:
                    log.warning("dcgm: %s gives no GPU data: %s (retrying each sample)", self.url, e)
                self._down = str(e)
                return {}
            if self._down is not None:
                log.warning("dcgm: %s answers again", self.url)
                self._down = None
            return self._gpus(parse(text))

    def close(self) -> None:
        self._closed = True

    # ------------------------------------------------------------ reading

    def _fetch(self) -> str:
        deadline = time.monotonic() + self.timeout_s
        parts = self._parts
        host = parts.hostname or ""
        conn: http.client.HTTPConnection
        if self._tls is not None:
            conn = http.client.HTTPSConnection(host, self._port, timeout=self.timeout_s, context=self._tls)
        else:
            conn = http.client.HTTPConnection(host, self._port, timeout=self.timeout_s)
        cut = threading.Timer(self.timeout_s, _shut, args=(conn,))
        cut.daemon = True
        try:
            cut.start()
            conn.connect()
            if time.monotonic() >= deadline:  # (connected after the cut looked for a socket)
                raise ScrapeError(f"no answer within {self.timeout_s:g} s")
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            conn.request(
                "GET",
                path,
                headers={"Accept": "text/plain; version=0.0.4", "User-Agent": f"fleetwatch/{__version__}"},
            )
            response = conn.getresponse()
            if not 200 <= response.status < 300:
                raise ScrapeError(f"HTTP {response.status} {response.reason}"[:200])
            chunks: list[bytes] = []
            size = 0
            while True:
                if time.monotonic() > deadline:
                    raise ScrapeError(f"the body took longer than {self.timeout_s:g} s")
                chunk = response.read1(READ_CHUNK)
                if not chunk:
                    break
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise ScrapeError(f"the body is over {MAX_BODY_BYTES} bytes")
                chunks.append(chunk)
            if time.monotonic() > deadline:  # the cut ends a read early: what came is not the body
                raise ScrapeError(f"no answer within {self.timeout_s:g} s")
            if response.length:  # fewer bytes than its Content-Length: cut short (an exporter's restart)
                raise ScrapeError(f"the body ended {response.length} bytes short of its length")
        except (OSError, http.client.HTTPException, ValueError, RuntimeError) as e:
            # timeouts, refused connections, TLS errors and a socket the cut shut are OSErrors; a
            # RuntimeError: no thread to be had for the cut
            if time.monotonic() >= deadline:
                raise ScrapeError(f"no answer within {self.timeout_s:g} s") from None
            raise ScrapeError(f"{type(e).__name__}: {e}"[:200]) from None
        finally:
            cut.cancel()
            conn.close()
        return b"".join(chunks).decode("utf-8", errors="replace")

    # ------------------------------------------------------------ mapping

    def _gpus(self, series: list[Series]) -> dict[str, Any]:
        chosen = select(series, self.node, self.any_host)
        self._note_left_out(chosen)
        gpus: list[dict[str, Any]] = []
        seen: set[str] = set()
        for index in sorted(chosen.gpus):
            gpu = chosen.gpus[index]
            if len(gpu.uuids) > 1:
                self._note(f"gpu {index} has {len(gpu.uuids)} UUIDs", "left out: its series disagree")
                continue
            entry: dict[str, Any] = {"index": index}
            uuid = next(iter(gpu.uuids), None)
            if uuid is not None and len(uuid) <= schemas.MAX_ID_LEN:
                entry["uuid"] = uuid
            entry.update(gpu_fields(gpu))
            key = uuid if uuid is not None else f"index:{index}"
            seen.add(key)
            xids = self._new_xids(key, gpu)
            if xids is not None:
                entry["xids"] = xids
            gpus.append(entry)
        if len(self._xids) > MAX_XID_STATE:
            self._xids = {k: v for k, v in self._xids.items() if k in seen}
        return {"gpus": gpus}

    def _new_xids(self, key: str, gpu: _Gpu) -> list[int] | None:
        """The XID codes that appeared on this GPU since the last scrape; None at its first
        scrape (the baseline) and where the scrape has no XID gauge for it."""
        if not gpu.xid_codes:
            return None
        codes = frozenset(gpu.xid_codes)
        before = self._xids.get(key)
        self._xids[key] = codes
        if before is None:
            return None
        return sorted(c for c in codes - before if c != 0)[: schemas.MAX_XIDS]

    def _note_left_out(self, chosen: Selection) -> None:
        if chosen.unlabelled:
            self._note(
                "unlabelled",
                f"{chosen.unlabelled} GPU series carry no hostname label: left out "
                "(--dcgm-any-host takes them when this endpoint serves this node only)",
            )
        if chosen.foreign_hosts:
            hosts = ", ".join(sorted(chosen.foreign_hosts))
            self._note(
                f"foreign {hosts}",
                f"series of host(s) {hosts} are not node {self.node!r}: left out "
                "(--dcgm-any-host takes them when this endpoint serves this node only)",
            )

    def _note(self, key: str, message: str) -> None:
        """Log each kind of left-out data once (it repeats every sample), with a bound."""
        if key not in self._noted and len(self._noted) < 64:
            self._noted.add(key)
            log.warning("dcgm: %s: %s", self.url, message)
