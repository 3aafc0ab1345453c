"""The agent's `kernel` source: the events of the node's kernel log since the last sample, as the
telemetry/1 `kernel` section (docs/contract.md):

    {"kernel": {"boot": "<boot_id>", "events": [{kind, code, pci, gpu, ...}], "records": n,
                "unknown": n, "rejected": n, "missed": n, "coalesced": n, "dropped": n}}

  sent only in a sample where the kernel log had something to say (an event, or a count other
  than `records`); a quiet sample leaves the section out.

- Records come from /dev/kmsg after the cursor (kmsg.py), or, with `reader="journal"`, from the
  systemd journal's kernel entries after its cursor (journal.py: journalctl, for sites whose kernel
  log is the journal); the cursor the sample reaches goes back to the agent under `_cursor`, and the
  agent stores it in the spool with the sample itself, so an event is neither lost nor sent twice
  across restarts, and a reboot rescans the new boot. After the reading, one path: the records'
  lines (lines.py), their events (events.py).
- A flood (a driver in an error loop prints the same XID thousands of times) is read at most
  `max_records` and `budget_s` a sample (the rest next time: the sampling cadence does not slip;
  benchmarks/kernel_flood.py), and repeats of
  one event (same kind, code, device, link, unit, severity, recovery action) are one event with
  their `count`; at most `max_events` distinct events a sample, the others `dropped` (counted).
- GPU index: NVML numbers GPUs in PCI address order; the source reads the NVIDIA GPUs' addresses
  from sysfs, not from NVML, which hangs on a GPU that fell off the bus (the very event to report).
  An AER error that a port (or a PCIe switch) reports is the GPU's below it where exactly one GPU
  is (sysfs's device tree), else the InfiniBand HCA's (`hca`) where exactly one HCA is at or below
  it; with several below, the event names the port only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import Counter

from fleetwatch import schemas
from fleetwatch.collectors.kernel_log.events import EventParser, KernelEvent
from fleetwatch.collectors.kernel_log.journal import JOURNALCTL, TIMEOUT_S, JournalReader
from fleetwatch.collectors.kernel_log.kmsg import (
    BOOT_ID,
    Cursor,
    Device,
    KmsgDevice,
    KmsgReader,
    read_boot_id,
)
from fleetwatch.collectors.kernel_log.lines import LineReader
from fleetwatch.collectors.sources import SingleFlight

SYS_PCI = Path("/sys/bus/pci/devices")
NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # VGA and 3D controllers (NVSwitches are 0x0680: bridges)
MAX_RECORDS = 20_000  # a sample's read of the kernel log ...
BUDGET_S = 0.2  # ... and the time it may take (the agent samples every second by default)
CHUNK = 1000  # records read between two looks at the clock
MAX_EVENTS = 256  # distinct events a sample carries


def _pci_devices(sys_pci: Path) -> list[Path]:
    """The PCI functions sysfs lists (/sys/bus/pci/devices/<address>), by address; none where it
    cannot be read."""
    try:
        return sorted(d for d in sys_pci.iterdir() if schemas.PCI_RE.match(d.name.lower()))
    except OSError:
        return []


def _ports_above(dev: Path) -> list[str]:
    """The bridges and ports above a PCI function, from where sysfs puts it
    (/sys/bus/pci/devices/<dev> links to /sys/devices/pci0000:00/<port>/.../<dev>); [] where the
    link cannot be followed."""
    address = dev.name.lower()
    try:
        parts = dev.resolve().parts
    except OSError:
        return []
    return [p for p in parts if p != address and schemas.PCI_RE.match(p)]


def nvidia_gpus(sys_pci: Path = SYS_PCI) -> dict[str, int]:
    """{PCI address: GPU index}: the NVIDIA GPUs sysfs lists, in address order (NVML's order)."""
    found = []
    for dev in _pci_devices(sys_pci):
        try:
            vendor = (dev / "vendor").read_text().strip()
            klass = (dev / "class").read_text().strip()
        except OSError:
            continue
        if vendor == NVIDIA_VENDOR and klass.startswith(GPU_CLASSES):
            found.append(dev.name.lower())
    return {address: i for i, address in enumerate(sorted(found))}


def gpus_below_ports(sys_pci: Path = SYS_PCI) -> dict[str, tuple[int, ...]]:
    """{bridge or port address: the indices of the NVIDIA GPUs below it}: an AER error a port
    reports about its link is the GPU's below it."""
    below: dict[str, list[int]] = {}
    for address, index in nvidia_gpus(sys_pci).items():
        for port in _ports_above(sys_pci / address):
            below.setdefault(port, []).append(index)
    return {port: tuple(sorted(gpus)) for port, gpus in below.items()}


def hcas_below_ports(sys_pci: Path = SYS_PCI) -> dict[str, tuple[str, ...]]:
    """{device, bridge or port address: the InfiniBand HCAs (mlx5_0, ...) at or below it}: a PCI
    function with an `infiniband` directory in sysfs is an HCA (the RDMA core lists its devices
    there)."""
    below: dict[str, list[str]] = {}
    for dev in _pci_devices(sys_pci):
        try:
            names = [p.name for p in (dev / "infiniband").iterdir() if schemas.NAME_RE.match(p.name)]
        except OSError:
            continue
        for place in (dev.name.lower(), *_ports_above(dev)):
            below.setdefault(place, []).extend(names)
    return {place: tuple(sorted(set(hcas))) for place, hcas in below.items() if hcas}


# the agent's own view of its kernel log (its /metrics): what a wrapped ring buffer cost
# (missed), what it could not read (unknown, rejected), and how much it read
COUNTED = ("records", "missed", "overruns", "gone_before_start", "unknown", "rejected", "dropped")
RECORDS = Counter(
    "fleetwatch_agent_kernel_records_total",
    "kernel log records by what became of them: read (records), lost to the ring buffer before the "
    "agent read them (missed, gone_before_start), EPIPE answers (overruns), lines of no known form "
    "(unknown), lines that broke an event's grammar (rejected), events past a sample's bound (dropped)",
    ["what"],
)
EVENTS = Counter("fleetwatch_agent_kernel_events_total", "kernel log events sent (repeats folded into one)")
_QUIET = frozenset({"boot", "events", "records"})  # a section with nothing but these says nothing


class Reader(Protocol):
    """Where records come from: KmsgReader or JournalReader."""

    missed: int
    overruns: int
    gone_before_start: int

    def read(self, limit: int) -> list[str]: ...

    def position(self) -> dict[str, int | str]: ...

    def close(self) -> None: ...


READERS = ("kmsg", "journal")


def _repeat_key(e: KernelEvent) -> tuple[Any, ...]:
    x = e.extra
    return (
        e.kind, e.code, e.pci, e.severity, x.get("link"), x.get("unit"), x.get("recovery_action"),
        x.get("device"), x.get("server"),
    )  # fmt: skip


class KernelLogSource:
    name = "kernel"

    def __init__(
        self,
        cursor: Cursor | None = None,
        device: Callable[[], Device] = KmsgDevice,
        boot_id: Path = BOOT_ID,
        gpus: Callable[[], dict[str, int]] = nvidia_gpus,
        below: Callable[[], dict[str, tuple[int, ...]]] = gpus_below_ports,
        hcas: Callable[[], dict[str, tuple[str, ...]]] = hcas_below_ports,
        max_records: int = MAX_RECORDS,
        max_events: int = MAX_EVENTS,
        budget_s: float = BUDGET_S,
        reader: str = "kmsg",
        journal_cursor: str | None = None,
        journalctl: str = JOURNALCTL,
        journal_args: Sequence[str] = (),
        journal_timeout_s: float = TIMEOUT_S,
    ) -> None:
        self._boot_id = read_boot_id(boot_id)
        self._reader: Reader
        if reader == "journal":
            self._reader = JournalReader(
                self._boot_id, journal_cursor, journalctl, journal_args, journal_timeout_s, budget_s
            )
        elif reader == "kmsg":
            self._reader = KmsgReader(device(), self._boot_id, cursor)
        else:
            raise ValueError(f"unknown kernel log reader {reader!r} (choose from {', '.join(READERS)})")
        self._gpus = gpus
        self._below = below
        self._hcas = hcas
        self._lines = LineReader()
        self._events = EventParser()
        self._max_records = max_records
        self._max_events = max_events
        self._budget_s = budget_s
        self._flight = SingleFlight(self.name)
        self._counted = {"unknown": 0, "rejected": 0, "missed": 0, "overruns": 0}
        self._outside = 0  # event fields past the contract, left out (in `rejected`)

    @property
    def cursor(self) -> Cursor | str | None:
        """The reader's position: kmsg's Cursor, or the journal's cursor string (None: none yet)."""
        return self._reader.cursor  # type: ignore[attr-defined, no-any-return]

    def sample(self) -> dict[str, Any]:
        with self._flight():
            deadline = time.monotonic() + self._budget_s
            events: list[KernelEvent] = []
            read = 0
            drained = False
            while read < self._max_records and not drained:
                want = min(CHUNK, self._max_records - read)
                try:
                    records = self._reader.read(want)
                except Exception:
                    if not read:
                        raise  # nothing read: the failure is this sample's (agent.source_errors)
                    break  # what was read goes out with its cursor; a failure that lasts comes next
                read += len(records)
                drained = len(records) < want  # nothing more is waiting
                for record in records:
                    for text in record.split("\n"):  # the record, then its dictionary lines
                        line = self._lines.parse(text)
                        if line is not None:
                            events += self._events.feed(line)
                if time.monotonic() >= deadline:
                    break  # the rest next sample: the agent's cadence does not wait for a flood
            if drained:  # what is open is complete: nothing more came
                events += self._events.flush()
            section = self._section(events, read)
            for what in COUNTED:  # the agent's /metrics, quiet samples included
                if section.get(what):
                    RECORDS.labels(what).inc(section[what])
            EVENTS.inc(len(section["events"]))
            # A quiet sample (no event, nothing missed or unknown) sends no section: the common
            # message then stays on the worker's compiled fast path, which leaves every message
            # with a `kernel` section to the full decoder.
            part: dict[str, Any] = {"kernel": section} if section.keys() - _QUIET or section["events"] else {}
            position = self._reader.position()
            if position:  # a position to keep (none before anything was read in this boot)
                part["_cursor"] = position
            return part

    def _section(self, events: list[KernelEvent], records: int) -> dict[str, Any]:
        merged: dict[tuple[Any, ...], KernelEvent] = {}
        dropped = 0
        for e in events:
            key = _repeat_key(e)
            first = merged.get(key)
            if first is not None:
                first.count += e.count
            elif len(merged) < self._max_events:
                merged[key] = e
            else:
                dropped += e.count
        gpus = self._gpus() if merged else {}
        aer = any(e.kind == "aer" for e in merged.values())
        below = self._below() if aer else {}
        hcas = self._hcas() if aer else {}
        out = []
        outside = 0  # fields past the contract left out of the events (counted as rejected)
        for e in merged.values():
            # no boot id in an event: the section's `boot` is theirs (kmsg lines carry none, the
            # journal's are this boot's)
            d = e.described(gpus, self._events.uuids)
            d.pop("line", None)  # a position in a file; kmsg has `seq`
            d.pop("boot_id", None)
            if "gpu" not in d and e.kind == "aer":  # a port's error about its link: the one GPU below
                under = below.get(e.pci or "") or below.get(e.extra.get("port", ""), ())
                if len(under) == 1:
                    d["gpu"] = under[0]
                else:  # or the one InfiniBand HCA at or below that device or port
                    nics = hcas.get(e.pci or "") or hcas.get(e.extra.get("port", ""), ())
                    if len(nics) == 1:
                        d["hca"] = nics[0]
            out.append(d)
            outside += _keep_within_contract(d)
        self._outside += outside
        now = {
            "unknown": self._lines.unknown + getattr(self._reader, "unknown", 0),
            "rejected": self._events.rejected + self._outside,
            "missed": self._reader.missed,
            "overruns": self._reader.overruns,
        }
        delta = {k: v - self._counted[k] for k, v in now.items()}
        self._counted = now
        section: dict[str, Any] = {"boot": self._boot_id[:64], "events": out, "records": records}
        section.update({k: v for k, v in delta.items() if v})
        if self._reader.gone_before_start:
            section["gone_before_start"] = self._reader.gone_before_start
            self._reader.gone_before_start = 0  # said once
        coalesced = len(events) - len(out) - dropped
        if coalesced:
            section["coalesced"] = coalesced
        if dropped:
            section["dropped"] = dropped
        return section

    def close(self) -> None:
        self._reader.close()


def _keep_within_contract(event: dict[str, Any]) -> int:
    """Leave out an event's fields past what the contract allows (a pid past 32 bits, a link past
    65535 or below -1, ...): one such field made the agent leave the whole kernel section out of the
    sample, with every event in it. The event stays, with what it says within the contract; how
    many fields were left out."""
    gone = [k for k in schemas.outside("kernel.events[]", event, schemas.KERNEL_EVENT_FIELDS) if k != "kind"]
    for key in gone:
        del event[key]
    return len(gone)
