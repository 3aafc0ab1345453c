"""The events a GPU node's kernel log holds: NVIDIA XIDs, NVSwitch SXids, GPUs fallen off the bus,
PCIe AER errors, and the lines that name a GPU's UUID at a PCI address.

Grammar (tests/fixtures/kernel_log/README.md has the sources):

- XID: `NVRM: Xid (<dev>): <code>, [pid=<pid>, name=<name>, ]<text>`; <dev> is `PCI:dddd:bb:dd`
  or, from older drivers, `dddd:bb:dd`; pid may be `'<unknown>'`. NVLink5 XIDs (144-150) carry
  `<UNIT> <Fatal|Nonfatal> XC<n> i<n> Link <n> (<six words>)`, separated by runs of spaces;
  XID 154 `GPU recovery action changed from 0x<a> (<name>) to 0x<b> (<name>)`.
- SXid: `nvidia-nvswitch<N>: SXid (PCI:dddd:bb:dd.f): <code>, <part>`, one event printed as up to
  three lines that each repeat the prefix: `<Fatal|Non-fatal>, Link <n> <text>`, `Severity <s>
  Engine instance <e> Sub-engine instance <x>`, `Data {...}`. They are folded per switch into one
  event; lines of different switches interleave.
- Fallen off the bus: `NVRM: GPU dddd:bb:dd.f: GPU has fallen off the bus.`, and at probe time one
  record of three lines, `The NVIDIA GPU <dev>` / `(PCI ID: <id>) installed in this system has` /
  `fallen off the bus and is not responding to commands.` (dmesg prints the later lines indented,
  kmsg in one record). No XID number: kind fallen_off_bus. The XID 79 line beside it is an xid.
- AER: a header `<drv> <port>: AER: [Multiple ]<Corrected|Correctable|Uncorrected (..)|
  Uncorrectable (..)> error [message ]received[:| from] <dev | id=XXXX>`, then lines of the device
  (`PCIe Bus Error: severity=<s>, type=<t>, ...`, `device [vvvv:dddd] error status/mask=...`,
  `[ n] <bit name>`), older kernels with `id=` (bus << 8 | devfn, domain 0000).
- `NVRM: GPU at [PCI:]dddd:bb:dd: GPU-<uuid>`: the UUID of the GPU at that address.

- The node's storage and its hung tasks (one line each; tests/fixtures/kernel_log/other_io_errors.txt):
  `[blk_update_request: |print_req_error: ]I/O error, dev <dev>, sector <n> ...` and `Buffer I/O
  error on dev[ice] <dev>, logical block <n>` and `EXT4-fs error (device <dev>): ...` are kind
  io_error with `device`; `INFO: task <comm>:<pid> blocked for more than <n> seconds.` is kind
  hung_task with `process`, `pid`; `nfs: server <host> not responding, still trying|timed out` is
  kind nfs_timeout with `server`.

A line none of these match is not an event (most of the log): nothing is guessed from it.
PCI addresses are written one way everywhere: `dddd:bb:dd.f`, lower case.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from fleetwatch.collectors.kernel_log.lines import LogLine

MAX_CODE = 2**32 - 1  # the driver prints an unsigned 32-bit code; more is no XID
MAX_TEXT = 512  # of a message kept in an event

# one-line events of the node's storage (device names: sda, sda1, nvme0n1p2, dm-1, mmcblk0p2)
_BLOCK_DEV = r"([A-Za-z0-9][A-Za-z0-9_.-]{0,31})"  # the one group of each alternative below
_IO_ERROR = re.compile(
    rf"\bI/O error, dev {_BLOCK_DEV}, sector \d{{1,20}}"
    rf"|\bBuffer I/O error on dev(?:ice)? {_BLOCK_DEV}, logical block \d{{1,20}}"
    rf"|\bEXT4-fs error \(device {_BLOCK_DEV}\)"
)
_HUNG_TASK = re.compile(
    r"\bINFO: task (?P<process>.{1,64}?):(?P<pid>\d{1,10}) blocked for more than \d{1,10} seconds"
)
_NFS_TIMEOUT = re.compile(r"\bnfs: server (?P<server>\S{1,64}) not responding, (?:still trying|timed out)")
_DEV = r"(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)"
_XID = re.compile(rf"NVRM: Xid \((?:PCI:)?{_DEV}\): (?P<code>\d{{1,12}}),\s*(?P<rest>.*)$", re.S)
_PID = re.compile(r"^pid=(?P<pid>\d{1,10}|'?<unknown>'?)(?:, name=(?P<name>.*?))?, (?P<rest>.*)$", re.S)
_NVLINK5 = re.compile(
    r"^(?P<unit>[A-Z][A-Z0-9_]{0,63})\s+(?P<sev>Fatal|Nonfatal|Non-fatal)\s+XC(?P<xc>\d{1,6})\s+i(?P<inst>\d{1,6})\s+"
    r"Link\s+(?P<link>-?\d{1,6})\s*\((?P<words>[^)]*)\)"
)
_RECOVERY = re.compile(
    r"GPU recovery action changed from (?P<from>0x[0-9a-fA-F]{1,8}) \((?P<from_name>[^)]{0,64})\) "
    r"to (?P<to>0x[0-9a-fA-F]{1,8}) \((?P<to_name>[^)]{0,64})\)"
)
_SXID = re.compile(
    rf"nvidia-nvswitch(?P<switch>\d{{1,4}}): SXid \((?:PCI:)?{_DEV}\): (?P<code>\d{{1,12}}),\s*(?P<rest>.*)$",
    re.S,
)
_SXID_MAIN = re.compile(r"^(?P<sev>Fatal|Non-fatal|Nonfatal), Link (?P<link>-?\d{1,6})\s*(?P<text>.*)$", re.S)
_SXID_SEVERITY = re.compile(
    r"^Severity (?P<level>\d{1,6}) Engine instance (?P<engine>\d{1,6}) Sub-engine instance (\d{1,6})"
)
_SXID_DATA = re.compile(r"^Data \{(?P<data>[^}]*)\}")
_FALLEN_ONE_LINE = re.compile(rf"NVRM: GPU {_DEV}: GPU has fallen off the bus")
_FALLEN_START = re.compile(rf"NVRM: The NVIDIA GPU {_DEV}(?:\s|$)")
_FALLEN_END = re.compile(r"fallen off the bus and is not responding to commands")
_GPU_AT = re.compile(rf"NVRM: GPU at (?:PCI:)?{_DEV}: (?P<uuid>GPU-[0-9a-fA-F-]{{36}})\b")
_BDF = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"  # as the PCI layer prints a device
_AER_HEADER = re.compile(
    rf"^\S+ (?P<port>{_BDF}): AER: (?:Multiple )?"
    r"(?P<sev>Corrected|Correctable|Uncorrect(?:ed|able) \((?:Non-Fatal|Fatal)\))"
    rf" error (?:message )?received(?::| from) (?:id=(?P<id>[0-9a-fA-F]{{4}})|(?P<src>{_BDF}))"
)
_AER_DETAIL = re.compile(rf"^\S+ (?P<dev>{_BDF}): (?:AER: )?\s*(?P<what>.*)$", re.S)
# bounded names: unbounded, each of a line's repeats of the phrase rescanned the rest of it (quadratic)
_AER_BUS_ERROR = re.compile(r"PCIe Bus Error: severity=(?P<sev>[^,]{1,64}), type=(?P<type>[^,]{1,64})")
_AER_DEVICE = re.compile(
    r"device \[(?P<vendor>[0-9a-fA-F]{4}):(?P<device>[0-9a-fA-F]{4})\] error status/mask"
)
# the name is the rest of the line, trimmed in code: a lazy name before optional spaces, an optional
# "(First)" and more spaces backtracked in cubic time on a line of spaces (8,000: over a minute)
_AER_BIT = re.compile(r"^\[\s*(?P<bit>\d{1,2})\s*\]\s*(?P<name>\S.*)$", re.S)

FOLD_WINDOW_S = 2.0  # companion lines come within milliseconds of their first line
XID_CACHE = 1024  # distinct XID lines whose parse is kept (a flood repeats one)


def pci_address(text: str) -> str:
    """`PCI:0000:9B:00`, `00000000:9b:00.0` -> `0000:9b:00.0`: one spelling for one device."""
    text = text.removeprefix("PCI:").lower()
    domain, bus, rest = text.split(":", 2)
    device, _, function = rest.partition(".")
    return f"{int(domain, 16):04x}:{bus}:{device}.{function or '0'}"


def _severity(word: str) -> str:
    """An event's own severity word, in one spelling: fatal, nonfatal or corrected."""
    w = word.lower()
    if "non" in w:
        return "nonfatal"
    if "fatal" in w:
        return "fatal"
    return "corrected"  # Corrected / Correctable


@dataclass(slots=True)
class KernelEvent:
    kind: str  # xid | sxid | fallen_off_bus | aer | io_error | hung_task | nfs_timeout
    pci: str | None  # the device the event is about (for aer: the device below the port, if named)
    text: str
    code: int | None = None  # XID / SXid number
    severity: str | None = None  # as the line says it (fatal, nonfatal, corrected), where it does
    ts: float | None = None
    since_boot_s: float | None = None
    seq: int | None = None  # kmsg sequence of the event's first line
    boot_id: str | None = None
    count: int = 1  # repeats folded into this event (coalesce)
    line: int | None = None  # where its first line is in the input (1-based), for saved logs
    extra: dict[str, Any] = field(default_factory=dict)  # pid, process, link, unit, recovery, port, ...

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        extra = d.pop("extra")
        return {k: v for k, v in {**d, **extra}.items() if v is not None}

    def described(self, gpus: dict[str, int], uuids: dict[str, str]) -> dict[str, Any]:
        """to_dict() with the GPU's index and UUID where its address names one."""
        d = self.to_dict()
        if self.pci in gpus:
            d["gpu"] = gpus[self.pci]
        if self.pci in uuids:
            d["uuid"] = uuids[self.pci]
        return d


def _from_line(kind: str, line: LogLine, pci: str | None, at: int | None = None, **kw: Any) -> KernelEvent:
    return KernelEvent(
        kind,
        pci,
        line.text.strip()[:MAX_TEXT],
        ts=line.ts,
        since_boot_s=line.since_boot_s,
        seq=line.seq,
        boot_id=line.boot_id,
        line=at,
        **kw,
    )


class EventParser:
    """Events from a stream of LogLines. Multi-line events are folded: feed() returns the events
    complete so far, flush() the ones still open (end of input, or nothing more came for a while).
    `uuids` collects each PCI address's GPU UUID as the driver names it; `rejected` counts lines
    that looked like an event and broke its grammar (a code past 2**32, ...)."""

    def __init__(self) -> None:
        self.uuids: dict[str, str] = {}
        self.rejected = 0
        self._sxid: dict[str, KernelEvent] = {}  # switch address -> its open event
        self._fallen: tuple[str, LogLine, int, int] | None = (
            None  # address, first line, its number, lines left
        )
        self._aer: dict[str, KernelEvent] = {}  # port -> its open AER event
        self.lines = 0
        self._xid_seen: dict[str, tuple[str | None, int | None, str | None, dict[str, Any]]] = {}

    def feed(self, line: LogLine, at: int | None = None) -> list[KernelEvent]:
        """The events this line completes; `at`: its line number in a file (default: lines fed)."""
        self.lines = at if at is not None else self.lines + 1
        out = self._stale(line)
        text = line.text
        if "NVRM" in text:
            out += self._nvrm(line)
        elif "SXid" in text:
            out += self._sxid_line(line)
        elif "AER" in text or self._aer:
            out += self._aer_line(line)
        elif "error" in text or "INFO: task" in text or "nfs:" in text:
            out += self._storage_line(line)
        if self._fallen is not None and "NVRM" not in text:
            out += self._fallen_continued(line)
        return out

    def flush(self) -> list[KernelEvent]:
        out = list(self._sxid.values()) + list(self._aer.values())
        self._sxid.clear()
        self._aer.clear()
        self._fallen = None
        return out

    # ------------------------------------------------------------ NVRM

    def _nvrm(self, line: LogLine) -> list[KernelEvent]:
        text = line.text
        known = self._xid_seen.get(text)
        if known is not None:  # a flood repeats its line: parsed once
            pci, code, severity, extra = known
            event = _from_line("xid", line, pci, code=code, severity=severity, at=self.lines)
            event.extra = dict(extra)
            return [event]
        m = _XID.search(text)
        if m:
            return self._xid(line, m)
        if "NVRM: Xid" in text:  # cut short, or an address or code that is none: counted, not lost
            self.rejected += 1
            return []
        m = _GPU_AT.search(text)
        if m:
            if len(self.uuids) < 4096:  # a node has a handful of GPUs; a flood of names is not one
                self.uuids[pci_address(m.group("pci"))] = m.group("uuid")
            return []
        m = _FALLEN_ONE_LINE.search(text)
        if m:
            return [
                _from_line(
                    "fallen_off_bus", line, pci_address(m.group("pci")), severity="fatal", at=self.lines
                )
            ]
        if self._fallen is not None:  # dmesg's indented later lines of the probe-time record
            out = self._fallen_continued(line)
            if out or self._fallen is not None:
                return out
        m = _FALLEN_START.search(text)
        if m:
            pci = pci_address(m.group("pci"))
            if _FALLEN_END.search(text):  # kmsg: the three lines in one record
                return [_from_line("fallen_off_bus", line, pci, severity="fatal", at=self.lines)]
            self._fallen = (pci, line, self.lines, 2)
        return []

    def _fallen_continued(self, line: LogLine) -> list[KernelEvent]:
        assert self._fallen is not None
        pci, first, at, left = self._fallen
        if _FALLEN_END.search(line.text):
            self._fallen = None
            event = _from_line("fallen_off_bus", first, pci, severity="fatal", at=at)
            event.text = f"{event.text} ... {line.text.strip()}"[:MAX_TEXT]
            return [event]
        self._fallen = (pci, first, at, left - 1) if left > 1 else None
        return []

    def _xid(self, line: LogLine, m: re.Match[str]) -> list[KernelEvent]:
        code = int(m.group("code"))
        if code > MAX_CODE:
            self.rejected += 1
            return []
        event = _from_line("xid", line, pci_address(m.group("pci")), code=code, at=self.lines)
        rest = m.group("rest")
        p = _PID.match(rest)
        if p:
            pid = p.group("pid")
            if pid.isdigit():
                event.extra["pid"] = int(pid)
            if p.group("name") and p.group("name") != "<unknown>":
                event.extra["process"] = p.group("name")[:64]
            rest = p.group("rest")
        n = _NVLINK5.match(rest)
        if n:
            event.severity = _severity(n.group("sev"))
            event.extra.update(unit=n.group("unit"), link=int(n.group("link")))
        r = _RECOVERY.search(rest)
        if r:
            event.extra["recovery_action"] = int(r.group("to"), 16)
            event.extra["recovery_action_name"] = r.group("to_name")[:64]
            event.extra["recovery_action_before"] = int(r.group("from"), 16)
        if len(self._xid_seen) >= XID_CACHE:
            self._xid_seen.clear()
        self._xid_seen[line.text] = (event.pci, event.code, event.severity, dict(event.extra))
        return [event]

    # ------------------------------------------------------------ NVSwitch

    def _sxid_line(self, line: LogLine) -> list[KernelEvent]:
        m = _SXID.search(line.text)
        if not m:
            self.rejected += ": SXid (" in line.text  # as an XID line that breaks its grammar
            return []
        code = int(m.group("code"))
        if code > MAX_CODE:
            self.rejected += 1
            return []
        switch = pci_address(m.group("pci"))
        rest = m.group("rest")
        open_ = self._sxid.get(switch)
        if open_ is not None and open_.code == code and _companion(open_.extra, rest):
            # the Data line is the last of the three
            return [self._sxid.pop(switch)] if "data" in open_.extra else []
        out = [self._sxid.pop(switch)] if open_ is not None else []
        event = _from_line("sxid", line, switch, code=code, at=self.lines)
        event.extra["switch"] = int(m.group("switch"))
        main = _SXID_MAIN.match(rest)
        if main:
            event.severity = _severity(main.group("sev"))
            event.extra["link"] = int(main.group("link"))
        else:  # a companion whose first line was not in the log, or a line of its own (SOE)
            _companion(event.extra, rest)
        return out + _hold(self._sxid, switch, event)

    # ------------------------------------------------------------ PCIe AER

    def _aer_line(self, line: LogLine) -> list[KernelEvent]:
        text = line.text.strip()
        h = _AER_HEADER.match(text)
        if h:
            port = pci_address(h.group("port"))
            out = [self._aer.pop(port)] if port in self._aer else []
            if h.group("src"):
                source: str | None = pci_address(h.group("src"))
            else:  # id=XXXX: bus << 8 | device << 3 | function, in the port's domain
                rid = int(h.group("id"), 16)
                source = f"{port[:4]}:{rid >> 8:02x}:{(rid >> 3) & 0x1F:02x}.{rid & 7}"
            event = _from_line("aer", line, source, severity=_severity(h.group("sev")), at=self.lines)
            event.extra["port"] = port
            return out + _hold(self._aer, port, event)
        d = _AER_DETAIL.match(text)
        if not d or not self._aer:
            return []
        dev = pci_address(d.group("dev"))
        event = next((e for e in self._aer.values() if dev in (e.pci, e.extra["port"])), None)
        if event is None:
            return []
        what = d.group("what")
        if (b := _AER_BUS_ERROR.search(what)) is not None:
            event.extra["error_type"] = b.group("type").strip()[:64]
            event.pci = dev if event.pci == event.extra["port"] else event.pci
        elif (v := _AER_DEVICE.search(what)) is not None:
            event.extra["pci_id"] = f"{v.group('vendor')}:{v.group('device')}".lower()
        elif (bit := _AER_BIT.match(what.strip())) is not None:
            names = event.extra.setdefault("errors", [])
            if len(names) < 32:
                whole = bit.group("name").strip()
                names.append((whole.removesuffix("(First)").rstrip() or whole)[:48])  # "(First)" alone: kept
        return []

    # ------------------------------------------------------------ folding

    def _storage_line(self, line: LogLine) -> list[KernelEvent]:
        """A block device's I/O error, a task hung in the kernel, an NFS server not answering."""
        text = line.text
        m = _IO_ERROR.search(text)
        if m:
            device = next(d for d in m.groups() if d)
            return [_from_line("io_error", line, None, at=self.lines, extra={"device": device})]
        m = _HUNG_TASK.search(text)
        if m:
            pid = int(m.group("pid"))
            extra = {"process": m.group("process")} | ({"pid": pid} if pid <= MAX_CODE else {})
            return [_from_line("hung_task", line, None, at=self.lines, extra=extra)]
        m = _NFS_TIMEOUT.search(text)
        if m:
            return [_from_line("nfs_timeout", line, None, at=self.lines, extra={"server": m.group("server")})]
        return []

    def _stale(self, line: LogLine) -> list[KernelEvent]:
        """Open events whose first line is FOLD_WINDOW_S older than this one: their companions
        will not come (where the lines carry no time, the next event of the same device closes
        them, or flush())."""
        now = line.since_boot_s if line.since_boot_s is not None else line.ts
        if now is None or not (self._sxid or self._aer):
            return []
        out = []
        for book in (self._sxid, self._aer):
            for key in [k for k, e in book.items() if _age(e, line) > FOLD_WINDOW_S]:
                out.append(book.pop(key))
        return out


MAX_OPEN = 64  # open multi-line events per kind: a node has a few NVSwitches and PCIe ports


def _hold(book: dict[str, KernelEvent], key: str, event: KernelEvent) -> list[KernelEvent]:
    """Hold `event` open for its companion lines; the oldest open one comes out complete as it
    is when the book is full. Each later line looks at every open event (its device's, or the
    stale ones): thousands of distinct ports or switches, which only forged lines name, made each
    line cost thousands of steps (4,000 headers: 2 s)."""
    out = [book.pop(next(iter(book)))] if len(book) >= MAX_OPEN and key not in book else []
    book[key] = event
    return out


def _companion(extra: dict[str, Any], rest: str) -> bool:
    """An SXid's Severity or Data line into its event's fields, where they are not filled yet;
    False if `rest` is neither (or that field is filled: a new event)."""
    s = _SXID_SEVERITY.match(rest)
    if s and "severity_level" not in extra:
        extra.update(severity_level=int(s.group("level")), engine=int(s.group("engine")))
        return True
    d = _SXID_DATA.match(rest)
    if d and "data" not in extra:
        extra["data"] = d.group("data")[:256]
        return True
    return False


def _age(event: KernelEvent, line: LogLine) -> float:
    if event.since_boot_s is not None and line.since_boot_s is not None:
        return line.since_boot_s - event.since_boot_s
    if event.ts is not None and line.ts is not None:
        return line.ts - event.ts
    return 0.0


def parse_events(lines: list[LogLine]) -> tuple[list[KernelEvent], EventParser]:
    """Every event of a whole log, in order of their first lines."""
    parser = EventParser()
    out: list[KernelEvent] = []
    for line in lines:
        out += parser.feed(line)
    out += parser.flush()
    out.sort(key=lambda e: e.line or 0)
    return out, parser
