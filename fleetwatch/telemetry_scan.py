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
- the top-level sections an agent sends only when something happened (`kernel`: kernel log
  events; `checks`: the required mounts and block devices that fail) are not named here either:
  a message with one is left to fast_schema, and a quiet, healthy node's samples are all taken;
- the field tables, types and ranges come from fleetwatch/schemas.py (a key's column, kind and
  bounds are passed in as arrays), so the contract is still defined once.
tests/unit/test_telemetry_scan.py checks on generated and mutated messages that every message this
accepts is accepted by fast_schema with the same columns.

Memory safety: every read is checked against the message's end (`i < e` before `buf[i]`);
the tests run the scanner with numba's bounds checking on as well. libc's strtod, the one reader
that is not the scanner's own, is only called on a token followed by a byte of its message that
ends it (see _number).

Reading guide
-------------
Input: the batch's messages lie in one uint8 buffer, message k at buf[starts[k]:ends[k]]. Every
compiled reader takes (buf, i, e): read from index i, never at or past e (the message's end),
and return the index just after what it read (first in a tuple where it returns more), or -1:
"not certain; leave the message".

Three passes:
1. Import (Python): the contract in schemas.py becomes lookup tables. KEY_NAMES lists every key
   the contract names anywhere (a key's id is its index there). An object's kind is a
   *context* (TOP, GPU, HOST, NET, IB, ETH, AGENT), and KEY_MEANING[ctx, key id] says what the
   key means in it: a column number (>= 0) for a numeric field, a negative code for any other
   field (T_*, G_*, N_*, P_*, STRING, A_*), UNKNOWN for a key the contract does not name there.
   LO / HI / INTEGER[ctx, column] are the field's bounds; KEY_SLOTS is a hash table of the names.
2. Compiled, one pass over the batch: _scan calls _message for each message, which walks the
   top-level object one member at a time (_member_of reads a key and looks up its meaning) and
   hands each value to its reader: _number / _string_end for scalars, _gpu_list -> _gpu_object
   for "gpus", _flat_object for "host" and each port, _net_object -> _port_list for "net",
   _agent_object for "agent". Values go straight into the output arrays at the next free row.
3. Python (scan_spans): strings were recorded as (start, end) spans into buf; _intern gives each
   distinct node name / IB port / IB state / Ethernet iface / Ethernet state a code, and only the
   distinct ones become str.

Taken or left: _message returns _OK when it reached the end of the object, with nothing after
it and every required key seen; on any doubt it returns _BAIL at once. _scan advances its row
counters only for an _OK message, so a left message needs no undo: the rows it wrote are written
over by the next message, and fast_schema decodes it later. _FULL_* means an output array ran out
of rows: _scan stops, and scan_spans runs the whole batch again (from scratch) with that array
4x larger.

Output rows (the Scan fields): one row per taken message (node span, ts, seq, host); one per GPU
object (entries, entry_lost, entry_msg = its message's row); one per XID (xid_entry = its GPU
entry's row, xid_code); one per IB port (ib, ib_spans, ib_msg); one per Ethernet port (eth,
eth_spans: its iface in the device columns, its state in the state columns; eth_msg). Absent
numeric fields are NaN.

Key prediction (key_guess): collectors write an object's keys in the same order every time, so
key_guess[id] remembers the id of the key that followed key `id` last time, and
key_guess[_GUESS_FIRST + ctx] the first key of the last `ctx` object. _key tries that guess with
one comparison and hashes the key only on a miss. It is a guess, never trusted: a wrong one costs
a hash lookup, nothing else.
"""

from __future__ import annotations

import hashlib
import math
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba import njit, types

from fleetwatch import schemas as s

# libc's strtod by symbol name (not a ctypes pointer, which numba cannot cache): the process has
# libc loaded, and the C locale's decimal point is '.' (Python never sets LC_NUMERIC).
_strtod = types.ExternalFunction("strtod", types.float64(types.voidptr, types.voidptr))

# ---------------------------------------------------------------- the contract, as tables

# Contexts: one kind of JSON object each.
TOP, GPU, HOST, NET, IB, ETH, AGENT = range(7)
N_CONTEXTS = 7
# What a key means in a context (KEY_MEANING[ctx, key id]): a numeric field is its column number
# (>= 0) in that context's output row; every other field has a negative code, numbered per
# context (so -2 is "schema" at the top level but "uuid" in a GPU object).
UNKNOWN = -1  # a key the contract does not name here: the message is left to the other decoder
T_SCHEMA, T_NODE, T_TS, T_SEQ, T_GPUS, T_HOST, T_NET, T_AGENT = (-2, -3, -4, -5, -6, -7, -8, -9)
G_UUID, G_XIDS, G_LOST = -2, -3, -4
N_IB, N_ETH = -2, -3
# IB ports; an Ethernet port's iface is kept as a device is, its state as a state
P_DEVICE, P_PORT, P_STATE = -2, -3, -4
STRING = -5  # a string checked and not kept (AGENT only, where -5 means nothing else)
A_SOURCE_ERRORS, A_INSTANCE = -2, -3

# The numeric columns of each output row, in order: the Scan arrays' second axis.
GPU_COLUMNS = ("index", *(f for f in s.GPU_FIELDS if f not in ("uuid", "xids")))
HOST_COLUMNS = tuple(s.HOST_FIELDS)
IB_COLUMNS = tuple(f for f in s.IB_FIELDS if f not in ("device", "port", "state"))
ETH_COLUMNS = tuple(f for f in s.ETH_FIELDS if f not in ("iface", "state"))
MAX_COLS = 32  # room for the columns of any one context in LO / HI / INTEGER
SCHEMA_BYTES = np.frombuffer(s.TELEMETRY.encode(), dtype=np.uint8).copy()


def _tables() -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(KEY_NAMES; KEY_MEANING[ctx, key id]; and per [ctx, column] the field's bounds lo, hi and
    whether it takes integers only), from schemas.py's field tables."""
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
        ETH: {"iface": P_DEVICE, "state": P_STATE},
        AGENT: {"source_errors": A_SOURCE_ERRORS, "version": STRING, "instance": A_INSTANCE},
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
    meaning = np.full((N_CONTEXTS, len(names)), UNKNOWN, dtype=np.int64)
    lo = np.zeros((N_CONTEXTS, MAX_COLS))
    hi = np.zeros((N_CONTEXTS, MAX_COLS))
    integer = np.zeros((N_CONTEXTS, MAX_COLS), dtype=np.bool_)
    for ctx in range(N_CONTEXTS):
        for k, code in specials[ctx].items():
            meaning[ctx, key_id[k]] = code
        for col, k in enumerate(columns[ctx]):
            meaning[ctx, key_id[k]] = col
            if k == "index":  # GPU index: an integer 0..MAX_GPU_INDEX (uniqueness checked apart)
                lo[ctx, col], hi[ctx, col], integer[ctx, col] = 0, s.MAX_GPU_INDEX, True
            else:
                lo[ctx, col], hi[ctx, col], integer[ctx, col] = s._RANGES[specs[ctx][k]]
    return names, meaning, lo, hi, integer


KEY_NAMES, KEY_MEANING, LO, HI, INTEGER = _tables()


def _key_table(names: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An open-addressing hash table of key names: slot -> key id (-1 empty), at most a quarter
    full so that probes are short; plus the names' bytes (concatenated: name k is
    KEY_BLOB[KEY_OFFS[k]:KEY_OFFS[k + 1]]) to confirm a hit."""
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


KEY_SLOTS, KEY_BLOB, KEY_OFFS = _key_table(KEY_NAMES)


def _key_bits(meaning: np.ndarray) -> np.ndarray:
    """KEY_BIT[ctx, key id]: the key's bit in `seen`, numbered among the keys its context names
    (-1 where it names none), so that a context, not the whole contract, must have < 63 keys."""
    bits = np.full(meaning.shape, -1, dtype=np.int64)
    for ctx in range(N_CONTEXTS):
        named = np.flatnonzero(meaning[ctx] != UNKNOWN)
        bits[ctx, named] = np.arange(len(named))
    return bits


KEY_BIT = _key_bits(KEY_MEANING)
# `seen`, a per-object bitmask of the keys read (a duplicate is left to the other decoder), needs
# < 63 keys in each context; `gpu_seen`, a bitmask of GPU indices, needs indices < 64.
assert int(KEY_BIT.max()) < 62, int(KEY_BIT.max())
assert s.MAX_GPU_INDEX < 64, s.MAX_GPU_INDEX
# The top-level keys a message must have.
_REQUIRED = sum(1 << int(KEY_BIT[TOP, KEY_NAMES.index(k)]) for k in ("schema", "node", "ts", "seq", "gpus"))
# key_guess slots: one per key id (the key after it), then one per context (its first key).
_GUESS_FIRST = len(KEY_NAMES)
_GUESS_SLOTS = _GUESS_FIRST + N_CONTEXTS

# The contract's limits (global numbers are compile-time constants to numba).
_MAX_STRING = s.MAX_ID_LEN
_MAX_GPUS = s.MAX_GPUS
_MAX_PORTS = s.MAX_PORTS
_MAX_XIDS = s.MAX_XIDS
_MAX_XID = s.MAX_XID
_MAX_PORT_NUMBER = s.MAX_PORT_NUMBER
_MAX_NAME = 253  # a node name: schemas.NAME_RE, ^[A-Za-z0-9][A-Za-z0-9._:-]{0,252}$

# Numbers.
_MAX_EXACT_POW10 = 22  # 10.0**22 is the largest power of ten that is exact in float64
_POW10 = np.array([10.0**k for k in range(_MAX_EXACT_POW10 + 1)])
_EXACT = float(2**53)  # integers up to this are exact in float64
_MAX_DIGITS = 18  # significant digits that always fit the int64 mantissa (10**18 < 2**63)
_EXPONENT_CAP = 10000  # a digit more once past this: left to the other decoder (exp cannot overflow)
# _number's kinds of token
_NO_NUMBER, _INT_TOKEN, _FLOAT_TOKEN = 0, 1, 2
# _literal's values
_FALSE, _TRUE, _NULL = 0, 1, 2
_TRUE_BYTES = np.frombuffer(b"true", dtype=np.uint8).copy()
_FALSE_BYTES = np.frombuffer(b"false", dtype=np.uint8).copy()
_NULL_BYTES = np.frombuffer(b"null", dtype=np.uint8).copy()

# Status of a message (_message, _scan) or of one of its parts (_gpu_list, _net_object, ...).
_OK = 0  # read in full: the message is taken
_BAIL = -1  # the message is left to fast_schema
_FULL_ENTRIES, _FULL_IB, _FULL_XIDS, _FULL_ETH = 1, 2, 3, 4  # an output array is full: retried with more room
_XIDS_FULL = -2  # _gpu_object's end index when xid_entry / xid_code are full

# ib_spans (and eth_spans) columns: (start, end) in buf of an IB port's device, port and state text
# (an Ethernet port's iface and state), -1 absent.
_DEVICE_SPAN, _PORT_SPAN, _STATE_SPAN = 0, 2, 4
_SPAN_COLS = 6

# Bytes, by name (the same code as the literals: numba folds these constants in).
_QUOTE, _BACKSLASH, _COLON, _COMMA = ord('"'), ord("\\"), ord(":"), ord(",")
_OPEN_OBJECT, _CLOSE_OBJECT, _OPEN_ARRAY, _CLOSE_ARRAY = ord("{"), ord("}"), ord("["), ord("]")
_MINUS, _PLUS, _DOT, _LOWER_E, _UPPER_E = ord("-"), ord("+"), ord("."), ord("e"), ord("E")
_ZERO, _NINE = ord("0"), ord("9")
_UPPER_A, _UPPER_Z, _LOWER_A, _LOWER_Z = ord("A"), ord("Z"), ord("a"), ord("z")
_UNDERSCORE = ord("_")
_SPACE, _TAB, _NEWLINE, _RETURN = ord(" "), ord("\t"), ord("\n"), ord("\r")
_ASCII_END = 128  # a plain string byte is in [_SPACE, _ASCII_END): no control, no non-ASCII


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
    parts += [a.tobytes() for a in (KEY_MEANING, KEY_BIT, LO, HI, INTEGER, KEY_SLOTS, KEY_BLOB, KEY_OFFS)]
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


_drop_stale_cache()  # before any compiled function is first called, which is when numba loads it

# ---------------------------------------------------------------- compiled: tokens
# Each takes (buf, i, e) and returns the index after what it read, or -1 (see the reading guide).


@njit(cache=True, inline="always", _nrt=False)
def _skip_space(buf, i, e):  # type: ignore[no-untyped-def]
    """The index of the first byte at or after i that is not JSON whitespace (e if none)."""
    while i < e:
        c = buf[i]
        if c != _SPACE and c != _NEWLINE and c != _RETURN and c != _TAB:
            return i
        i += 1
    return i


@njit(cache=True, _nrt=False)
def _string_end(buf, i, e):  # type: ignore[no-untyped-def]
    """buf[i] is '"': the index after the closing quote, or -1 (escape, control, non-ASCII, open,
    or longer than the longest string the contract allows where the scanner reads strings)."""
    i += 1
    e = min(e, i + _MAX_STRING + 1)  # room for the longest string and its closing quote
    while i < e:
        c = buf[i]
        if c == _QUOTE:
            return i + 1
        if c == _BACKSLASH or c < _SPACE or c >= _ASCII_END:
            return -1
        i += 1
    return -1


@njit(cache=True, _nrt=False, inline="always")
def _spelled(buf, i, e, word):  # type: ignore[no-untyped-def]
    """buf[i:e] begins with the bytes of `word`."""
    if i + len(word) > e:
        return False
    for k in range(len(word)):  # noqa: SIM110 (a loop, not all() over a generator: numba)
        if buf[i + k] != word[k]:
            return False
    return True


@njit(cache=True, _nrt=False)
def _literal(buf, i, e):  # type: ignore[no-untyped-def]
    """true / false / null at buf[i]: (end, _TRUE | _FALSE | _NULL), end -1 if none of them."""
    if _spelled(buf, i, e, _TRUE_BYTES):
        return i + len(_TRUE_BYTES), _TRUE
    if _spelled(buf, i, e, _FALSE_BYTES):
        return i + len(_FALSE_BYTES), _FALSE
    if _spelled(buf, i, e, _NULL_BYTES):
        return i + len(_NULL_BYTES), _NULL
    return -1, _FALSE


@njit(cache=True, _nrt=False)
def _number(buf, i, e):  # type: ignore[no-untyped-def]
    """A JSON number at buf[i]: (end, kind, int value, float value). kind _NO_NUMBER (end -1):
    not JSON's grammar, or a number left to the other decoder; _INT_TOKEN: no fraction or
    exponent, both values set; _FLOAT_TOKEN: a fraction or exponent, the float value only.

    The digits are gathered into one integer mantissa `mant` (fraction digits included, `frac`
    of them), so the value is mant * 10**(exp - frac)."""
    start = i
    neg = False
    if i < e and buf[i] == _MINUS:
        neg = True
        i += 1
    if i >= e or buf[i] < _ZERO or buf[i] > _NINE:
        return -1, _NO_NUMBER, 0, 0.0
    mant = 0
    digits = 0  # significant digits in mant; past _MAX_DIGITS they are not added: `long` is set
    long = False
    # integer part: "0" alone, or digits without a leading zero
    if buf[i] == _ZERO:
        i += 1
        if i < e and _ZERO <= buf[i] <= _NINE:
            return -1, _NO_NUMBER, 0, 0.0  # leading zero
    else:
        while i < e and _ZERO <= buf[i] <= _NINE:
            if digits >= _MAX_DIGITS:
                long = True
            else:
                mant = mant * 10 + (buf[i] - _ZERO)
                digits += 1
            i += 1
    # fraction: "." and at least one digit
    frac = 0
    is_float = False
    if i < e and buf[i] == _DOT:
        is_float = True
        i += 1
        if i >= e or buf[i] < _ZERO or buf[i] > _NINE:
            return -1, _NO_NUMBER, 0, 0.0
        while i < e and _ZERO <= buf[i] <= _NINE:
            if digits >= _MAX_DIGITS:
                long = True
            else:
                mant = mant * 10 + (buf[i] - _ZERO)
                if mant != 0:  # zeros before the first non-zero digit are not significant
                    digits += 1
                frac += 1
            i += 1
    # exponent: "e" or "E", an optional sign, at least one digit
    exp = 0
    if i < e and (buf[i] == _LOWER_E or buf[i] == _UPPER_E):
        is_float = True
        i += 1
        eneg = False
        if i < e and (buf[i] == _PLUS or buf[i] == _MINUS):
            eneg = buf[i] == _MINUS
            i += 1
        if i >= e or buf[i] < _ZERO or buf[i] > _NINE:
            return -1, _NO_NUMBER, 0, 0.0
        while i < e and _ZERO <= buf[i] <= _NINE:
            if exp > _EXPONENT_CAP:
                return -1, _NO_NUMBER, 0, 0.0
            exp = exp * 10 + (buf[i] - _ZERO)
            i += 1
        if eneg:
            exp = -exp
    if not is_float:
        if long:  # an integer beyond 18 digits: left to the other decoder
            return -1, _NO_NUMBER, 0, 0.0
        v = -mant if neg else mant
        return i, _INT_TOKEN, v, float(v)
    p = exp - frac
    if mant == 0:
        f = 0.0
    elif not long and float(mant) <= _EXACT and -_MAX_EXACT_POW10 <= p <= _MAX_EXACT_POW10:
        # both operands exact: one IEEE operation is correctly rounded (Clinger's fast path)
        f = float(mant) * _POW10[p] if p >= 0 else float(mant) / _POW10[-p]
    else:
        if i >= e:
            # The token runs to the message's end: strtod, which reads until a byte cannot
            # continue a number, would read past it (into the next message, or past buf). No
            # valid message ends in a number: left to the other decoder.
            return -1, _NO_NUMBER, 0, 0.0
        # strtod reads the token again from its start and stops at buf[i], inside the message:
        # the grammar was checked above, so that byte cannot continue a number.
        f = _strtod(buf[start:].ctypes, 0)
        if neg:
            f = -f  # strtod read the sign too; undo before the common negation below
    if neg:
        f = -f
    if not math.isfinite(f):
        return -1, _NO_NUMBER, 0, 0.0
    return i, _FLOAT_TOKEN, 0, f


# Every numeric field of a GPU, host or port object (~9 in 10 of a message's values) goes through
# inlined copies of _number, _member_of and _next_or_close (the same code): a call each cost ~25%
# of the scanner's time. They are inlined there only: numba then compiles this in ~1.5 min (~15 s
# with no inlining); at every call site it took ~2 min for ~0.2 us a message more.
_number_inline = njit(cache=True, _nrt=False, inline="always")(_number.py_func)


@njit(cache=True, _nrt=False)
def _name_ok(buf, a, b):  # type: ignore[no-untyped-def]
    """buf[a:b] is a node name, schemas.NAME_RE: ^[A-Za-z0-9][A-Za-z0-9._:-]{0,252}$"""
    if b - a < 1 or b - a > _MAX_NAME:
        return False
    for k in range(a, b):
        c = buf[k]
        if (_ZERO <= c <= _NINE) or (_UPPER_A <= c <= _UPPER_Z) or (_LOWER_A <= c <= _LOWER_Z):
            continue
        if k > a and c in (_DOT, _UNDERSCORE, _COLON, _MINUS):
            continue
        return False
    return True


# ---------------------------------------------------------------- compiled: objects and arrays


@njit(cache=True, _nrt=False)
def _opened(buf, i, e, open_, close):  # type: ignore[no-untyped-def]
    """buf[i] must be `open_` ('{' or '['): (index of the first member or element, or -1; 1 if
    the container is empty, closed at once by `close`)."""
    if i >= e or buf[i] != open_:
        return -1, 0
    i = _skip_space(buf, i + 1, e)
    if i < e and buf[i] == close:
        return i + 1, 1
    return i, 0


@njit(cache=True, _nrt=False)
def _next_or_close(buf, i, e, close):  # type: ignore[no-untyped-def]
    """After a member or element: (index of the next one, 0) after ',', (index after the close,
    1) at the close (`close`: '}' or ']'), (-1, 0) otherwise."""
    i = _skip_space(buf, i, e)
    if i >= e:
        return -1, 0
    if buf[i] == _COMMA:
        return _skip_space(buf, i + 1, e), 0
    if buf[i] == close:
        return i + 1, 1
    return -1, 0


_next_or_close_inline = njit(cache=True, _nrt=False, inline="always")(_next_or_close.py_func)


@njit(cache=True, _nrt=False, inline="always")
def _spells_key(buf, a, kid):  # type: ignore[no-untyped-def]
    """buf[a:] begins with the name of key `kid` (the caller has checked that it is long enough)."""
    start = KEY_OFFS[kid]
    for k in range(KEY_OFFS[kid + 1] - start):  # noqa: SIM110 (as in _spelled)
        if KEY_BLOB[start + k] != buf[a + k]:
            return False
    return True


@njit(cache=True, _nrt=False, inline="always")
def _value_start(buf, j, e):  # type: ignore[no-untyped-def]
    """j is just after a key's closing quote: the index of its value (after ':'), or -1."""
    j = _skip_space(buf, j, e)
    if j >= e or buf[j] != _COLON:
        return -1
    return _skip_space(buf, j + 1, e)


@njit(cache=True, _nrt=False, inline="always")  # called by _member_of only
def _key(buf, i, e, key_guess, prev):  # type: ignore[no-untyped-def]
    """A key at buf[i]: (its id in KEY_NAMES or -1 if the contract does not name it, the index
    of its value or -1 if malformed, when the id means nothing).

    The key that followed `prev` last time (key_guess[prev]) is tried first with one comparison;
    only a miss hashes the key (and updates key_guess). A key that matches a known name byte for
    byte needs no further character checks."""
    if i >= e or buf[i] != _QUOTE:
        return -1, -1
    a = i + 1  # the key's first byte
    guess = key_guess[prev]
    if guess >= 0:
        n = KEY_OFFS[guess + 1] - KEY_OFFS[guess]
        if a + n < e and buf[a + n] == _QUOTE and _spells_key(buf, a, guess):
            return guess, _value_start(buf, a + n + 1, e)
    # a miss: find the closing quote, hashing the key as _hash_py does
    h = 0
    b = a
    while b < e:
        ch = buf[b]
        if ch == _QUOTE:
            break
        if ch == _BACKSLASH or ch < _SPACE or ch >= _ASCII_END:
            return -1, -1
        h = (h * 31 + ch) & 0xFFFFFFFF
        b += 1
    if b >= e:
        return -1, -1
    mask = len(KEY_SLOTS) - 1
    h &= mask
    kid = -1
    while KEY_SLOTS[h] != -1:
        c = KEY_SLOTS[h]
        if KEY_OFFS[c + 1] - KEY_OFFS[c] == b - a and _spells_key(buf, a, c):
            kid = c
            break
        h = (h + 1) & mask
    key_guess[prev] = kid
    return kid, _value_start(buf, b + 1, e)


@njit(cache=True, _nrt=False)
def _member_of(buf, i, e, ctx, key_guess, prev, seen):  # type: ignore[no-untyped-def]
    """The key of a member of a `ctx` object at buf[i]: (what KEY_MEANING says it is; the key to
    predict the next one from; the index of its value, -1 if malformed, not named in `ctx` or a
    key seen before in this object; `seen` with it). An index >= 0 is < e: buf[i] is readable."""
    kid, i = _key(buf, i, e, key_guess, prev)
    if i < 0 or i >= e:
        return UNKNOWN, prev, -1, seen
    if kid < 0 or KEY_MEANING[ctx, kid] == UNKNOWN:  # unnamed here
        return UNKNOWN, prev, -1, seen
    bit = np.int64(1) << KEY_BIT[ctx, kid]
    if seen & bit:  # seen before in this object
        return UNKNOWN, prev, -1, seen
    return KEY_MEANING[ctx, kid], kid, i, seen | bit


_member_of_inline = njit(cache=True, _nrt=False, inline="always")(_member_of.py_func)


@njit(cache=True, _nrt=False, inline="always")
def _numeric(buf, i, e, ctx, col):  # type: ignore[no-untyped-def]
    """A numeric field's value as the contract allows it: (end, value), end -1 if not."""
    j, kind, _iv, fv = _number_inline(buf, i, e)
    if kind == _NO_NUMBER or (INTEGER[ctx, col] and kind != _INT_TOKEN):
        return -1, 0.0
    if not (LO[ctx, col] <= fv <= HI[ctx, col]):
        return -1, 0.0
    return j, fv


@njit(cache=True, _nrt=False)
def _flat_object(buf, i, e, ctx, out, row, spans, key_guess):  # type: ignore[no-untyped-def]
    """A host, IB-port or Ethernet object (no nested objects) at buf[i] ('{'): numbers into
    out[row], an IB port's device / port / state spans (an Ethernet port's iface / state) into
    spans[row] (-1: absent). The index after it, or -1."""
    i, closed = _opened(buf, i, e, _OPEN_OBJECT, _CLOSE_OBJECT)  # the caller saw the '{'
    seen = 0
    prev = _GUESS_FIRST + ctx
    while not closed:
        field, prev, i, seen = _member_of_inline(buf, i, e, ctx, key_guess, prev, seen)
        if i < 0:
            return -1
        if field >= 0:  # a numeric field: `field` is its column
            i, v = _numeric(buf, i, e, ctx, field)
            if i < 0:
                return -1
            out[row, field] = v
        elif field in (STRING, P_DEVICE, P_STATE):
            if buf[i] != _QUOTE:
                return -1
            j = _string_end(buf, i, e)
            if j < 0:
                return -1
            if field == P_DEVICE:  # the text between the quotes
                spans[row, _DEVICE_SPAN] = i + 1
                spans[row, _DEVICE_SPAN + 1] = j - 1
            elif field == P_STATE:
                spans[row, _STATE_SPAN] = i + 1
                spans[row, _STATE_SPAN + 1] = j - 1
            i = j
        elif field == P_PORT:  # a string or an integer; its name is the text either way
            if buf[i] == _QUOTE:
                j = _string_end(buf, i, e)
                if j < 0:
                    return -1
                spans[row, _PORT_SPAN] = i + 1
                spans[row, _PORT_SPAN + 1] = j - 1
            else:
                j, kind, iv, _fv = _number(buf, i, e)
                if kind != _INT_TOKEN or iv < 0 or iv > _MAX_PORT_NUMBER or (iv == 0 and buf[i] == _MINUS):
                    return -1  # (str(-0) is "0", not the text)
                spans[row, _PORT_SPAN] = i
                spans[row, _PORT_SPAN + 1] = j
            i = j
        i, closed = _next_or_close_inline(buf, i, e, _CLOSE_OBJECT)
        if i < 0:
            return -1
    return i


@njit(cache=True, _nrt=False, inline="always")
def _xid_list(buf, i, e, row, xid_entry, xid_code, n_xids):  # type: ignore[no-untyped-def]
    """A GPU's "xids" at buf[i]: each XID into xid_code[n_xids...], with the GPU's entry row in
    xid_entry. (end, or -1, or _XIDS_FULL when the arrays are full; the new n_xids)."""
    if buf[i] != _OPEN_ARRAY:
        return -1, n_xids
    i = _skip_space(buf, i + 1, e)
    if i < e and buf[i] == _CLOSE_ARRAY:
        return i + 1, n_xids
    count = 0
    while True:
        j, kind, iv, _fv = _number(buf, i, e)
        count += 1
        if kind != _INT_TOKEN or iv < 0 or iv > _MAX_XID or count > _MAX_XIDS:
            return -1, n_xids
        if n_xids >= len(xid_code):
            return _XIDS_FULL, n_xids
        xid_entry[n_xids] = row
        xid_code[n_xids] = iv
        n_xids += 1
        i, closed = _next_or_close(buf, j, e, _CLOSE_ARRAY)
        if i < 0 or closed:
            return i, n_xids


@njit(cache=True, _nrt=False)
def _gpu_object(buf, i, e, row, entries, xid_entry, xid_code, n_xids, key_guess):  # type: ignore[no-untyped-def]
    """A GPU object at buf[i] ('{') into entries[row] (NaN-filled by the caller), its XIDs into
    xid_entry / xid_code from n_xids: (end, or -1, or _XIDS_FULL; new n_xids; lost: true; index)."""
    i, closed = _opened(buf, i, e, _OPEN_OBJECT, _CLOSE_OBJECT)  # the caller saw the '{'
    seen = 0
    index = -1
    lost = False
    prev = _GUESS_FIRST + GPU
    while not closed:
        field, prev, i, seen = _member_of_inline(buf, i, e, GPU, key_guess, prev, seen)
        if i < 0:
            return -1, n_xids, lost, index
        if field >= 0:  # a numeric field: `field` is its column (0: the index)
            i, v = _numeric(buf, i, e, GPU, field)
            if i < 0:
                return -1, n_xids, lost, index
            entries[row, field] = v
            if field == 0:
                index = int(v)
        elif field == G_UUID:
            if buf[i] != _QUOTE:
                return -1, n_xids, lost, index
            i = _string_end(buf, i, e)
            if i < 0:
                return -1, n_xids, lost, index
        elif field == G_XIDS:
            i, n_xids = _xid_list(buf, i, e, row, xid_entry, xid_code, n_xids)
            if i < 0:  # -1, or _XIDS_FULL
                return i, n_xids, lost, index
        elif field == G_LOST:  # only `true` says lost; other literals say nothing, anything else bails
            i, word = _literal(buf, i, e)
            if i < 0:
                return -1, n_xids, lost, index
            lost = word == _TRUE
        i, closed = _next_or_close_inline(buf, i, e, _CLOSE_OBJECT)
        if i < 0:
            return -1, n_xids, lost, index
    if index < 0:  # required
        return -1, n_xids, lost, index
    return i, n_xids, lost, index


@njit(cache=True, _nrt=False)
def _gpu_list(  # type: ignore[no-untyped-def]
    buf, i, e, row, n_entries, n_xids,
    entries, entry_lost, entry_msg, xid_entry, xid_code, key_guess,
):  # fmt: skip
    """The "gpus" array at buf[i] of message row `row`: one entry row per GPU from n_entries,
    their XIDs from n_xids. (status: _OK, _BAIL, _FULL_ENTRIES or _FULL_XIDS; the index after the
    array; the new n_entries, n_xids)."""
    i, empty = _opened(buf, i, e, _OPEN_ARRAY, _CLOSE_ARRAY)
    if i < 0:
        return _BAIL, -1, n_entries, n_xids
    count = 0
    gpu_seen = 0  # bitmask of the GPU indices read: an index twice is left to the other decoder
    while not empty:
        if i >= e or buf[i] != _OPEN_OBJECT:
            return _BAIL, -1, n_entries, n_xids
        count += 1
        if count > _MAX_GPUS:
            return _BAIL, -1, n_entries, n_xids
        if n_entries >= entries.shape[0]:
            return _FULL_ENTRIES, -1, n_entries, n_xids
        for k in range(entries.shape[1]):
            entries[n_entries, k] = np.nan  # absent fields stay NaN
        i, n_xids, lost, index = _gpu_object(
            buf, i, e, n_entries, entries, xid_entry, xid_code, n_xids, key_guess
        )
        if i == _XIDS_FULL:
            return _FULL_XIDS, -1, n_entries, n_xids
        if i < 0 or gpu_seen & (1 << index):
            return _BAIL, -1, n_entries, n_xids
        gpu_seen |= 1 << index
        entry_lost[n_entries] = lost
        entry_msg[n_entries] = row
        n_entries += 1
        i, empty = _next_or_close(buf, i, e, _CLOSE_ARRAY)
        if i < 0:
            return _BAIL, -1, n_entries, n_xids
    return _OK, i, n_entries, n_xids


@njit(cache=True, _nrt=False)
def _port_list(buf, i, e, ctx, row, n, out, spans, msg, key_guess):  # type: ignore[no-untyped-def]
    """An "ib" (ctx IB) or "eth" (ctx ETH) array at buf[i] of message row `row`: each port gets
    rows of out and spans from n, and msg[its row] = row. (status: _OK, _BAIL, or _FULL_IB /
    _FULL_ETH when out is full; the index after the array; the new n)."""
    i, empty = _opened(buf, i, e, _OPEN_ARRAY, _CLOSE_ARRAY)
    if i < 0:
        return _BAIL, -1, n
    count = 0
    while not empty:
        if i >= e or buf[i] != _OPEN_OBJECT:
            return _BAIL, -1, n
        count += 1
        if count > _MAX_PORTS:
            return _BAIL, -1, n
        if n >= out.shape[0]:
            return (_FULL_IB if ctx == IB else _FULL_ETH), -1, n
        for k in range(out.shape[1]):
            out[n, k] = np.nan  # absent fields stay NaN
        for k in range(_SPAN_COLS):
            spans[n, k] = -1  # absent texts
        i = _flat_object(buf, i, e, ctx, out, n, spans, key_guess)
        if i < 0:
            return _BAIL, -1, n
        msg[n] = row
        n += 1
        i, empty = _next_or_close(buf, i, e, _CLOSE_ARRAY)
        if i < 0:
            return _BAIL, -1, n
    return _OK, i, n


@njit(cache=True, _nrt=False)
def _net_object(  # type: ignore[no-untyped-def]
    buf, i, e, row, n_ib, n_eth, ib, ib_spans, ib_msg, eth, eth_spans, eth_msg, key_guess
):  # fmt: skip
    """The "net" object at buf[i]: its "ib" and "eth" arrays (_port_list). (status: _OK, _BAIL,
    _FULL_IB or _FULL_ETH; the index after the object; the new n_ib, n_eth)."""
    i, closed = _opened(buf, i, e, _OPEN_OBJECT, _CLOSE_OBJECT)
    if i < 0:
        return _BAIL, -1, n_ib, n_eth
    seen = 0
    prev = _GUESS_FIRST + NET
    while not closed:
        field, prev, i, seen = _member_of(buf, i, e, NET, key_guess, prev, seen)
        if i < 0:
            return _BAIL, -1, n_ib, n_eth
        if field == N_IB:
            status, i, n_ib = _port_list(buf, i, e, IB, row, n_ib, ib, ib_spans, ib_msg, key_guess)
        else:  # N_ETH (the only other key NET names)
            status, i, n_eth = _port_list(buf, i, e, ETH, row, n_eth, eth, eth_spans, eth_msg, key_guess)
        if status != _OK:
            return status, -1, n_ib, n_eth
        i, closed = _next_or_close(buf, i, e, _CLOSE_OBJECT)
        if i < 0:
            return _BAIL, -1, n_ib, n_eth
    return _OK, i, n_ib, n_eth


@njit(cache=True, _nrt=False)
def _fnv1a(buf, a, b):  # type: ignore[no-untyped-def]
    """detectors.batch.instance_code of the ASCII text buf[a:b] (FNV-1a 64 as int64; 0 for "",
    which means "not given", and 1 for a text whose hash is 0)."""
    if b <= a:
        return 0
    h = np.uint64(0xCBF29CE484222325)
    for k in range(a, b):
        h = (h ^ np.uint64(buf[k])) * np.uint64(0x100000001B3)  # uint64 arithmetic wraps
    code = np.int64(h)
    return code if code != 0 else 1


@njit(cache=True, _nrt=False)
def _agent_object(buf, i, e, row, instance, key_guess):  # type: ignore[no-untyped-def]
    """The "agent" object at buf[i], checked; its instance (the id that numbers `seq`) is kept
    as instance[row], by its code. The index after it, or -1."""
    i, closed = _opened(buf, i, e, _OPEN_OBJECT, _CLOSE_OBJECT)
    if i < 0:
        return -1
    seen = 0
    prev = _GUESS_FIRST + AGENT
    while not closed:
        field, prev, i, seen = _member_of(buf, i, e, AGENT, key_guess, prev, seen)
        if i < 0:
            return -1
        if field in (STRING, A_INSTANCE):  # the agent's version, or its instance
            if buf[i] != _QUOTE:
                return -1
            j = _string_end(buf, i, e)
            if j >= 0 and field == A_INSTANCE:
                instance[row] = _fnv1a(buf, i + 1, j - 1)
            i = j
        else:  # source_errors: empty, or left to the other decoder (its keys are free-form,
            # so only a decoder that can compare them finds a duplicate)
            i, empty = _opened(buf, i, e, _OPEN_OBJECT, _CLOSE_OBJECT)
            if i >= 0 and not empty:
                i = -1
        if i < 0:
            return -1
        i, closed = _next_or_close(buf, i, e, _CLOSE_OBJECT)
        if i < 0:
            return -1
    return i


@njit(cache=True, _nrt=False)
def _message(  # type: ignore[no-untyped-def]
    buf, i, e, row, n_entries, n_xids, n_ib, n_eth,
    node_span, ts, seq, instance, host, entries, entry_lost, entry_msg, xid_entry, xid_code, ib, ib_spans,
    ib_msg, eth, eth_spans, eth_msg, key_guess,
):  # fmt: skip
    """One message buf[i:e] as row `row`, its GPU entries from n_entries, XIDs from n_xids, IB
    ports from n_ib, Ethernet ports from n_eth: (status: _OK, _BAIL or _FULL_*; the new n_entries,
    n_xids, n_ib, n_eth, which mean something for _OK only)."""
    at_entries, at_xids, at_ib, at_eth = n_entries, n_xids, n_ib, n_eth  # returned unchanged unless _OK
    i, closed = _opened(buf, _skip_space(buf, i, e), e, _OPEN_OBJECT, _CLOSE_OBJECT)
    if i < 0:
        return _BAIL, at_entries, at_xids, at_ib, at_eth
    for k in range(host.shape[1]):
        host[row, k] = np.nan  # absent fields stay NaN
    instance[row] = 0  # not given
    seen = 0
    prev = _GUESS_FIRST + TOP
    while not closed:
        field, prev, i, seen = _member_of(buf, i, e, TOP, key_guess, prev, seen)
        if i < 0:
            return _BAIL, at_entries, at_xids, at_ib, at_eth
        if field in (T_SCHEMA, T_NODE):
            if buf[i] != _QUOTE:
                return _BAIL, at_entries, at_xids, at_ib, at_eth
            j = _string_end(buf, i, e)
            if j < 0:
                return _BAIL, at_entries, at_xids, at_ib, at_eth
            a, b = i + 1, j - 1  # the text between the quotes
            if field == T_NODE:
                if not _name_ok(buf, a, b):
                    return _BAIL, at_entries, at_xids, at_ib, at_eth
                node_span[row, 0] = a
                node_span[row, 1] = b
            elif b - a != len(SCHEMA_BYTES) or not _spelled(buf, a, b, SCHEMA_BYTES):
                return _BAIL, at_entries, at_xids, at_ib, at_eth
            i = j
        elif field in (T_TS, T_SEQ):
            j, kind, iv, fv = _number(buf, i, e)
            if kind == _NO_NUMBER or fv < 0.0 or (field == T_SEQ and kind != _INT_TOKEN):
                return _BAIL, at_entries, at_xids, at_ib, at_eth
            if field == T_TS:
                ts[row] = fv
            else:
                seq[row] = iv
            i = j
        elif field == T_GPUS:
            status, i, n_entries, n_xids = _gpu_list(
                buf, i, e, row, n_entries, n_xids,
                entries, entry_lost, entry_msg, xid_entry, xid_code, key_guess,
            )  # fmt: skip
            if status != _OK:
                return status, at_entries, at_xids, at_ib, at_eth
        elif field == T_HOST:
            if buf[i] != _OPEN_OBJECT:
                return _BAIL, at_entries, at_xids, at_ib, at_eth
            # (the host object has no span fields: ib_spans is not written)
            i = _flat_object(buf, i, e, HOST, host, row, ib_spans, key_guess)
            if i < 0:
                return _BAIL, at_entries, at_xids, at_ib, at_eth
        elif field == T_NET:
            status, i, n_ib, n_eth = _net_object(
                buf, i, e, row, n_ib, n_eth, ib, ib_spans, ib_msg, eth, eth_spans, eth_msg, key_guess
            )
            if status != _OK:
                return status, at_entries, at_xids, at_ib, at_eth
        elif field == T_AGENT:
            i = _agent_object(buf, i, e, row, instance, key_guess)
            if i < 0:
                return _BAIL, at_entries, at_xids, at_ib, at_eth
        i, closed = _next_or_close(buf, i, e, _CLOSE_OBJECT)
        if i < 0:
            return _BAIL, at_entries, at_xids, at_ib, at_eth
    if _skip_space(buf, i, e) != e:  # only whitespace may follow the object
        return _BAIL, at_entries, at_xids, at_ib, at_eth
    if seen & _REQUIRED != _REQUIRED:
        return _BAIL, at_entries, at_xids, at_ib, at_eth
    return _OK, n_entries, n_xids, n_ib, n_eth


@njit(cache=True, _nrt=False, nogil=True)
def _scan(  # type: ignore[no-untyped-def]
    buf, starts, ends,
    taken, node_span, ts, seq, instance, host, entries, entry_lost, entry_msg, xid_entry, xid_code, ib,
    ib_spans, ib_msg, eth, eth_spans, eth_msg, key_guess,
):  # fmt: skip
    """Every message buf[starts[k]:ends[k]]: taken ones get consecutive rows (taken[row] = k); a
    left one gets none (the next message writes over whatever it wrote). Returns (status: _OK, or
    _FULL_* to be retried with more room; rows, GPU entries, XIDs, IB ports, Ethernet ports)."""
    row = n_entries = n_xids = n_ib = n_eth = 0
    for k in range(len(starts)):
        status, next_entries, next_xids, next_ib, next_eth = _message(
            buf, starts[k], ends[k], row, n_entries, n_xids, n_ib, n_eth,
            node_span, ts, seq, instance, host, entries, entry_lost, entry_msg, xid_entry, xid_code, ib,
            ib_spans, ib_msg, eth, eth_spans, eth_msg, key_guess,
        )  # fmt: skip
        if status == _OK:
            taken[row] = k
            row += 1
            n_entries, n_xids, n_ib, n_eth = next_entries, next_xids, next_ib, next_eth
        elif status != _BAIL:
            return status, row, n_entries, n_xids, n_ib, n_eth
    return _OK, row, n_entries, n_xids, n_ib, n_eth


# ---------------------------------------------------------------- compiled: after the scan


# _intern's hash: a polynomial in a base drawn per process, modulo a prime. With a base anyone knows
# (31, as first written) equal-length collisions are made offline ("Aa" and "BB", and every mix of
# such pairs: 2**k names of one hash), and each name interned probed all those before it: 65,536
# crafted Ethernet interfaces in a 3.8 MB batch took 9.7 s. Two given names of length L collide
# under a random base with probability at most L / _HASH_PRIME. The base is an argument, not a
# global: numba compiles a global in as a constant, and caches it.
_HASH_PRIME = (1 << 31) - 1  # a product of two residues stays within int64
HASH_BASE = 1024 + secrets.randbelow(_HASH_PRIME - 1024)  # above every byte and the separator 256


@njit(cache=True, _nrt=False)
def _span_hash(buf, spans, k, base):  # type: ignore[no-untyped-def]
    """The hash of spans[k] (as in _intern) under `base`: the text buf[a0:b0], a separator (256, no
    byte's value: "ab"+"c" and "a"+"bc" differ), then buf[a1:b1]; 7 for an absent value."""
    h = 7
    if spans[k, 0] >= 0:
        for j in range(spans[k, 0], spans[k, 1]):
            h = (h * base + buf[j] + 1) % _HASH_PRIME
        h = (h * base + 257) % _HASH_PRIME
        for j in range(spans[k, 2], spans[k, 3]):
            h = (h * base + buf[j] + 1) % _HASH_PRIME
    return h


@njit(cache=True, nogil=True)
def _intern(buf, spans, base):  # type: ignore[no-untyped-def]
    """Distinct values of byte-span pairs spans[k] = (a0, b0, a1, b1), the text buf[a0:b0] then
    buf[a1:b1] (a0 = -1: absent, a value of its own): (code of each, in order of first appearance;
    the first k of each code). `base`: HASH_BASE (the codes do not depend on it)."""
    n = spans.shape[0]
    size = 16
    while size < 2 * n:  # an open-addressing table at most half full
        size *= 2
    slots = np.full(size, -1, dtype=np.int64)  # slot -> code, -1 empty
    codes = np.empty(n, dtype=np.int64)
    reps = np.empty(n, dtype=np.int64)
    nrep = 0
    for k in range(n):
        h = _span_hash(buf, spans, k, base) & (size - 1)
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
    """spans[p] and spans[q] (as in _intern) are the same value: both absent, or the same text in
    each of the two parts."""
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
            out[j] = _NEWLINE
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
    instance: np.ndarray  # (M,) agent.instance's code (detectors.batch.instance_code), 0: not given
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
    eth_msg: np.ndarray  # (Q,) row of each Ethernet port, rows ascending
    eth: np.ndarray  # (Q, len(ETH_COLUMNS)), NaN absent
    eth_iface_names: list[str]  # distinct iface names ("" where absent)
    eth_iface_idx: np.ndarray  # (Q,)
    eth_state_names: list[str | None]  # distinct operstates as reported, None: not reported
    eth_state_idx: np.ndarray  # (Q,)


def scan(raws: list[bytes]) -> Scan:
    """Scan raw telemetry/1 messages; those not in `taken` are left to fast_schema."""
    lens = np.fromiter(map(len, raws), dtype=np.int64, count=len(raws))
    ends = np.cumsum(lens)
    return scan_spans(np.frombuffer(b"".join(raws), dtype=np.uint8), ends - lens, ends)


def scan_spans(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> Scan:
    """scan() of the messages buf[starts[k]:ends[k]] (buf: read-only uint8, the flavour numba's
    cached build takes; starts and ends: int64). `taken` indexes these spans."""
    n = len(starts)
    # First guess of room: 8 GPU entries and 8 IB ports a message (a typical node), one XID, and
    # 4 Ethernet ports.
    room_entries, room_ib, room_xids, room_eth = 8 * n + 16, 8 * n + 16, n + 16, 4 * n + 16
    while True:
        taken = np.empty(n, dtype=np.int64)
        node_span = np.empty((n, 2), dtype=np.int64)
        ts = np.empty(n)
        seq = np.empty(n, dtype=np.int64)
        instance = np.empty(n, dtype=np.int64)
        host = np.empty((n, len(HOST_COLUMNS)))
        entries = np.empty((room_entries, len(GPU_COLUMNS)))
        entry_lost = np.empty(room_entries, dtype=np.bool_)
        entry_msg = np.empty(room_entries, dtype=np.int64)
        xid_entry = np.empty(room_xids, dtype=np.int64)
        xid_code = np.empty(room_xids, dtype=np.int64)
        ib = np.empty((room_ib, len(IB_COLUMNS)))
        ib_spans = np.empty((room_ib, _SPAN_COLS), dtype=np.int64)
        ib_msg = np.empty(room_ib, dtype=np.int64)
        eth = np.empty((room_eth, len(ETH_COLUMNS)))
        eth_spans = np.empty((room_eth, _SPAN_COLS), dtype=np.int64)
        eth_msg = np.empty(room_eth, dtype=np.int64)
        key_guess = np.full(_GUESS_SLOTS, -1, dtype=np.int64)
        status, m, n_entries, n_xids, n_ib, n_eth = _scan(
            buf, starts, ends, taken,
            node_span, ts, seq, instance, host, entries, entry_lost, entry_msg, xid_entry, xid_code, ib,
            ib_spans, ib_msg, eth, eth_spans, eth_msg, key_guess,
        )  # fmt: skip
        if status == _OK:
            break
        # an output array was too small for this batch (GPU-dense nodes, XID storms): more room
        room_entries *= 4 if status == _FULL_ENTRIES else 1
        room_ib *= 4 if status == _FULL_IB else 1
        room_xids *= 4 if status == _FULL_XIDS else 1
        room_eth *= 4 if status == _FULL_ETH else 1
    # node names: spans with an empty second part, for _intern's pairs
    node_codes, node_reps = _intern(
        buf, np.concatenate([node_span[:m], np.zeros((m, 2), np.int64)], axis=1), HASH_BASE
    )
    spans = ib_spans[:n_ib]
    key_spans = np.where(spans[:, :4] < 0, 0, spans[:, :4])  # device, port; an absent one is ""
    key_codes, key_reps = _intern(buf, key_spans, HASH_BASE)
    state_spans = np.concatenate([spans[:, 4:6], np.zeros((n_ib, 2), np.int64)], axis=1)  # absent: None
    state_codes, state_reps = _intern(buf, state_spans, HASH_BASE)
    espans = eth_spans[:n_eth]
    none = np.zeros((n_eth, 2), np.int64)
    iface_codes, iface_reps = _intern(
        buf, np.concatenate([np.maximum(espans[:, :2], 0), none], axis=1), HASH_BASE
    )
    estate_codes, estate_reps = _intern(
        buf, np.concatenate([espans[:, 4:6], none], axis=1), HASH_BASE
    )  # absent: None

    def text(a: int, b: int) -> str:
        return buf[a:b].tobytes().decode("ascii")

    # a node name is 1-253 of [A-Za-z0-9._:-] (_name_ok): never empty, never a newline
    node_names = _joined(buf, node_span[node_reps]).tobytes().decode("ascii").split("\n") if m else []

    return Scan(
        taken=taken[:m],
        node_names=node_names,
        node_idx=node_codes,
        ts=ts[:m],
        seq=seq[:m],
        instance=instance[:m],
        host=host[:m],
        entry_msg=entry_msg[:n_entries],
        entries=entries[:n_entries],
        entry_lost=entry_lost[:n_entries],
        xid_entry=xid_entry[:n_xids],
        xid_code=xid_code[:n_xids],
        ib_msg=ib_msg[:n_ib],
        ib=ib[:n_ib],
        ib_key_names=[f"{text(*key_spans[r, :2])}/{text(*key_spans[r, 2:])}" for r in key_reps.tolist()],
        ib_key_idx=key_codes,
        ib_state_names=[None if spans[r, 4] < 0 else text(*spans[r, 4:6]) for r in state_reps.tolist()],
        ib_state_idx=state_codes,
        eth_msg=eth_msg[:n_eth],
        eth=eth[:n_eth],
        eth_iface_names=[text(*np.maximum(espans[r, :2], 0)) for r in iface_reps.tolist()],
        eth_iface_idx=iface_codes,
        eth_state_names=[None if espans[r, 4] < 0 else text(*espans[r, 4:6]) for r in estate_reps.tolist()],
        eth_state_idx=estate_codes,
    )


def warm_up() -> None:
    """Load the compiled scanner from numba's cache, compiling it first if there is none (~1.5 min)."""
    scan([b'{"schema":"telemetry/1","node":"n","ts":0,"seq":0,"gpus":[]}'])
