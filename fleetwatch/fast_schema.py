"""A compiled decoder and validator for telemetry/1, the one message on the hot path.

Checking every field of every GPU in Python costs ~35 µs per 8-GPU sample, more than the
detectors. msgspec (C) decodes and checks the same rules in a few µs. Its types are GENERATED
from the field tables of fleetwatch/schemas.py, so there is one definition of the contract;
schemas.decode() uses this as a fast path and falls back to the Python validator, which
names the problem, only for messages this one rejects. tests/unit/test_schemas.py checks that
both accept and reject the same messages.

The worker's node stage takes the decoded structs themselves (schemas.decode(..., struct=True)):
parsing the JSON once, into objects whose numeric fields detectors/batch.py reads with one
attrgetter per GPU, costs about half of parsing it to dicts and pulling the values out of those.
An absent numeric field decodes to NaN (what the columnar batch uses for "absent"), an absent
string or list to UNSET.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

import msgspec

from fleetwatch import schemas as s

_UNSET = msgspec.UNSET
_Ident = Annotated[str, msgspec.Meta(max_length=s.MAX_ID_LEN)]


def _numeric(check: s.Check) -> Any:
    lo, hi, integer = s._RANGES[check]
    if integer:
        # msgspec's bounds stop at int64: a counter beyond it (up to 2**64 - 1) is refused here and
        # taken by the Python validator, so decode() still accepts it (as a dict)
        return Annotated[int, msgspec.Meta(ge=int(lo), le=min(int(hi), s.I64_MAX))]
    return Annotated[float, msgspec.Meta(ge=float(lo), le=float(hi))]


def _field_type(check: s.Check) -> Any:
    if check in s._RANGES:
        return _numeric(check)
    if check is s._ident:
        return _Ident
    if check is s._port:
        return _Ident | Annotated[int, msgspec.Meta(ge=0, le=s.MAX_PORT_NUMBER)]
    if check in (s._kernel_text, s._short_text):
        return Annotated[str, msgspec.Meta(max_length=s.MAX_KERNEL_TEXT if check is s._kernel_text else 64)]
    if check is s._pci:
        return Annotated[str, msgspec.Meta(pattern=s.PCI_PATTERN, max_length=16)]
    if check is s._mount_path:
        return Annotated[str, msgspec.Meta(pattern=s.MOUNT_PATH_PATTERN, max_length=s.MAX_PATH_LEN)]
    if check is s._error_names:
        return Annotated[list[Annotated[str, msgspec.Meta(max_length=48)]], msgspec.Meta(max_length=32)]
    if check is s._xids:
        xid = Annotated[int, msgspec.Meta(ge=0, le=s.MAX_XID)]
        return Annotated[list[xid], msgspec.Meta(max_length=s.MAX_XIDS)]
    raise TypeError(f"no msgspec type for {check.__name__}")


def _struct(
    name: str,
    spec: dict[str, s.Check],
    required: dict[str, Any] | None = None,
    extra: tuple[tuple[str, Any, Any], ...] = (),
    defaults: dict[str, Any] | None = None,
) -> type:
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = [(k, t) for k, t in (required or {}).items()]
    for k, c in spec.items():
        # NaN is never a valid value (the checks reject it), so as a default it can only mean absent
        default = math.nan if c in s._RANGES else (defaults or {}).get(k, _UNSET)
        fields.append((k, _field_type(c) | msgspec.UnsetType, default))
    fields += extra
    return msgspec.defstruct(name, fields, gc=False)


# `lost` is not part of the contract's field table but collectors set it on a GPU that fell off
# the bus; the Python validator tolerates any value there, so this decoder does too.
_Gpu = _struct(
    "Gpu",
    s.GPU_FIELDS,
    {"index": Annotated[int, msgspec.Meta(ge=0, le=s.MAX_GPU_INDEX)]},
    (("lost", Any, None),),
)
_Host = _struct("Host", s.HOST_FIELDS)
# A port's key is "device/port" with "" for an absent part, as detectors/batch.py spells it for dicts.
_Ib = _struct("Ib", s.IB_FIELDS, defaults={"device": "", "port": ""})
_Eth = _struct("Eth", s.ETH_FIELDS)
# gc=False: these throw-away structs need no cycle tracking, and allocating tracked objects in a
# worker that holds a few hundred thousand live message dicts triggers costly full collections.
_Net = msgspec.defstruct(
    "Net",
    [
        ("ib", Annotated[list[_Ib], msgspec.Meta(max_length=s.MAX_PORTS)] | msgspec.UnsetType, _UNSET),
        ("eth", Annotated[list[_Eth], msgspec.Meta(max_length=s.MAX_PORTS)] | msgspec.UnsetType, _UNSET),
    ],
    gc=False,
)
_KernelEvent = _struct(
    "KernelEvent", {k: c for k, c in s.KERNEL_EVENT_FIELDS.items() if k != "kind"}, {"kind": _Ident}
)
_Count = Annotated[int, msgspec.Meta(ge=0, le=s.I64_MAX)]
_Kernel = msgspec.defstruct(
    "Kernel",
    [
        ("boot", _Ident | msgspec.UnsetType, _UNSET),
        ("events", Annotated[list[_KernelEvent], msgspec.Meta(max_length=s.MAX_KERNEL_EVENTS)], []),
        *((k, _Count | msgspec.UnsetType, _UNSET) for k in s.KERNEL_COUNTS),
    ],
    gc=False,
)


def _check_list(name: str, spec: dict[str, s.Check], required: tuple[str, ...]) -> Any:
    """A `checks` list: entries with their required fields first (msgspec refuses one without)."""
    entry = _struct(
        name,
        {k: c for k, c in spec.items() if k not in required},
        {k: _field_type(spec[k]) for k in required},
    )
    return Annotated[list[entry], msgspec.Meta(max_length=s.MAX_CHECK_ENTRIES)]  # type: ignore[valid-type]


_Checks = msgspec.defstruct(
    "Checks",
    [
        (key, _check_list(f"Check_{key}", spec, required) | msgspec.UnsetType, _UNSET)
        for key, spec, required in s.CHECK_LISTS
    ],
    gc=False,
)
_SourceErrors = Annotated[
    dict[_Ident, Annotated[str, msgspec.Meta(max_length=s.MAX_ERROR_LEN)]],
    msgspec.Meta(max_length=s.MAX_SOURCE_ERRORS),
]
_Agent = msgspec.defstruct(
    "Agent",
    [
        ("source_errors", _SourceErrors | msgspec.UnsetType, _UNSET),
        ("version", _Ident | msgspec.UnsetType, _UNSET),
        ("instance", _Ident | msgspec.UnsetType, _UNSET),
    ],
    gc=False,
)
_Telemetry = msgspec.defstruct(
    "Telemetry",
    [
        ("schema", Literal["telemetry/1"]),
        ("node", Annotated[str, msgspec.Meta(pattern=s.NAME_PATTERN)]),
        ("ts", _numeric(s._nonneg)),
        ("seq", Annotated[int, msgspec.Meta(ge=0, le=s.I64_MAX)]),
        ("gpus", Annotated[list[_Gpu], msgspec.Meta(max_length=s.MAX_GPUS)]),
        ("host", _Host | msgspec.UnsetType, _UNSET),
        ("net", _Net | msgspec.UnsetType, _UNSET),
        ("kernel", _Kernel | msgspec.UnsetType, _UNSET),
        ("checks", _Checks | msgspec.UnsetType, _UNSET),
        ("agent", _Agent | msgspec.UnsetType, _UNSET),
    ],
    gc=False,
)
_decoder = msgspec.json.Decoder(_Telemetry)


Telemetry = _Telemetry  # the decoded type, for isinstance checks


def decode_telemetry(raw: bytes) -> Any | None:
    """The decoded struct if `raw` is a valid telemetry/1 message (GPU indices unique), else None:
    ask the slow path, which names the problem. Only the values: fleetwatch.strict_json checks the
    JSON itself (msgspec keeps the last of duplicate keys and skips unread fields unchecked)."""
    try:
        t = _decoder.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):  # deep unknown values recurse
        return None
    if len(t.gpus) > 1 and len({g.index for g in t.gpus}) != len(t.gpus):
        return None
    return t


def telemetry_ok(raw: bytes) -> bool:
    """True if `raw` is a valid telemetry/1 message (GPU indices unique); False: ask the slow path."""
    return decode_telemetry(raw) is not None
