"""Columnar view of a batch of `telemetry/1` messages.

Detectors work on numpy arrays over a whole batch (hundreds to thousands of messages) rather than
on dicts, so that one detector core keeps up with >= 20,000 node-samples/s. The only Python-level
loops here are the unavoidable ones that pull values out of the message dicts, and they are kept to
C-level iteration where possible (`operator.itemgetter` + `np.fromiter`).

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

NVML's "not available" values (fleetwatch.schemas.NVML_NOT_AVAILABLE) become NaN: absent.
Counters become float64: exact up to 2**53, far above any ECC/XID/link-error count; byte counters
lose sub-byte precision only beyond ~9 PB, which rates do not care about.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import chain
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from fleetwatch.schemas import GPU_FIELDS, HOST_FIELDS, IB_FIELDS, NVML_NOT_AVAILABLE

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

_GPU_KEYS = ("index", *GPU_NUMERIC)
_GPU_GET = itemgetter(*_GPU_KEYS)
_HOST_GET = itemgetter(*HOST_NUMERIC)
_IB_GET = itemgetter(*IB_NUMERIC)
# The same columns read from fleetwatch.fast_schema's decoded structs, where absent numbers are NaN.
_GPU_ATTR = attrgetter(*_GPU_KEYS)
_HOST_ATTR = attrgetter(*HOST_NUMERIC)
_IB_ATTR = attrgetter(*IB_NUMERIC)
_HOST_ABSENT = (NAN,) * len(HOST_NUMERIC)
_NODE, _TS, _SEQ, _GPUS, _HOST, _NET, _AGENT = (
    attrgetter(a) for a in ("node", "ts", "seq", "gpus", "host", "net", "agent")
)
_LOST, _XIDS = attrgetter("lost"), attrgetter("xids")
_IB_KEY, _IB_STATE = attrgetter("device", "port"), attrgetter("state")
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


def _instance_of_struct(agent: Any) -> int:
    return 0 if agent is UNSET or agent.instance is UNSET else instance_code(agent.instance)


def _instance_of_dict(msg: dict[str, Any]) -> int:
    agent = msg.get("agent")
    return instance_code(agent.get("instance")) if type(agent) is dict else 0


def _codes_of(values: list[Any]) -> dict[Any, int]:
    """Each distinct value -> its code, in order of first appearance (C-level: dict.fromkeys)."""
    codes = dict.fromkeys(values, 0)
    for i, v in enumerate(codes):
        codes[v] = i
    return codes


def _table(entries: list[dict[str, Any]], getter: itemgetter, keys: tuple[str, ...]) -> np.ndarray:
    """Rows of `keys` from dicts as float64 with NaN for absent keys.

    The fast path reads every dict with one C-level itemgetter call; only if some dict lacks a key
    (a lost GPU, a collector that cannot read ECC) do those dicts go through per-key `.get`.
    """
    n, k = len(entries), len(keys)
    if n == 0:
        return np.empty((0, k), dtype=np.float64)
    try:
        flat = np.fromiter(chain.from_iterable(map(getter, entries)), dtype=np.float64, count=n * k)
        return flat.reshape(n, k)
    except KeyError:
        pass
    keyset = frozenset(keys)
    out = np.full((n, k), NAN, dtype=np.float64)
    full = [i for i, e in enumerate(entries) if keyset <= e.keys()]
    if full:
        fast = [entries[i] for i in full]
        out[full] = np.fromiter(
            chain.from_iterable(map(getter, fast)), dtype=np.float64, count=len(fast) * k
        ).reshape(len(fast), k)
    if len(full) < n:
        fullset = set(full)
        part = [i for i in range(n) if i not in fullset]
        out[part] = np.array([[entries[i].get(f, NAN) for f in keys] for i in part], dtype=np.float64)
    return out


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

    def __len__(self) -> int:
        return len(self.ts)

    def select(self, keep: np.ndarray) -> TelemetryBatch:
        """The messages where `keep` (M,) is True, in order; names no kept message uses are dropped."""
        rows = np.flatnonzero(keep)
        new_row = np.full(len(self.ts), -1, dtype=np.int64)
        new_row[rows] = np.arange(len(rows))
        codes = self.node_idx[rows]
        uniq, first = np.unique(codes, return_index=True)
        used = uniq[np.argsort(first)]  # names in order of first appearance, as the constructors do
        remap = np.empty(len(self.node_names), dtype=np.int64)
        remap[used] = np.arange(len(used))
        node_idx = remap[codes]
        xk = keep[self.xid_msg]
        pk = keep[self.ib_msg]
        return TelemetryBatch(
            node_names=[self.node_names[i] for i in used.tolist()],
            node_idx=node_idx,
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
        )

    def nodes(self) -> list[str]:
        """Node name of every message (M,)."""
        names = self.node_names
        return [names[i] for i in self.node_idx.tolist()]

    @classmethod
    def from_any(cls, msgs: Sequence[Any]) -> TelemetryBatch:
        """From validated messages as dicts, as fast_schema structs (the worker's hot path), or a mix
        (a message only the Python validator accepted comes as a dict among structs)."""
        if all(type(x) is dict for x in msgs):
            return cls.from_messages(msgs)
        if not any(type(x) is dict for x in msgs):
            return cls.from_structs(msgs)
        return cls.from_messages([x if type(x) is dict else _struct_dict(x) for x in msgs])  # rare

    @classmethod
    def from_structs(cls, msgs: Sequence[Any]) -> TelemetryBatch:
        """Build the columnar batch from fleetwatch.fast_schema telemetry structs.

        Every pass over messages, GPUs or ports is a C-level map() of an attrgetter (or of a dict's
        __getitem__), not a Python loop: this runs on every sample the worker reads, and the
        Python-level loops used to cost as much as the detectors."""
        m = len(msgs)
        nodes = list(map(_NODE, msgs))
        name_ix = _codes_of(nodes)
        node_idx = np.fromiter(map(name_ix.__getitem__, nodes), np.int64, count=m)
        ts = np.fromiter(map(_TS, msgs), dtype=np.float64, count=m)
        seq = np.fromiter(map(_SEQ, msgs), dtype=np.int64, count=m)
        gpu_lists = list(map(_GPUS, msgs))
        counts = np.fromiter(map(len, gpu_lists), dtype=np.int64, count=m)
        entries = list(chain.from_iterable(gpu_lists))
        k = len(_GPU_KEYS)
        table = np.fromiter(chain.from_iterable(map(_GPU_ATTR, entries)), np.float64, count=len(entries) * k)
        lost_flags = list(map(_LOST, entries))
        # `in` compares with ==, so 1 or 1.0 also lead to the exact `is True` test
        flagged = [i for i, f in enumerate(lost_flags) if f is True] if True in lost_flags else []
        xid_lists = list(map(_XIDS, entries))  # UNSET and [] are both false
        xids = (
            [(e, entries[e].index, c) for e, xl in enumerate(xid_lists) if xl for c in xl]
            if any(xid_lists)
            else []
        )
        hosts = list(map(_HOST, msgs))
        host_rows = (
            map(_HOST_ATTR, hosts)
            if UNSET not in hosts
            else (_HOST_ABSENT if h is UNSET else _HOST_ATTR(h) for h in hosts)
        )
        host = np.fromiter(chain.from_iterable(host_rows), np.float64, count=m * len(HOST_NUMERIC)).reshape(
            m, len(HOST_NUMERIC)
        )
        port_lists = [() if n is UNSET else (n.ib or ()) for n in map(_NET, msgs)]
        plist = list(chain.from_iterable(port_lists))
        port_msg = np.repeat(np.arange(m, dtype=np.int64), np.fromiter(map(len, port_lists), np.int64, m))
        ib = np.fromiter(
            chain.from_iterable(map(_IB_ATTR, plist)), np.float64, count=len(plist) * len(IB_NUMERIC)
        ).reshape(len(plist), len(IB_NUMERIC))
        port_keys = list(map(_IB_KEY, plist))  # absent parts decode to ""
        key_ix = _codes_of(port_keys)
        states = list(map(_IB_STATE, plist))
        state_ix = _codes_of(states)
        return cls._assemble(
            list(name_ix),
            node_idx,
            ts,
            seq,
            counts,
            table.reshape(len(entries), k),
            flagged,
            xids,
            host,
            port_msg,
            [f"{d}/{p}" for d, p in key_ix],
            np.fromiter(map(key_ix.__getitem__, port_keys), np.int64, count=len(plist)),
            ib,
            [None if st is UNSET else st for st in state_ix],
            np.fromiter(map(state_ix.__getitem__, states), np.int64, count=len(plist)),
            np.fromiter(map(_instance_of_struct, map(_AGENT, msgs)), np.int64, count=m),
        )

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
        )

    @classmethod
    def from_messages(cls, msgs: Sequence[dict[str, Any]]) -> TelemetryBatch:
        """Build the columnar batch from validated telemetry/1 dicts (see fleetwatch.schemas)."""
        m = len(msgs)
        name_ix: dict[str, int] = {}
        node_idx = np.fromiter(
            (name_ix.setdefault(x["node"], len(name_ix)) for x in msgs), dtype=np.int64, count=m
        )
        ts = np.fromiter((x["ts"] for x in msgs), dtype=np.float64, count=m)
        seq = np.fromiter((x["seq"] for x in msgs), dtype=np.int64, count=m)

        # GPUs: one flat list of entries, then scatter into the (M, G, F) cube.
        counts = np.fromiter((len(x["gpus"]) for x in msgs), dtype=np.int64, count=m)
        entries = [g for x in msgs for g in x["gpus"]]
        table = _table(entries, _GPU_GET, _GPU_KEYS)
        flagged = [i for i, g in enumerate(entries) if "lost" in g and g["lost"] is True]
        xids = [(e, g["index"], c) for e, g in enumerate(entries) if (xl := g.get("xids")) for c in xl]
        host = _table([x.get("host") or {} for x in msgs], _HOST_GET, HOST_NUMERIC)
        ports = [(i, p) for i, x in enumerate(msgs) if (net := x.get("net")) for p in net.get("ib", ())]
        plist = [p for _, p in ports]
        ib = _table(plist, _IB_GET, IB_NUMERIC)
        port_keys = [(p.get("device", ""), p.get("port", "")) for p in plist]
        key_ix = _codes_of(port_keys)
        states: list[str | None] = [p.get("state") for p in plist]
        state_ix = _codes_of(states)
        return cls._assemble(
            list(name_ix),
            node_idx,
            ts,
            seq,
            counts,
            table,
            flagged,
            xids,
            host,
            np.array([i for i, _ in ports], dtype=np.int64),
            [f"{d}/{p}" for d, p in key_ix],
            np.fromiter(map(key_ix.__getitem__, port_keys), np.int64, count=len(plist)),
            ib,
            list(state_ix),
            np.fromiter(map(state_ix.__getitem__, states), np.int64, count=len(plist)),
            np.fromiter(map(_instance_of_dict, msgs), np.int64, count=m),
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
        )


def _struct_dict(struct: Any) -> dict[str, Any]:
    """A fast_schema struct as the dict the Python validator would have returned (absent stays absent)."""
    d = msgspec.to_builtins(struct)  # drops UNSET; NaN defaults must go too

    def strip(o: Any) -> Any:
        if isinstance(o, dict):
            return {k: strip(v) for k, v in o.items() if not (isinstance(v, float) and v != v)}
        if isinstance(o, list):
            return [strip(v) for v in o]
        return o

    return strip(d)
