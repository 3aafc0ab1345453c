"""Scan a batch of telemetry/1 JSON messages straight into columns, in compiled code (numba).

Why: the worker's per-message cost was dominated by turning 5 KB of JSON into ~250 Python
objects (msgspec) and those objects into numpy columns (~55 of ~100 us a message). This scanner
reads the bytes once and writes the numbers into the arrays the detectors use, with no Python
object per value.

It is a fast path, not a second definition of the contract. It accepts a message only when it
is certain that the compiled decoder (fleetwatch/fast_schema.py) accepts it with the same
values, and marks every other message for that decoder, which decides and names the problem:
- strings must be plain ASCII without escapes or control characters, at most MAX_ID_LEN long;
- numbers must follow JSON's grammar; a value that is not exact in float64 (over 2**53 or a
  power of ten beyond 1e22) is converted by libc strtod (correctly rounded, as Python does);
  integers beyond 18 digits are left to the other decoder;
- a duplicate key, a null, a key the contract does not name in that object (the other decoder
  checks such values, which may hold duplicate keys of their own: fleetwatch.strict_json), a
  non-empty agent.source_errors (free-form keys) or a list longer than the contract allows marks
  the message;
- the field tables, types and ranges come from fleetwatch/schemas.py (a key's column, kind and
  bounds are passed in as arrays), so the contract is still defined once.
tests/unit/test_telemetry_scan.py checks on generated and mutated messages that every message this
accepts is accepted by fast_schema with the same columns.

Memory safety: every read is checked against the message's end (`i < e` before `buf[i]`);
the tests run the scanner with numba's bounds checking on as well.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba import njit, types

from fleetwatch import schemas as s

# libc's strtod by symbol name (not a ctypes pointer, which numba cannot cache): the process has
# libc loaded, and the C locale's decimal point is '.' (Python never sets LC_NUMERIC).
_strtod = types.ExternalFunction("strtod", types.float64(types.voidptr, types.voidptr))

# Contexts: one object kind each; ACT[ctx, key id] says what a key means there.
TOP, GPU, HOST, NET, IB, ETH, AGENT = range(7)
UNKNOWN = -1  # a key the contract does not name here: the message is left to the other decoder
# Non-numeric keys, by context (numeric keys are their column number, >= 0).
T_SCHEMA, T_NODE, T_TS, T_SEQ, T_GPUS, T_HOST, T_NET, T_AGENT = (-2, -3, -4, -5, -6, -7, -8, -9)
G_UUID, G_XIDS, G_LOST = -2, -3, -4
N_IB, N_ETH = -2, -3
P_DEVICE, P_PORT, P_STATE = -2, -3, -4  # IB ports; Ethernet's iface/state are plain strings (-5)
STRING = -5
A_SOURCE_ERRORS = -2

GPU_COLUMNS = ("index", *(f for f in s.GPU_FIELDS if f not in ("uuid", "xids")))
HOST_COLUMNS = tuple(s.HOST_FIELDS)
IB_COLUMNS = tuple(f for f in s.IB_FIELDS if f not in ("device", "port", "state"))
ETH_COLUMNS = tuple(f for f in s.ETH_FIELDS if f not in ("iface", "state"))
MAX_COLS = 32
SCHEMA_BYTES = np.frombuffer(s.TELEMETRY.encode(), dtype=np.uint8).copy()


def _tables() -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Key names, ACT (ctx x key -> meaning), and per ctx x column: lo, hi, integers only."""
    specials = {
        TOP: {
            "schema": T_SCHEMA,
            "node": T_NODE,
            "ts": T_TS,
            "seq": T_SEQ,
            "gpus": T_GPUS,
            "host": T_HOST,
            "net": T_NET,
            "agent": T_AGENT,
        },
        GPU: {"uuid": G_UUID, "xids": G_XIDS, "lost": G_LOST},
        HOST: {},
        NET: {"ib": N_IB, "eth": N_ETH},
        IB: {"device": P_DEVICE, "port": P_PORT, "state": P_STATE},
        ETH: {"iface": STRING, "state": STRING},
        AGENT: {"source_errors": A_SOURCE_ERRORS, "version": STRING},
    }
    columns = {
        TOP: (),
        GPU: GPU_COLUMNS,
        HOST: HOST_COLUMNS,
        NET: (),
        IB: IB_COLUMNS,
        ETH: ETH_COLUMNS,
        AGENT: (),
    }
    specs = {GPU: s.GPU_FIELDS, HOST: s.HOST_FIELDS, IB: s.IB_FIELDS, ETH: s.ETH_FIELDS}
    names = sorted({k for d in specials.values() for k in d} | {c for cs in columns.values() for c in cs})
    key_id = {k: i for i, k in enumerate(names)}
    act = np.full((7, len(names)), UNKNOWN, dtype=np.int64)
    lo = np.zeros((7, MAX_COLS))
    hi = np.zeros((7, MAX_COLS))
    integer = np.zeros((7, MAX_COLS), dtype=np.bool_)
    for ctx in range(7):
        for k, code in specials[ctx].items():
            act[ctx, key_id[k]] = code
        for col, k in enumerate(columns[ctx]):
            act[ctx, key_id[k]] = col
            if k == "index":  # GPU index: an integer 0..MAX_GPU_INDEX (uniqueness checked apart)
                lo[ctx, col], hi[ctx, col], integer[ctx, col] = 0, s.MAX_GPU_INDEX, True
            else:
                lo[ctx, col], hi[ctx, col], integer[ctx, col] = s._RANGES[specs[ctx][k]]
    return names, act, lo, hi, integer


KEY_NAMES, ACT, LO, HI, INTEGER = _tables()


def _key_table(names: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An open-addressing hash table of key names: slot -> key id (-1 empty), plus the names'
    bytes (concatenated, with offsets) to confirm a hit."""
    blob = b"".join(n.encode() for n in names)
    offs = np.zeros(len(names) + 1, dtype=np.int64)
    np.cumsum([len(n) for n in names], out=offs[1:])
    size = 1 << max(6, (4 * len(names)).bit_length())
    slots = np.full(size, -1, dtype=np.int64)
    for i, n in enumerate(names):
        h = _hash_py(n.encode()) & (size - 1)
        while slots[h] != -1:
            h = (h + 1) & (size - 1)
        slots[h] = i
    return slots, np.frombuffer(blob, dtype=np.uint8).copy(), offs


def _hash_py(b: bytes) -> int:  # the same hash as _key computes
    h = 0
    for c in b:
        h = (h * 31 + c) & 0xFFFFFFFF
    return h


SLOTS, KEY_BLOB, KEY_OFFS = _key_table(KEY_NAMES)
# A per-object bitmask of the keys seen (duplicates are left to the other decoder) needs < 63 keys.
assert len(KEY_NAMES) < 63, len(KEY_NAMES)

# ---------------------------------------------------------------- compiled helpers

_POW10 = np.array([10.0**k for k in range(23)])
_MAX_STRING = s.MAX_ID_LEN
_EXACT = float(2**53)


@njit(cache=True, inline="always", _nrt=False)
def _ws(buf, i, e):  # type: ignore[no-untyped-def]
    while i < e:
        c = buf[i]
        if c != 32 and c != 10 and c != 13 and c != 9:
            return i
        i += 1
    return i


@njit(cache=True, _nrt=False)
def _string(buf, i, e):  # type: ignore[no-untyped-def]
    """buf[i] is '"': the index after the closing quote, or -1 (escape, control, non-ASCII, open,
    or longer than the longest string the contract allows where the scanner reads strings)."""
    i += 1
    e = min(e, i + _MAX_STRING + 1)
    while i < e:
        c = buf[i]
        if c == 34:
            return i + 1
        if c == 92 or c < 32 or c >= 128:
            return -1
        i += 1
    return -1


@njit(cache=True, _nrt=False)
def _number(buf, i, e):  # type: ignore[no-untyped-def]
    """A JSON number at buf[i]: (end, kind, int value, float value); kind 0 = not one we take,
    1 = an integer token, 2 = a token with a fraction or exponent."""
    start = i
    neg = False
    if i < e and buf[i] == 45:
        neg = True
        i += 1
    if i >= e or buf[i] < 48 or buf[i] > 57:
        return -1, 0, 0, 0.0
    mant = 0
    digits = 0  # significant digits in mant; beyond 18 it would overflow: `long` goes to strtod
    long = False
    if buf[i] == 48:
        i += 1
        if i < e and 48 <= buf[i] <= 57:
            return -1, 0, 0, 0.0  # leading zero
    else:
        while i < e and 48 <= buf[i] <= 57:
            if digits >= 18:
                long = True
            else:
                mant = mant * 10 + (buf[i] - 48)
                digits += 1
            i += 1
    frac = 0
    is_float = False
    if i < e and buf[i] == 46:
        is_float = True
        i += 1
        if i >= e or buf[i] < 48 or buf[i] > 57:
            return -1, 0, 0, 0.0
        while i < e and 48 <= buf[i] <= 57:
            if digits >= 18:
                long = True
            else:
                mant = mant * 10 + (buf[i] - 48)
                if mant != 0:
                    digits += 1
                frac += 1
            i += 1
    exp = 0
    if i < e and (buf[i] == 101 or buf[i] == 69):
        is_float = True
        i += 1
        eneg = False
        if i < e and (buf[i] == 43 or buf[i] == 45):
            eneg = buf[i] == 45
            i += 1
        if i >= e or buf[i] < 48 or buf[i] > 57:
            return -1, 0, 0, 0.0
        while i < e and 48 <= buf[i] <= 57:
            if exp > 10000:
                return -1, 0, 0, 0.0
            exp = exp * 10 + (buf[i] - 48)
            i += 1
        if eneg:
            exp = -exp
    if not is_float:
        if long:  # an integer beyond 18 digits: left to the other decoder
            return -1, 0, 0, 0.0
        v = -mant if neg else mant
        return i, 1, v, float(v)
    p = exp - frac
    if mant == 0:
        f = 0.0
    elif not long and float(mant) <= _EXACT and -22 <= p <= 22:
        # both operands exact: one IEEE operation is correctly rounded (Clinger's fast path)
        f = float(mant) * _POW10[p] if p >= 0 else float(mant) / _POW10[-p]
    else:
        f = _strtod(buf[start:].ctypes, 0)
        if neg:
            f = -f  # strtod read the sign too; undo before the common negation below
    if neg:
        f = -f
    if not math.isfinite(f):
        return -1, 0, 0, 0.0
    return i, 2, 0, f


# Every numeric field of a GPU, host or port object (~9 in 10 of a message's values) goes through
# inlined copies of _number, _member_of and _next (the same code): a call each cost ~25% of the
# scanner's time. They are inlined there only: numba then compiles this in ~1.5 min (~15 s with
# no inlining); at every call site it took ~2 min for ~0.2 us a message more.
_number_inline = njit(cache=True, _nrt=False, inline="always")(_number.py_func)

_MAX_GPUS = s.MAX_GPUS
# pred[] slots: one per key (the key after it), one per context (its first key)
_START = len(KEY_NAMES)
_PRED_SLOTS = _START + 7
_REQUIRED = sum(1 << KEY_NAMES.index(k) for k in ("schema", "node", "ts", "seq", "gpus"))
_MAX_PORTS = s.MAX_PORTS
_MAX_XIDS = s.MAX_XIDS
_MAX_XID = s.MAX_XID
_MAX_PORT_NUMBER = s.MAX_PORT_NUMBER
_BAIL = -1  # the message is left to fast_schema


def _drop_stale_cache() -> None:
    """numba caches the compiled scanner by this file's source, but the code bakes in the contract's
    tables and limits from fleetwatch/schemas.py (global arrays and numbers are compile-time
    constants): a change there alone would leave a cached scanner that still reads the old
    contract. A digest of everything it bakes in, kept beside the cache, says which contract the
    cache was compiled for; on a mismatch the cached builds are removed before any is loaded.
    (A NUMBA_CACHE_DIR of its own, as the bounds-checked tests use, starts empty anyway.)"""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    parts = [repr(KEY_NAMES).encode(), SCHEMA_BYTES.tobytes()]
    parts += [a.tobytes() for a in (ACT, LO, HI, INTEGER, SLOTS, KEY_BLOB, KEY_OFFS)]
    parts.append(repr((_MAX_STRING, _MAX_GPUS, _MAX_PORTS, _MAX_XIDS, _MAX_XID, _MAX_PORT_NUMBER)).encode())
    digest = hashlib.sha256(b"\0".join(parts)).hexdigest()
    cache = Path(__file__).parent / "__pycache__"
    stamp = cache / f"{Path(__file__).stem}.contract"
    try:
        if stamp.read_text() == digest:
            return
    except OSError:
        pass
    try:
        for built in cache.glob(f"{Path(__file__).stem}.*.nb[ci]"):
            built.unlink(missing_ok=True)
        cache.mkdir(exist_ok=True)
        stamp.write_text(digest)
    except OSError:  # a read-only install: its cache was built with it, for its own contract
        pass


_drop_stale_cache()
_FULL_E, _FULL_P, _FULL_X = 1, 2, 3  # an output array is full: the caller retries with more room


@njit(cache=True, _nrt=False)
def _literal(buf, i, e):  # type: ignore[no-untyped-def]
    """true / false / null at buf[i]: (end, 1 | 0 | 2), end -1 if none of them."""
    if i + 4 <= e and buf[i] == 116 and buf[i + 1] == 114 and buf[i + 2] == 117 and buf[i + 3] == 101:
        return i + 4, 1
    if (
        i + 5 <= e
        and buf[i] == 102
        and buf[i + 1] == 97
        and buf[i + 2] == 108
        and buf[i + 3] == 115
        and buf[i + 4] == 101
    ):
        return i + 5, 0
    if i + 4 <= e and buf[i] == 110 and buf[i + 1] == 117 and buf[i + 2] == 108 and buf[i + 3] == 108:
        return i + 4, 2
    return -1, 0


@njit(cache=True, _nrt=False, inline="always")  # called by _member_of only
def _key(buf, i, e, pred, prev):  # type: ignore[no-untyped-def]
    """A key at buf[i]: (its id in KEY_NAMES or -1 if the contract does not name it, the index
    of its value or -1 if malformed).

    Collectors write keys in a fixed order, so the key that followed `prev` last time
    (pred[prev]) is tried first with one comparison; only a miss hashes the key (and teaches
    pred). A key that matches a known name byte for byte needs no further character checks."""
    if i >= e or buf[i] != 34:
        return -1, -1
    a = i + 1
    c = pred[prev]
    if c >= 0:
        start = KEY_OFFS[c]
        n = KEY_OFFS[c + 1] - start
        if a + n < e and buf[a + n] == 34:
            same = True
            for k in range(n):
                if KEY_BLOB[start + k] != buf[a + k]:
                    same = False
                    break
            if same:
                j = _ws(buf, a + n + 1, e)
                if j >= e or buf[j] != 58:
                    return -1, -1
                return c, _ws(buf, j + 1, e)
    h = 0
    j = a
    while j < e:
        ch = buf[j]
        if ch == 34:
            break
        if ch == 92 or ch < 32 or ch >= 128:
            return -1, -1
        h = (h * 31 + ch) & 0xFFFFFFFF
        j += 1
    if j >= e:
        return -1, -1
    b = j
    mask = len(SLOTS) - 1
    h &= mask
    kid = -1
    while SLOTS[h] != -1:
        c = SLOTS[h]
        start = KEY_OFFS[c]
        n = KEY_OFFS[c + 1] - start
        if n == b - a:
            same = True
            for k in range(n):
                if KEY_BLOB[start + k] != buf[a + k]:
                    same = False
                    break
            if same:
                kid = c
                break
        h = (h + 1) & mask
    pred[prev] = kid
    j = _ws(buf, b + 1, e)
    if j >= e or buf[j] != 58:
        return -1, -1
    return kid, _ws(buf, j + 1, e)


@njit(cache=True, _nrt=False)
def _next(buf, i, e, close):  # type: ignore[no-untyped-def]
    """After a member or element: (index of the next one, 0) after ',', (index after the close,
    1) at the close, (-1, 0) otherwise."""
    i = _ws(buf, i, e)
    if i >= e:
        return -1, 0
    if buf[i] == 44:
        return _ws(buf, i + 1, e), 0
    if buf[i] == close:
        return i + 1, 1
    return -1, 0


@njit(cache=True, _nrt=False)
def _name_ok(buf, a, b):  # type: ignore[no-untyped-def]
    """NAME_RE: ^[A-Za-z0-9][A-Za-z0-9._:-]{0,252}$"""
    if b - a < 1 or b - a > 253:
        return False
    for k in range(a, b):
        c = buf[k]
        if (48 <= c <= 57) or (65 <= c <= 90) or (97 <= c <= 122):
            continue
        if k > a and (c == 46 or c == 95 or c == 58 or c == 45):
            continue
        return False
    return True


@njit(cache=True, _nrt=False, inline="always")
def _numeric(buf, i, e, ctx, col):  # type: ignore[no-untyped-def]
    """A numeric field's value as the contract allows it: (end, value), end -1 if not."""
    j, kind, _iv, fv = _number_inline(buf, i, e)
    if kind == 0 or (INTEGER[ctx, col] and kind != 1):
        return -1, 0.0
    if not (LO[ctx, col] <= fv <= HI[ctx, col]):
        return -1, 0.0
    return j, fv


@njit(cache=True, _nrt=False)
def _flat(buf, i, e, ctx, out, row, refs, pred):  # type: ignore[no-untyped-def]
    """A host, IB-port or Ethernet object at buf[i] ('{'): numbers into out[row], an IB port's
    device / port / state spans into refs[row] (-1: absent). The index after it, or -1."""
    i, closed = _object_open(buf, i, e)  # the caller saw the '{'
    seen = 0
    prev = _START + ctx
    while not closed:
        a, prev, i, seen = _member_of_inline(buf, i, e, ctx, pred, prev, seen)
        if i < 0:
            return -1
        if a >= 0:
            i, v = _numeric(buf, i, e, ctx, a)
            if i < 0:
                return -1
            out[row, a] = v
        elif a in (STRING, P_DEVICE, P_STATE):
            if buf[i] != 34:
                return -1
            j = _string(buf, i, e)
            if j < 0:
                return -1
            if a == P_DEVICE:
                refs[row, 0] = i + 1
                refs[row, 1] = j - 1
            elif a == P_STATE:
                refs[row, 4] = i + 1
                refs[row, 5] = j - 1
            i = j
        elif a == P_PORT:  # a string or an integer; its name is the text either way
            if buf[i] == 34:
                j = _string(buf, i, e)
                if j < 0:
                    return -1
                refs[row, 2] = i + 1
                refs[row, 3] = j - 1
            else:
                j, kind, iv, _fv = _number(buf, i, e)
                if kind != 1 or iv < 0 or iv > _MAX_PORT_NUMBER or (iv == 0 and buf[i] == 45):
                    return -1  # (str(-0) is "0", not the text)
                refs[row, 2] = i
                refs[row, 3] = j
            i = j
        i, closed = _next_inline(buf, i, e, 125)
        if i < 0:
            return -1
    return i


@njit(cache=True, _nrt=False)
def _gpu(buf, i, e, row, table, xe, xc, nx, pred):  # type: ignore[no-untyped-def]
    """A GPU object at buf[i] ('{') into table[row] (NaN-filled by the caller), its XIDs into
    xe/xc from nx: (end or -1, -2 when xe is full; new nx; lost: true; index)."""
    i, closed = _object_open(buf, i, e)  # the caller saw the '{'
    seen = 0
    index = -1
    lost = False
    prev = _START + GPU
    while not closed:
        a, prev, i, seen = _member_of_inline(buf, i, e, GPU, pred, prev, seen)
        if i < 0:
            return -1, nx, lost, index
        if a >= 0:
            i, v = _numeric(buf, i, e, GPU, a)
            if i < 0:
                return -1, nx, lost, index
            table[row, a] = v
            if a == 0:
                index = int(v)
        elif a == G_UUID:
            if buf[i] != 34:
                return -1, nx, lost, index
            i = _string(buf, i, e)
            if i < 0:
                return -1, nx, lost, index
        elif a == G_XIDS:
            if buf[i] != 91:
                return -1, nx, lost, index
            i = _ws(buf, i + 1, e)
            if i < e and buf[i] == 93:
                i += 1
            else:
                count = 0
                while True:
                    j, kind, iv, _fv = _number(buf, i, e)
                    count += 1
                    if kind != 1 or iv < 0 or iv > _MAX_XID or count > _MAX_XIDS:
                        return -1, nx, lost, index
                    if nx >= len(xc):
                        return -2, nx, lost, index
                    xe[nx] = row
                    xc[nx] = iv
                    nx += 1
                    i, xids_closed = _next(buf, j, e, 93)
                    if i < 0:
                        return -1, nx, lost, index
                    if xids_closed:
                        break
        elif a == G_LOST:  # only `true` says lost; other literals say nothing, anything else bails
            i, w = _literal(buf, i, e)
            if i < 0:
                return -1, nx, lost, index
            lost = w == 1
        i, closed = _next_inline(buf, i, e, 125)
        if i < 0:
            return -1, nx, lost, index
    if index < 0:  # required
        return -1, nx, lost, index
    return i, nx, lost, index


@njit(cache=True, _nrt=False)
def _array_open(buf, i, e):  # type: ignore[no-untyped-def]
    """buf[i] must be '[': (index of the first element or -1, 1 if the array is empty)."""
    if i >= e or buf[i] != 91:
        return -1, 0
    i = _ws(buf, i + 1, e)
    if i < e and buf[i] == 93:
        return i + 1, 1
    return i, 0


@njit(cache=True, _nrt=False)
def _object_open(buf, i, e):  # type: ignore[no-untyped-def]
    """buf[i] must be '{': (index of its first key or -1, 1 if the object is empty)."""
    if i >= e or buf[i] != 123:
        return -1, 0
    i = _ws(buf, i + 1, e)
    if i < e and buf[i] == 125:
        return i + 1, 1
    return i, 0


@njit(cache=True, _nrt=False)
def _member_of(buf, i, e, ctx, pred, prev, seen):  # type: ignore[no-untyped-def]
    """The key of a member of a `ctx` object at buf[i]: (what ACT says it is; the key to predict
    the next one from; the index of its value, -1 if malformed or a key seen before in this
    object; `seen` with it)."""
    kid, i = _key(buf, i, e, pred, prev)
    if i < 0 or i >= e:
        return UNKNOWN, prev, -1, seen
    if kid < 0 or ACT[ctx, kid] == UNKNOWN or seen & (1 << kid):  # unnamed here, or seen before
        return UNKNOWN, prev, -1, seen
    return ACT[ctx, kid], kid, i, seen | (1 << kid)


_member_of_inline = njit(cache=True, _nrt=False, inline="always")(_member_of.py_func)
_next_inline = njit(cache=True, _nrt=False, inline="always")(_next.py_func)


@njit(cache=True, _nrt=False)
def _message(  # type: ignore[no-untyped-def]
    buf, i, e, m, ne, nx, npt,
    node_ab, ts, seq, host, table, lostf, emsg, xe, xc, ptable, prefs, pmsg, eth,
    pred,
):  # fmt: skip
    """One message buf[i:e] as row m, its GPU entries from ne, XIDs from nx, IB ports from npt:
    (status: 0 taken, _BAIL or _FULL_*; the new ne, nx, npt)."""
    ne0, nx0, np0 = ne, nx, npt
    i, closed = _object_open(buf, _ws(buf, i, e), e)
    if i < 0:
        return _BAIL, ne0, nx0, np0
    for k in range(host.shape[1]):
        host[m, k] = np.nan
    seen = 0
    gpu_seen = 0  # bitmask of GPU indices
    prev = _START + TOP
    while not closed:
        a, prev, i, seen = _member_of(buf, i, e, TOP, pred, prev, seen)
        if i < 0:
            return _BAIL, ne0, nx0, np0
        if a in (T_SCHEMA, T_NODE):
            if buf[i] != 34:
                return _BAIL, ne0, nx0, np0
            j = _string(buf, i, e)
            if j < 0:
                return _BAIL, ne0, nx0, np0
            if a == T_NODE:
                if not _name_ok(buf, i + 1, j - 1):
                    return _BAIL, ne0, nx0, np0
                node_ab[m, 0] = i + 1
                node_ab[m, 1] = j - 1
            else:
                if j - 2 - i != len(SCHEMA_BYTES):
                    return _BAIL, ne0, nx0, np0
                for k in range(len(SCHEMA_BYTES)):
                    if buf[i + 1 + k] != SCHEMA_BYTES[k]:
                        return _BAIL, ne0, nx0, np0
            i = j
        elif a in (T_TS, T_SEQ):
            j, kind, iv, fv = _number(buf, i, e)
            if kind == 0 or fv < 0.0 or (a == T_SEQ and kind != 1):
                return _BAIL, ne0, nx0, np0
            if a == T_TS:
                ts[m] = fv
            else:
                seq[m] = iv
            i = j
        elif a == T_GPUS:
            i, empty = _array_open(buf, i, e)
            if i < 0:
                return _BAIL, ne0, nx0, np0
            count = 0
            while not empty:
                if i >= e or buf[i] != 123:
                    return _BAIL, ne0, nx0, np0
                count += 1
                if count > _MAX_GPUS:
                    return _BAIL, ne0, nx0, np0
                if ne >= table.shape[0]:
                    return _FULL_E, ne0, nx0, np0
                for k in range(table.shape[1]):
                    table[ne, k] = np.nan
                i, nx, lost, index = _gpu(buf, i, e, ne, table, xe, xc, nx, pred)
                if i == -2:
                    return _FULL_X, ne0, nx0, np0
                if i < 0 or gpu_seen & (1 << index):
                    return _BAIL, ne0, nx0, np0
                gpu_seen |= 1 << index
                lostf[ne] = lost
                emsg[ne] = m
                ne += 1
                i, empty = _next(buf, i, e, 93)
                if i < 0:
                    return _BAIL, ne0, nx0, np0
        elif a == T_HOST:
            if buf[i] != 123:
                return _BAIL, ne0, nx0, np0
            i = _flat(buf, i, e, HOST, host, m, prefs, pred)
            if i < 0:
                return _BAIL, ne0, nx0, np0
        elif a == T_NET:
            i, net_closed = _object_open(buf, i, e)
            if i < 0:
                return _BAIL, ne0, nx0, np0
            net_seen = 0
            nprev = _START + NET
            while not net_closed:
                na, nprev, i, net_seen = _member_of(buf, i, e, NET, pred, nprev, net_seen)
                if i < 0:
                    return _BAIL, ne0, nx0, np0
                if na in (N_IB, N_ETH):
                    i, empty = _array_open(buf, i, e)
                    if i < 0:
                        return _BAIL, ne0, nx0, np0
                    count = 0
                    while not empty:
                        if i >= e or buf[i] != 123:
                            return _BAIL, ne0, nx0, np0
                        count += 1
                        if count > _MAX_PORTS:
                            return _BAIL, ne0, nx0, np0
                        if na == N_IB:
                            if npt >= ptable.shape[0]:
                                return _FULL_P, ne0, nx0, np0
                            for k in range(ptable.shape[1]):
                                ptable[npt, k] = np.nan
                            for k in range(6):
                                prefs[npt, k] = -1
                            i = _flat(buf, i, e, IB, ptable, npt, prefs, pred)  # fmt: skip
                            pmsg[npt] = m
                            npt += 1
                        else:  # checked into a scratch row, not kept: no detector reads them yet
                            i = _flat(buf, i, e, ETH, eth, 0, prefs, pred)
                        if i < 0:
                            return _BAIL, ne0, nx0, np0
                        i, empty = _next(buf, i, e, 93)
                        if i < 0:
                            return _BAIL, ne0, nx0, np0
                i, net_closed = _next(buf, i, e, 125)
                if i < 0:
                    return _BAIL, ne0, nx0, np0
        elif a == T_AGENT:
            i, agent_closed = _object_open(buf, i, e)
            if i < 0:
                return _BAIL, ne0, nx0, np0
            agent_seen = 0
            aprev = _START + AGENT
            while not agent_closed:
                aa, aprev, i, agent_seen = _member_of(buf, i, e, AGENT, pred, aprev, agent_seen)
                if i < 0:
                    return _BAIL, ne0, nx0, np0
                if aa == STRING:  # the agent's version
                    if buf[i] != 34:
                        return _BAIL, ne0, nx0, np0
                    i = _string(buf, i, e)
                else:  # source_errors: empty, or left to the other decoder (its keys are free-form,
                    # so only a decoder that can compare them finds a duplicate)
                    i, done = _object_open(buf, i, e)
                    if i >= 0 and not done:
                        i = -1
                if i < 0:
                    return _BAIL, ne0, nx0, np0
                i, agent_closed = _next(buf, i, e, 125)
                if i < 0:
                    return _BAIL, ne0, nx0, np0
        i, closed = _next(buf, i, e, 125)
        if i < 0:
            return _BAIL, ne0, nx0, np0
    if _ws(buf, i, e) != e:
        return _BAIL, ne0, nx0, np0
    if seen & _REQUIRED != _REQUIRED:
        return _BAIL, ne0, nx0, np0
    return 0, ne, nx, npt


@njit(cache=True, _nrt=False, nogil=True)
def _scan(  # type: ignore[no-untyped-def]
    buf, starts, ends,
    taken, node_ab, ts, seq, host, table, lostf, emsg, xe, xc, ptable, prefs, pmsg, eth,
    pred,
):  # fmt: skip
    """Every message buf[starts[k]:ends[k]]: taken ones get consecutive rows (taken[row] = k).
    Returns (status: 0 or _FULL_*, rows, entries, XIDs, ports)."""
    m = ne = nx = npt = 0
    for k in range(len(starts)):
        status, ne2, nx2, np2 = _message(
            buf, starts[k], ends[k], m, ne, nx, npt,
            node_ab, ts, seq, host, table, lostf, emsg, xe, xc, ptable, prefs, pmsg, eth,
            pred,
        )  # fmt: skip
        if status > 0:
            return status, m, ne, nx, npt
        if status == 0:
            taken[m] = k
            m += 1
            ne, nx, npt = ne2, nx2, np2
    return 0, m, ne, nx, npt


@njit(cache=True, nogil=True)
def _intern(buf, spans):  # type: ignore[no-untyped-def]
    """Distinct values of byte-span pairs spans[k] = (a0, b0, a1, b1) (a0 = -1: absent, a value of
    its own): (code of each, in order of first appearance; the first k of each code)."""
    n = spans.shape[0]
    size = 16
    while size < 2 * n:
        size *= 2
    slots = np.full(size, -1, dtype=np.int64)
    codes = np.empty(n, dtype=np.int64)
    reps = np.empty(n, dtype=np.int64)
    nrep = 0
    for k in range(n):
        h = 7
        if spans[k, 0] >= 0:
            for j in range(spans[k, 0], spans[k, 1]):
                h = (h * 31 + buf[j]) & 0xFFFFFFFF
            h = (h * 31 + 256) & 0xFFFFFFFF
            for j in range(spans[k, 2], spans[k, 3]):
                h = (h * 31 + buf[j]) & 0xFFFFFFFF
        h &= size - 1
        while True:
            r = slots[h]
            if r == -1:
                slots[h] = nrep
                reps[nrep] = k
                codes[k] = nrep
                nrep += 1
                break
            if _same(buf, spans, reps[r], k):
                codes[k] = r
                break
            h = (h + 1) & (size - 1)
    return codes, reps[:nrep]


@njit(cache=True, _nrt=False)
def _same(buf, spans, p, q):  # type: ignore[no-untyped-def]
    if (spans[p, 0] < 0) or (spans[q, 0] < 0):
        return spans[p, 0] < 0 and spans[q, 0] < 0
    for part in (0, 2):
        n = spans[p, part + 1] - spans[p, part]
        if n != spans[q, part + 1] - spans[q, part]:
            return False
        for j in range(n):
            if buf[spans[p, part] + j] != buf[spans[q, part] + j]:
                return False
    return True


@njit(cache=True, nogil=True)
def _joined(buf, spans):  # type: ignore[no-untyped-def]
    """The byte spans buf[a:b] of spans (k, 2), one after another with a newline between: a
    batch's distinct node names become one Python string split once, not k slices decoded."""
    k = spans.shape[0]
    total = max(k - 1, 0)
    for r in range(k):
        total += spans[r, 1] - spans[r, 0]
    out = np.empty(total, dtype=np.uint8)
    j = 0
    for r in range(k):
        if r:
            out[j] = 10
            j += 1
        for i in range(spans[r, 0], spans[r, 1]):
            out[j] = buf[i]
            j += 1
    return out


# ---------------------------------------------------------------- the Python face


@dataclass(slots=True)
class Scan:
    """The messages the scanner took, as columns (rows in input order); it left every other."""

    taken: np.ndarray  # (M,) input index of each row
    node_names: list[str]  # distinct, in order of first appearance
    node_idx: np.ndarray  # (M,)
    ts: np.ndarray  # (M,)
    seq: np.ndarray  # (M,)
    host: np.ndarray  # (M, len(HOST_COLUMNS)), NaN absent
    entry_msg: np.ndarray  # (E,) row of each GPU entry, rows ascending
    entries: np.ndarray  # (E, len(GPU_COLUMNS)): index, then the numeric fields; NaN absent
    entry_lost: np.ndarray  # (E,) the entry says `lost: true`
    xid_entry: np.ndarray  # (X,)
    xid_code: np.ndarray  # (X,)
    ib_msg: np.ndarray  # (P,)
    ib: np.ndarray  # (P, len(IB_COLUMNS))
    ib_key_names: list[str]  # distinct "device/port" (absent parts are "")
    ib_key_idx: np.ndarray  # (P,)
    ib_state_names: list[str | None]  # distinct states as reported, None: not reported
    ib_state_idx: np.ndarray  # (P,)


def scan(raws: list[bytes]) -> Scan:
    """Scan raw telemetry/1 messages; those not in `taken` are left to fast_schema."""
    lens = np.fromiter(map(len, raws), dtype=np.int64, count=len(raws))
    ends = np.cumsum(lens)
    return scan_spans(np.frombuffer(b"".join(raws), dtype=np.uint8), ends - lens, ends)


def scan_spans(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> Scan:
    """scan() of the messages buf[starts[k]:ends[k]] (buf: read-only uint8, the flavour numba's
    cached build takes; starts and ends: int64). `taken` indexes these spans."""
    n = len(starts)
    cap_e, cap_p, cap_x = 8 * n + 16, 8 * n + 16, n + 16
    while True:
        taken = np.empty(n, dtype=np.int64)
        node_ab = np.empty((n, 2), dtype=np.int64)
        ts = np.empty(n)
        seq = np.empty(n, dtype=np.int64)
        host = np.empty((n, len(HOST_COLUMNS)))
        table = np.empty((cap_e, len(GPU_COLUMNS)))
        lostf = np.empty(cap_e, dtype=np.bool_)
        emsg = np.empty(cap_e, dtype=np.int64)
        xe = np.empty(cap_x, dtype=np.int64)
        xc = np.empty(cap_x, dtype=np.int64)
        ptable = np.empty((cap_p, len(IB_COLUMNS)))
        prefs = np.empty((cap_p, 6), dtype=np.int64)
        pmsg = np.empty(cap_p, dtype=np.int64)
        eth = np.empty((1, len(ETH_COLUMNS)))  # an Ethernet port's numbers, checked and dropped
        pred = np.full(_PRED_SLOTS, -1, dtype=np.int64)
        status, m, ne, nx, npt = _scan(
            buf, starts, ends, taken,
            node_ab, ts, seq, host, table, lostf, emsg, xe, xc, ptable, prefs, pmsg, eth, pred,
        )  # fmt: skip
        if status == 0:
            break
        # an output array was too small for this batch (GPU-dense nodes, XID storms): more room
        cap_e *= 4 if status == _FULL_E else 1
        cap_p *= 4 if status == _FULL_P else 1
        cap_x *= 4 if status == _FULL_X else 1
    node_codes, node_reps = _intern(buf, np.concatenate([node_ab[:m], np.zeros((m, 2), np.int64)], axis=1))
    refs = prefs[:npt]
    key_spans = np.where(refs[:, :4] < 0, 0, refs[:, :4])  # an absent device or port is ""
    key_codes, key_reps = _intern(buf, key_spans)
    state_spans = np.concatenate([refs[:, 4:6], np.zeros((npt, 2), np.int64)], axis=1)
    state_codes, state_reps = _intern(buf, state_spans)

    def text(a: int, b: int) -> str:
        return buf[a:b].tobytes().decode("ascii")

    # a node name is 1-253 of [A-Za-z0-9._:-] (_name_ok): never empty, never a newline
    node_names = _joined(buf, node_ab[node_reps]).tobytes().decode("ascii").split("\n") if m else []

    return Scan(
        taken=taken[:m],
        node_names=node_names,
        node_idx=node_codes,
        ts=ts[:m],
        seq=seq[:m],
        host=host[:m],
        entry_msg=emsg[:ne],
        entries=table[:ne],
        entry_lost=lostf[:ne],
        xid_entry=xe[:nx],
        xid_code=xc[:nx],
        ib_msg=pmsg[:npt],
        ib=ptable[:npt],
        ib_key_names=[f"{text(*key_spans[r, :2])}/{text(*key_spans[r, 2:])}" for r in key_reps.tolist()],
        ib_key_idx=key_codes,
        ib_state_names=[None if refs[r, 4] < 0 else text(*refs[r, 4:6]) for r in state_reps.tolist()],
        ib_state_idx=state_codes,
    )


def warm_up() -> None:
    """Load the compiled scanner from numba's cache, compiling it first if there is none (~1.5 min)."""
    scan([b'{"schema":"telemetry/1","node":"n","ts":0,"seq":0,"gpus":[]}'])
