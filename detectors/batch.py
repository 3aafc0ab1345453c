"""Columnar view of a batch of `telemetry/1` messages.

Detectors work on numpy arrays over a whole batch (hundreds to thousands of messages) rather than
on dicts, so that one detector core keeps up with >= 20,000 node-samples/s. The only Python-level
loops here are the unavoidable ones that pull values out of decoded messages, and they are kept to
C-level iteration where possible (`operator.attrgetter`/`itemgetter` + `np.fromiter`).

Two constructors: `from_scan`, the worker's hot path (fleetwatch/telemetry_scan.py's columns, no
object per value), and `from_structs`, for what the message decoders return
(fleetwatch/fast_schema.py), which reads them with the same code (`_read`) as `from_messages`
reads the dicts of tests, eval and the simulator (the edge where dicts stop); all end in
`_assemble`. pipeline/telemetry_decode.py is the one way from bytes to a batch.

Layout (M messages, G = largest GPU index + 1, F = len(GPU_NUMERIC)):
- `node_names` (U,) the distinct node names of the batch; `node_idx` (M,) index into it. The node
  stage maps `node_names` to the rows of its node index once per batch (detectors/node_index.py).
- `ts`, `seq` (M,); `instance` (M,) the agent instance that numbered `seq` (instance_code of
  `agent.instance`; 0: not given, e.g. an older agent or the simulator); `received` (M,) when
  each message reached the broker (its clock reference,
  fleetwatch.record_block.RecordBlock.reference_times), NaN where not known (not from Kafka)
- `gpu` (M, G, F) float64, NaN where a field or the whole GPU is absent ("missing fields are
  absent, never invented"); `present` (M, G) the message has an entry for that index;
  `lost` (M, G) the entry says `lost: true` or carries no metric at all (a GPU that fell off the
  bus is still listed by index, maybe with uuid, but the driver cannot read anything from it).
- XID events flattened: `xid_msg`, `xid_gpu`, `xid_code` (X,).
- `host` (M, H) float64 in HOST_NUMERIC order.
- IB ports flattened: `ib_msg` (P,), `ib_key_idx` (P,) index into `ib_key_names`, the batch's
  distinct "device/port" names (a node has a handful of ports, so detectors map names once per
  batch, not once per port; `ib_key` spells them out per port); `ib` (P, K) in IB_NUMERIC order,
  `ib_active` (P,) 1.0 if the port state is ACTIVE, 0.0 if another state, NaN if not reported;
  `ib_state_idx` (P,) index into `ib_state_names`, the distinct states as reported (None: not
  reported), for evidence; `ib_state` spells them out per port.
- Ethernet ports flattened the same way: `eth_msg` (Q,), `eth_iface_idx` (Q,) index into
  `eth_iface_names`, the batch's distinct interface names ("" where absent; `eth_iface` per port);
  `eth` (Q, E) in ETH_NUMERIC order; `eth_up` (Q,) 1.0 if the operstate is "up", 0.0 if it is
  another state the kernel defines (down, lowerlayerdown, dormant, notpresent, testing: no
  traffic), NaN if not reported or "unknown" (the driver does not say: many virtual interfaces
  stay "unknown" while they work); `eth_state_idx` (Q,) index into `eth_state_names`, the
  distinct operstates as reported (None: not reported); `eth_state` per port.
- Sections sent only when there is something to say (SPARSE_SECTIONS): the kernel log's events
  (telemetry/1 `kernel`) and the failing node checks' names (`checks`). For each, `<name>_msg`
  (S,) the rows of the messages that carry one and `<name>` (S,) the sections as plain dicts,
  with the fields the contract names (an empty list left out). They are rare and short, so they
  stay objects: detectors read them one by one (detectors/kernel_events.py judges each kernel
  event).

NVML's "not available" values (fleetwatch.schemas.NVML_NOT_AVAILABLE) become NaN: absent.
Counters become float64: exact up to 2**53, far above any ECC/XID/link-error count; byte counters
lose sub-byte precision only beyond ~9 PB, which rates do not care about.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import chain
from operator import attrgetter, itemgetter, methodcaller
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from fleetwatch.schemas import (
    CHECK_LISTS,
    ETH_FIELDS,
    GPU_FIELDS,
    HOST_FIELDS,
    IB_FIELDS,
    KERNEL_COUNTS,
    KERNEL_EVENT_FIELDS,
    NVML_NOT_AVAILABLE,
)

if TYPE_CHECKING:
    from fleetwatch.telemetry_scan import Scan

NAN = math.nan
UNSET = msgspec.UNSET

# Numeric GPU columns: every GPU_FIELDS entry except the identity string and the event list.
GPU_NUMERIC: tuple[str, ...] = tuple(f for f in GPU_FIELDS if f not in ("uuid", "xids"))
GPU_COL: dict[str, int] = {f: i for i, f in enumerate(GPU_NUMERIC)}
HOST_NUMERIC: tuple[str, ...] = tuple(HOST_FIELDS)
HOST_COL: dict[str, int] = {f: i for i, f in enumerate(HOST_NUMERIC)}
IB_NUMERIC: tuple[str, ...] = tuple(f for f in IB_FIELDS if f not in ("device", "port", "state"))
IB_COL: dict[str, int] = {f: i for i, f in enumerate(IB_NUMERIC)}
ETH_NUMERIC: tuple[str, ...] = tuple(f for f in ETH_FIELDS if f not in ("iface", "state"))
ETH_COL: dict[str, int] = {f: i for i, f in enumerate(ETH_NUMERIC)}

_GPU_KEYS = ("index", *GPU_NUMERIC)
# Each GPU column's NVML "not available" value as float64 (NaN: none); 2**64 - 1 rounds to 2**64,
# as the value itself does when it becomes float64.
_GPU_NOT_AVAILABLE = np.array([float(NVML_NOT_AVAILABLE.get(f, NAN)) for f in GPU_NUMERIC])


@lru_cache(maxsize=65536)
def instance_code(instance: str | None) -> int:
    """An agent instance id as the int64 the node index compares (FNV-1a 64 of its UTF-8 bytes,
    as signed int64; 0 means "not given", so a hash of 0 becomes 1). The telemetry scanner computes
    the same code in compiled code (fleetwatch/telemetry_scan.py, _fnv1a)."""
    if not instance:
        return 0
    h = 0xCBF29CE484222325
    for b in instance.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    h = h - (1 << 64) if h >= 1 << 63 else h
    return h or 1


def _instance_of_struct(msg: Any) -> int:
    agent = msg.agent
    return 0 if not agent or agent.instance is UNSET else instance_code(agent.instance)


def _instance_of_dict(msg: dict[str, Any]) -> int:
    agent = msg.get("agent")
    return instance_code(agent.get("instance")) if type(agent) is dict else 0


def _attr_table(rows: list[Any], keys: tuple[str, ...]) -> np.ndarray:
    """Rows of `keys` from structs as float64 (absent numbers decode to NaN; an absent struct, UNSET
    or None, is a row of NaN)."""
    n, k = len(rows), len(keys)
    get = _ATTRS[keys]
    it = map(get, rows) if all(rows) else (get(r) if r else (NAN,) * k for r in rows)
    return np.fromiter(chain.from_iterable(it), np.float64, count=n * k).reshape(n, k)


# The keys of each table that many dicts lack (a field a collector cannot read on every node,
# e.g. NVML's recovery action on older drivers), learnt from a batch: read with `.get`, a column
# at a time, while the other keys are still read by one C-level itemgetter a dict.
_SPARSE_KEYS: dict[tuple[str, ...], frozenset[str]] = {}


def _learn_sparse(entries: list[Any], keys: tuple[str, ...]) -> frozenset[str]:
    """The keys more than a tenth of the dicts lack: a column of their own is cheaper than a slow
    row for each dict. (A lost GPU lacks every key: it stays one slow row.)"""
    n = len(entries)
    return frozenset(f for f in keys if sum(1 for e in entries if f not in e) * 10 > n)


def _dense_rows(
    entries: list[Any], keys: tuple[str, ...], sparse: frozenset[str]
) -> tuple[list[int], list[int]]:
    """(the columns of the keys not in `sparse`, the dicts that have all of them)."""
    dense = [j for j, f in enumerate(keys) if f not in sparse]
    getter = itemgetter(*(keys[j] for j in dense)) if dense else None
    if getter is None:
        return dense, list(range(len(entries)))
    try:
        for _ in map(getter, entries):  # C-level: the common case, every dict has them
            pass
        return dense, list(range(len(entries)))
    except KeyError:
        wanted = [keys[j] for j in dense]
        return dense, [i for i, e in enumerate(entries) if all(f in e for f in wanted)]


def _item_table(entries: list[Any], keys: tuple[str, ...]) -> np.ndarray:
    """Rows of `keys` from dicts as float64 with NaN for absent keys (an absent dict: a row of NaN).

    The fast path reads every dict with one C-level itemgetter call. Where some dict lacks a key,
    the keys many dicts lack (_SPARSE_KEYS) are read column by column with `.get`, the others by
    one itemgetter for each dict that has them all, and the few dicts that lack one of those (a
    lost GPU, a collector that cannot read ECC) key by key.
    """
    n, k = len(entries), len(keys)
    if n == 0:
        return np.empty((0, k), dtype=np.float64)
    getter = _ITEMS[keys]
    try:
        flat = np.fromiter(chain.from_iterable(map(getter, entries)), dtype=np.float64, count=n * k)
        return flat.reshape(n, k)
    except KeyError:
        pass
    sparse = _SPARSE_KEYS.get(keys)
    if sparse is None:
        sparse = _SPARSE_KEYS[keys] = _learn_sparse(entries, keys)
    dense, full = _dense_rows(entries, keys, sparse)
    if len(full) * 4 < n * 3:  # the learnt keys no longer fit these dicts: learn again
        sparse = _SPARSE_KEYS[keys] = _learn_sparse(entries, keys)
        dense, full = _dense_rows(entries, keys, sparse)
    out = np.full((n, k), NAN, dtype=np.float64)
    if full and dense:
        rows = map(itemgetter(*(keys[j] for j in dense)), (entries[i] for i in full))
        if len(dense) == 1:
            out[full, dense[0]] = np.fromiter(rows, dtype=np.float64, count=len(full))
        else:
            flat = np.fromiter(chain.from_iterable(rows), dtype=np.float64, count=len(full) * len(dense))
            out[np.ix_(full, dense)] = flat.reshape(len(full), len(dense))
    if len(full) < n and dense:
        fullset = set(full)
        part = [i for i in range(n) if i not in fullset]
        out[np.ix_(part, dense)] = np.array(
            [[entries[i].get(keys[j], NAN) for j in dense] for i in part], dtype=np.float64
        )
    for j, f in enumerate(keys):
        if f in sparse:
            out[:, j] = np.fromiter((e.get(f, NAN) for e in entries), dtype=np.float64, count=n)
    return out


_ATTRS = {keys: attrgetter(*keys) for keys in (_GPU_KEYS, HOST_NUMERIC, IB_NUMERIC, ETH_NUMERIC)}
_ITEMS = {keys: itemgetter(*keys) for keys in (_GPU_KEYS, HOST_NUMERIC, IB_NUMERIC, ETH_NUMERIC)}


def _dict_ports(msg: dict[str, Any]) -> Any:
    net = msg.get("net")
    return (net.get("ib") or ()) if net else ()


def _struct_ports(msg: Any) -> Any:
    net = msg.net
    return (net.ib or ()) if net else ()


def _dict_eth(msg: dict[str, Any]) -> Any:
    net = msg.get("net")
    return (net.get("eth") or ()) if net else ()


def _struct_eth(msg: Any) -> Any:
    net = msg.net
    return (net.eth or ()) if net else ()


SPARSE_SECTIONS = ("kernel", "checks")
# each sparse section's lists of entries, and the fields the contract names for their entries
_SPARSE_LISTS: dict[str, dict[str, frozenset[str]]] = {
    "kernel": {"events": frozenset({"kind", *KERNEL_EVENT_FIELDS})},
    "checks": {key: frozenset(spec) for key, spec, _required in CHECK_LISTS},
}
_SPARSE_SCALARS = {"kernel": frozenset({"boot", *KERNEL_COUNTS}), "checks": frozenset()}


def _sparse_of_struct(name: str, section: Any) -> dict[str, Any]:
    """A decoded sparse section as the dict its message held: the decoder gives an absent numeric
    field of an entry NaN (fleetwatch/fast_schema.py), which is left out here, as in the message."""
    out: dict[str, Any] = msgspec.to_builtins(section)
    for key in _SPARSE_LISTS[name]:
        if out.get(key):
            out[key] = [{k: v for k, v in e.items() if v == v} for e in out[key]]
        else:
            out.pop(key, None)  # an empty list is no list (a struct's default is [])
    return out


def _sparse_of_dict(name: str, section: dict[str, Any]) -> dict[str, Any]:
    """A sparse section of a validated dict with only the fields the contract names, as the
    decoder reads it (an entry's fields a consumer does not know are valid, and ignored)."""
    out = {k: v for k, v in section.items() if k in _SPARSE_SCALARS[name]}
    for key, fields in _SPARSE_LISTS[name].items():
        if section.get(key):
            out[key] = [{k: v for k, v in e.items() if k in fields} for e in section[key]]
    return out


@dataclass(frozen=True, slots=True)
class _Access:
    """How TelemetryBatch._read reads one form of decoded message: by attribute or by key."""

    node: Callable[[Any], str]
    ts: Callable[[Any], float]
    seq: Callable[[Any], int]
    gpus: Callable[[Any], list[Any]]
    host: Callable[[Any], Any]  # the host part (absent: UNSET or None in a struct, {} for a dict)
    ports: Callable[[Any], Any]  # the IB ports (absent: ())
    eth: Callable[[Any], Any]  # the Ethernet ports (absent: ())
    instance: Callable[[Any], int]  # instance_code of agent.instance
    index: Callable[[Any], int]  # a GPU entry's index
    lost: Callable[[Any], Any]  # a GPU entry's lost flag
    xids: Callable[[Any], Any]  # a GPU entry's XIDs (absent: false)
    port_key: Callable[[Any], tuple[Any, Any]]  # a port's (device, port), "" where absent
    state: Callable[[Any], Any]  # a port's state (absent: None or UNSET)
    iface: Callable[[Any], Any]  # an Ethernet port's iface (absent: UNSET in a struct, "" for a dict)
    table: Callable[[list[Any], tuple[str, ...]], np.ndarray]  # rows of numeric fields
    sparse: Callable[[str, Any], Any]  # a sparse section as a plain dict (absent: false)


_STRUCTS = _Access(
    *map(attrgetter, ("node", "ts", "seq", "gpus", "host")),
    ports=_struct_ports,
    eth=_struct_eth,
    instance=_instance_of_struct,
    index=attrgetter("index"),
    lost=attrgetter("lost"),
    xids=attrgetter("xids"),
    port_key=attrgetter("device", "port"),  # absent parts decode to ""
    state=attrgetter("state"),
    iface=attrgetter("iface"),
    table=_attr_table,
    sparse=lambda name, x: _sparse_of_struct(name, s) if (s := getattr(x, name)) else None,
)
_DICTS = _Access(
    *map(itemgetter, ("node", "ts", "seq", "gpus")),
    host=lambda x: x.get("host") or {},
    ports=_dict_ports,
    eth=_dict_eth,
    instance=_instance_of_dict,
    index=itemgetter("index"),
    lost=methodcaller("get", "lost"),
    xids=methodcaller("get", "xids"),
    port_key=lambda p: (p.get("device", ""), p.get("port", "")),
    state=methodcaller("get", "state"),
    iface=methodcaller("get", "iface", ""),
    table=_item_table,
    sparse=lambda name, x: _sparse_of_dict(name, s) if (s := x.get(name)) else None,
)


def _eth_up(state: str | None) -> float:
    """An operstate (Documentation/networking/operstates.rst, RFC 2863's ifOperStatus) as eth_up:
    1.0 "up", NaN not reported or "unknown" (the driver keeps no operstate), 0.0 any other state
    (down, lowerlayerdown, dormant, notpresent, testing: the interface passes no traffic)."""
    if state is None:
        return NAN
    word = state.strip().lower()
    return NAN if word == "unknown" else float(word == "up")


def _codes_of(values: list[Any]) -> dict[Any, int]:
    """Each distinct value -> its code, in order of first appearance (C-level: dict.fromkeys)."""
    codes = dict.fromkeys(values, 0)
    for i, v in enumerate(codes):
        codes[v] = i
    return codes


def _entries_of(new_row: np.ndarray, entry_msg: np.ndarray) -> np.ndarray:
    """The entries (XIDs, ports) of the taken messages, ordered by their messages' new places
    (within a message, as they were)."""
    place = new_row[entry_msg]
    kept = np.flatnonzero(place >= 0)
    if len(kept) > 1 and (np.diff(place[kept]) < 0).any():  # taken out of order (a merge)
        kept = kept[np.argsort(place[kept], kind="stable")]
    return kept


@dataclass(slots=True)
class TelemetryBatch:
    node_names: list[str]
    node_idx: np.ndarray
    ts: np.ndarray
    seq: np.ndarray
    gpu: np.ndarray
    present: np.ndarray
    lost: np.ndarray
    xid_msg: np.ndarray
    xid_gpu: np.ndarray
    xid_code: np.ndarray
    host: np.ndarray
    ib_msg: np.ndarray
    ib_key_names: list[str]
    ib_key_idx: np.ndarray
    ib: np.ndarray
    ib_active: np.ndarray
    ib_state_names: list[str | None]
    ib_state_idx: np.ndarray
    received: np.ndarray
    instance: np.ndarray
    eth_msg: np.ndarray = dataclasses.field(default_factory=lambda: np.empty(0, dtype=np.int64))
    eth_iface_names: list[str] = dataclasses.field(default_factory=list)
    eth_iface_idx: np.ndarray = dataclasses.field(default_factory=lambda: np.empty(0, dtype=np.int64))
    eth: np.ndarray = dataclasses.field(default_factory=lambda: np.empty((0, len(ETH_NUMERIC))))
    eth_up: np.ndarray = dataclasses.field(default_factory=lambda: np.empty(0))
    eth_state_names: list[str | None] = dataclasses.field(default_factory=list)
    eth_state_idx: np.ndarray = dataclasses.field(default_factory=lambda: np.empty(0, dtype=np.int64))
    kernel_msg: np.ndarray = dataclasses.field(default_factory=lambda: np.empty(0, dtype=np.int64))
    kernel: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    checks_msg: np.ndarray = dataclasses.field(default_factory=lambda: np.empty(0, dtype=np.int64))
    checks: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.ts)

    @property
    def ib_key(self) -> list[str]:
        """The "device/port" name of every port (P,)."""
        names = self.ib_key_names
        return [names[i] for i in self.ib_key_idx.tolist()]

    @property
    def ib_state(self) -> list[str | None]:
        """The state of every port as reported (None: not reported) (P,)."""
        names = self.ib_state_names
        return [names[i] for i in self.ib_state_idx.tolist()]

    @property
    def eth_iface(self) -> list[str]:
        """The interface name of every Ethernet port (Q,)."""
        names = self.eth_iface_names
        return [names[i] for i in self.eth_iface_idx.tolist()]

    @property
    def eth_state(self) -> list[str | None]:
        """The operstate of every Ethernet port as reported (None: not reported) (Q,)."""
        names = self.eth_state_names
        return [names[i] for i in self.eth_state_idx.tolist()]

    def __len__(self) -> int:
        return len(self.ts)

    def select(self, keep: np.ndarray) -> TelemetryBatch:
        """The messages where `keep` (M,) is True, in order; names no kept message uses are dropped."""
        return self.take(np.flatnonzero(keep))

    def take(self, rows: np.ndarray) -> TelemetryBatch:
        """The messages at `rows` (distinct), in that order; names no taken message uses are dropped."""
        new_row = np.full(len(self.ts), -1, dtype=np.int64)
        new_row[rows] = np.arange(len(rows))
        codes = self.node_idx[rows]
        uniq, first = np.unique(codes, return_index=True)
        used = uniq[np.argsort(first)]  # names in order of first appearance, as the constructors do
        remap = np.empty(len(self.node_names), dtype=np.int64)
        remap[used] = np.arange(len(used))
        xk = _entries_of(new_row, self.xid_msg)
        pk = _entries_of(new_row, self.ib_msg)
        ek = _entries_of(new_row, self.eth_msg)
        sparse: dict[str, Any] = {}
        for name in SPARSE_SECTIONS:
            rows_of = getattr(self, f"{name}_msg")
            kept = _entries_of(new_row, rows_of)
            sections = getattr(self, name)
            sparse[f"{name}_msg"] = new_row[rows_of[kept]]
            sparse[name] = [sections[i] for i in kept.tolist()]
        return TelemetryBatch(
            node_names=[self.node_names[i] for i in used.tolist()],
            node_idx=remap[codes],
            ts=self.ts[rows],
            seq=self.seq[rows],
            received=self.received[rows],
            instance=self.instance[rows],
            gpu=self.gpu[rows],
            present=self.present[rows],
            lost=self.lost[rows],
            xid_msg=new_row[self.xid_msg[xk]],
            xid_gpu=self.xid_gpu[xk],
            xid_code=self.xid_code[xk],
            host=self.host[rows],
            ib_msg=new_row[self.ib_msg[pk]],
            ib_key_names=self.ib_key_names,
            ib_key_idx=self.ib_key_idx[pk],
            ib=self.ib[pk],
            ib_active=self.ib_active[pk],
            ib_state_names=self.ib_state_names,
            ib_state_idx=self.ib_state_idx[pk],
            eth_msg=new_row[self.eth_msg[ek]],
            eth_iface_names=self.eth_iface_names,
            eth_iface_idx=self.eth_iface_idx[ek],
            eth=self.eth[ek],
            eth_up=self.eth_up[ek],
            eth_state_names=self.eth_state_names,
            eth_state_idx=self.eth_state_idx[ek],
            **sparse,
        )

    @classmethod
    def concat(cls, parts: Sequence[TelemetryBatch]) -> TelemetryBatch:
        """The parts' messages one after the other (GPU columns as wide as the widest part's)."""
        if len(parts) == 1:
            return parts[0]
        m = np.cumsum([0, *(len(p) for p in parts)])
        g = max(p.gpu.shape[1] for p in parts)

        def cat(col: str, offsets: Sequence[int] | None = None) -> np.ndarray:
            arrays = [getattr(p, col) for p in parts]
            if offsets is not None:
                arrays = [a + o for a, o in zip(arrays, offsets, strict=True)]
            return np.concatenate(arrays)

        def wide(col: str, fill: Any) -> np.ndarray:
            out = np.full(
                (int(m[-1]), g, *getattr(parts[0], col).shape[2:]), fill, getattr(parts[0], col).dtype
            )
            for p, lo in zip(parts, m[:-1].tolist(), strict=True):
                a = getattr(p, col)
                out[lo : lo + len(a), : a.shape[1]] = a
            return out

        def names(col: str) -> tuple[list[Any], list[int]]:
            lists = [getattr(p, col) for p in parts]
            return [n for ns in lists for n in ns], np.cumsum([0, *map(len, lists)])[:-1].tolist()

        node_names, node_off = names("node_names")
        key_names, key_off = names("ib_key_names")
        state_names, state_off = names("ib_state_names")
        iface_names, iface_off = names("eth_iface_names")
        estate_names, estate_off = names("eth_state_names")
        first = _codes_of(node_names)  # a node in several parts: one name, its first code
        node_code = np.fromiter(map(first.__getitem__, node_names), np.int64, count=len(node_names))
        return cls(
            node_names=list(first),
            node_idx=node_code[cat("node_idx", node_off)],
            ts=cat("ts"),
            seq=cat("seq"),
            received=cat("received"),
            instance=cat("instance"),
            gpu=wide("gpu", NAN),
            present=wide("present", False),
            lost=wide("lost", False),
            xid_msg=cat("xid_msg", m[:-1].tolist()),
            xid_gpu=cat("xid_gpu"),
            xid_code=cat("xid_code"),
            host=cat("host"),
            ib_msg=cat("ib_msg", m[:-1].tolist()),
            ib_key_names=key_names,
            ib_key_idx=cat("ib_key_idx", key_off),
            ib=cat("ib"),
            ib_active=cat("ib_active"),
            ib_state_names=state_names,
            ib_state_idx=cat("ib_state_idx", state_off),
            eth_msg=cat("eth_msg", m[:-1].tolist()),
            eth_iface_names=iface_names,
            eth_iface_idx=cat("eth_iface_idx", iface_off),
            eth=cat("eth"),
            eth_up=cat("eth_up"),
            eth_state_names=estate_names,
            eth_state_idx=cat("eth_state_idx", estate_off),
            **{f"{name}_msg": cat(f"{name}_msg", m[:-1].tolist()) for name in SPARSE_SECTIONS},
            **{name: [k for p in parts for k in getattr(p, name)] for name in SPARSE_SECTIONS},
        )

    def nodes(self) -> list[str]:
        """Node name of every message (M,)."""
        names = self.node_names
        return [names[i] for i in self.node_idx.tolist()]

    @classmethod
    def from_structs(cls, msgs: Sequence[Any]) -> TelemetryBatch:
        """From fleetwatch.fast_schema telemetry structs: what the message decoders return."""
        return cls._read(msgs, _STRUCTS)

    @classmethod
    def from_messages(cls, msgs: Sequence[Any]) -> TelemetryBatch:
        """From validated telemetry/1 dicts (tests, eval, the simulator: dicts stop at this edge),
        or a mix of dicts and structs (a message only the Python validator accepted comes as a
        dict among the decoders' structs): each form read its own way, then put back in order."""
        is_dict = np.fromiter((type(x) is dict for x in msgs), dtype=bool, count=len(msgs))
        if is_dict.all():
            return cls._read(msgs, _DICTS)
        if not is_dict.any():
            return cls._read(msgs, _STRUCTS)
        d, s = np.flatnonzero(is_dict), np.flatnonzero(~is_dict)
        parts = [
            cls._read([msgs[i] for i in d.tolist()], _DICTS),
            cls._read([msgs[i] for i in s.tolist()], _STRUCTS),
        ]
        return cls.concat(parts).take(np.argsort(np.concatenate([d, s]), kind="stable"))

    @classmethod
    def _read(cls, msgs: Sequence[Any], a: _Access) -> TelemetryBatch:
        """The one reader of decoded messages, by attribute (structs) or by key (dicts): `a`.

        Every pass over messages, GPUs or ports is a C-level map() of an attrgetter or itemgetter,
        not a Python loop: this runs on every sample the worker decodes without the scanner, and
        the Python-level loops used to cost as much as the detectors."""
        m = len(msgs)
        nodes = list(map(a.node, msgs))
        name_ix = _codes_of(nodes)
        node_idx = np.fromiter(map(name_ix.__getitem__, nodes), np.int64, count=m)
        ts = np.fromiter(map(a.ts, msgs), dtype=np.float64, count=m)
        seq = np.fromiter(map(a.seq, msgs), dtype=np.int64, count=m)
        gpu_lists = list(map(a.gpus, msgs))
        counts = np.fromiter(map(len, gpu_lists), dtype=np.int64, count=m)
        entries = list(chain.from_iterable(gpu_lists))
        lost_flags = list(map(a.lost, entries))
        # `in` compares with ==, so 1 or 1.0 also lead to the exact `is True` test
        flagged = [i for i, f in enumerate(lost_flags) if f is True] if True in lost_flags else []
        xid_lists = list(map(a.xids, entries))  # absent (UNSET, None) and [] are all false
        xids = (
            [(e, a.index(entries[e]), c) for e, xl in enumerate(xid_lists) if xl for c in xl]
            if any(xid_lists)
            else []
        )
        port_lists = list(map(a.ports, msgs))
        plist = list(chain.from_iterable(port_lists))
        port_msg = np.repeat(np.arange(m, dtype=np.int64), np.fromiter(map(len, port_lists), np.int64, m))
        port_keys = list(map(a.port_key, plist))  # absent parts are ""
        key_ix = _codes_of(port_keys)
        states = list(map(a.state, plist))
        state_ix = _codes_of(states)
        eth_lists = list(map(a.eth, msgs))
        elist = list(chain.from_iterable(eth_lists))
        eth_msg = np.repeat(np.arange(m, dtype=np.int64), np.fromiter(map(len, eth_lists), np.int64, m))
        ifaces = list(map(a.iface, elist))  # absent: "" (a dict) or UNSET (a struct)
        iface_ix = _codes_of(ifaces)
        estates = list(map(a.state, elist))
        estate_ix = _codes_of(estates)
        batch = cls._assemble(
            list(name_ix),
            node_idx,
            ts,
            seq,
            counts,
            a.table(entries, _GPU_KEYS),
            flagged,
            xids,
            a.table(list(map(a.host, msgs)), HOST_NUMERIC),
            port_msg,
            [f"{d}/{p}" for d, p in key_ix],
            np.fromiter(map(key_ix.__getitem__, port_keys), np.int64, count=len(plist)),
            a.table(plist, IB_NUMERIC),
            [None if st is UNSET else st for st in state_ix],
            np.fromiter(map(state_ix.__getitem__, states), np.int64, count=len(plist)),
            np.fromiter(map(a.instance, msgs), np.int64, count=m),
            eth_msg,
            ["" if i is UNSET else i for i in iface_ix],
            np.fromiter(map(iface_ix.__getitem__, ifaces), np.int64, count=len(elist)),
            a.table(elist, ETH_NUMERIC),
            [None if st is UNSET else st for st in estate_ix],
            np.fromiter(map(estate_ix.__getitem__, estates), np.int64, count=len(elist)),
        )
        for name in SPARSE_SECTIONS:
            sections = [a.sparse(name, x) for x in msgs]
            rows = [i for i, x in enumerate(sections) if x] if any(sections) else []
            if rows:
                setattr(batch, f"{name}_msg", np.array(rows, dtype=np.int64))
                setattr(batch, name, [sections[i] for i in rows])
        return batch

    @classmethod
    def from_scan(cls, sc: Scan) -> TelemetryBatch:
        """From fleetwatch.telemetry_scan's columns (the worker's hot path: no object per value)."""
        m = len(sc.ts)
        entries = sc.entries
        xids = (
            np.column_stack([sc.xid_entry, entries[sc.xid_entry, 0].astype(np.int64), sc.xid_code])
            if len(sc.xid_code)
            else []
        )
        return cls._assemble(
            sc.node_names,
            sc.node_idx,
            sc.ts,
            sc.seq,
            np.bincount(sc.entry_msg, minlength=m),
            entries,
            np.flatnonzero(sc.entry_lost),
            xids,
            sc.host,
            sc.ib_msg,
            sc.ib_key_names,
            sc.ib_key_idx,
            sc.ib,
            sc.ib_state_names,
            sc.ib_state_idx,
            sc.instance,
            sc.eth_msg,
            sc.eth_iface_names,
            sc.eth_iface_idx,
            sc.eth,
            sc.eth_state_names,
            sc.eth_state_idx,
        )

    @classmethod
    def _assemble(
        cls,
        node_names: list[str],
        node_idx: np.ndarray,
        ts: np.ndarray,
        seq: np.ndarray,
        counts: np.ndarray,
        table: np.ndarray,
        flagged: list[int] | np.ndarray,
        xids: list[tuple[int, int, int]] | np.ndarray,
        host: np.ndarray,
        port_msg: np.ndarray,
        ib_key_names: list[str],
        ib_key_idx: np.ndarray,
        ib: np.ndarray,
        state_names: list[str | None],
        state_idx: np.ndarray,
        instance: np.ndarray,
        eth_msg: np.ndarray,
        eth_iface_names: list[str],
        eth_iface_idx: np.ndarray,
        eth: np.ndarray,
        eth_state_names: list[str | None],
        eth_state_idx: np.ndarray,
    ) -> TelemetryBatch:
        """The parts both constructors share: `table` holds one row per GPU entry (index first,
        then GPU_NUMERIC), `counts` the entries per message, `flagged` the entries that say lost."""
        m = len(ts)
        e_msg = np.repeat(np.arange(m, dtype=np.int64), counts)
        e_gpu = table[:, 0].astype(np.int64)
        g_max = int(e_gpu.max()) + 1 if len(e_gpu) else 0
        values = table[:, 1:]
        values[values == _GPU_NOT_AVAILABLE] = NAN  # NVML's "not available" is absent, not a count
        gpu = np.full((m, g_max, len(GPU_NUMERIC)), NAN, dtype=np.float64)
        gpu[e_msg, e_gpu] = values
        present = np.zeros((m, g_max), dtype=bool)
        present[e_msg, e_gpu] = True
        lost = np.zeros((m, g_max), dtype=bool)
        # An entry with no metric at all is a GPU the driver cannot read; an explicit flag also counts.
        no_metrics = np.isnan(values).all(axis=1)
        lost[e_msg[no_metrics], e_gpu[no_metrics]] = True
        if len(flagged):
            lost[e_msg[flagged], e_gpu[flagged]] = True
        if len(xids):
            xa = np.array(xids, dtype=np.int64)
            xid_msg, xid_gpu, xid_code = e_msg[xa[:, 0]], xa[:, 1], xa[:, 2]
        else:
            xid_msg = xid_gpu = xid_code = np.empty(0, dtype=np.int64)
        # sysfs says "4: ACTIVE", ibstat says "Active": accept both spellings. A fleet reports a few
        # distinct states, so each is judged once per batch.
        judged = np.array([NAN if s is None else float("ACTIVE" in s.upper()) for s in state_names])
        ib_active = judged[state_idx] if len(state_idx) else np.empty(0, dtype=np.float64)
        up = np.array([_eth_up(s) for s in eth_state_names])
        eth_up = up[eth_state_idx] if len(eth_state_idx) else np.empty(0, dtype=np.float64)
        return cls(
            node_names=node_names,
            node_idx=node_idx,
            ts=ts,
            seq=seq,
            gpu=gpu,
            present=present,
            lost=lost,
            xid_msg=xid_msg,
            xid_gpu=xid_gpu,
            xid_code=xid_code,
            host=host,
            ib_msg=port_msg,
            ib_key_names=ib_key_names,
            ib_key_idx=ib_key_idx,
            ib=ib,
            ib_active=ib_active,
            ib_state_names=state_names,
            ib_state_idx=state_idx,
            received=np.full(m, NAN),
            instance=instance,
            eth_msg=eth_msg,
            eth_iface_names=eth_iface_names,
            eth_iface_idx=eth_iface_idx,
            eth=eth,
            eth_up=eth_up,
            eth_state_names=eth_state_names,
            eth_state_idx=eth_state_idx,
        )
