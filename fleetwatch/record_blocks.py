"""A worker's fetched records as one block of spans, parsed by a compiled pass, not record by record.

kafka-python turns each record of a fetch into a Python object (~7 us a 5 KB record, a third of
what a detect worker spends on it: benchmarks/README.md). The worker needs only each record's
offset and value, and its telemetry scanner reads values straight from a byte buffer. So for the
worker's consumer, install() swaps in a partition reader that checks every batch's CRC-32C (in C,
as kafka-python does) and returns the fetched bytes with (offset, value start, value end) arrays:
a RecordBlock. kafka-python still does everything else (connections, fetch sessions, the group,
positions, leader epochs, commits).

Only plain data is read this way: message-format v2 batches, uncompressed, not control batches,
without record headers, at isolation level read_uncommitted, with no deserializers. From the
first batch that is anything else or does not parse (a bad CRC, a truncated record) to the end
of the fetch, kafka-python's own reader reads on, returning ConsumerRecords or raising its usual
error; gather() turns what poll() returns for a partition into one block.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from kafka.consumer.fetcher import Fetcher, IsolationLevel
from kafka.record.memory_records import MemoryRecords
from kafka.record.util import calc_crc32c
from numba import njit

log = logging.getLogger(__name__)

_HEADER = 61  # bytes of a v2 batch header: base offset .. record count
_CRC_FROM = 21  # the CRC covers the batch from its attributes on
_LOG_APPEND_TIME = 1  # a record's timestamp type (ConsumerRecord.timestamp_type); attribute bit 0x08


@dataclass(frozen=True, slots=True, eq=False)
class RecordBlock:
    """Records of one partition in offset order: record k's value is buf[starts[k]:ends[k]]
    (starts[k] = -1: a null value, a tombstone), its key buf[key_starts[k]:key_ends[k]] (-1: no
    key), append_ms[k] the time the broker appended it in ms where the topic keeps LogAppendTime
    (-1 where it keeps the producer's CreateTime, which says nothing the producer does not). buf is
    read-only."""

    buf: np.ndarray  # uint8
    offsets: np.ndarray  # int64
    starts: np.ndarray  # int64
    ends: np.ndarray  # int64
    key_starts: np.ndarray  # int64
    key_ends: np.ndarray  # int64
    append_ms: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.offsets)

    def value(self, k: int) -> bytes | None:
        a = int(self.starts[k])
        return None if a < 0 else self.buf[a : int(self.ends[k])].tobytes()

    def values(self) -> list[bytes | None]:
        return [self.value(k) for k in range(len(self))]

    def key(self, k: int) -> bytes | None:
        a = int(self.key_starts[k])
        return None if a < 0 else self.buf[a : int(self.key_ends[k])].tobytes()

    def keys(self) -> list[bytes | None]:
        return [self.key(k) for k in range(len(self))]

    def reference_times(self, now: float) -> np.ndarray:
        """Each record's reference time for clock checks, in seconds: when the broker appended it,
        or `now` (the reader's clock) where the topic does not keep append times."""
        return np.where(self.append_ms >= 0, self.append_ms / 1000.0, now)

    def subset(self, rows: Sequence[int] | np.ndarray) -> RecordBlock:
        """The records at these positions, in the order given, over the same buffer."""
        rows = np.asarray(rows, dtype=np.int64)
        cols = (self.offsets, self.starts, self.ends, self.key_starts, self.key_ends, self.append_ms)
        return RecordBlock(self.buf, *(c[rows] for c in cols))

    def split(self, k: int) -> tuple[RecordBlock, RecordBlock]:
        """(the first k records, the rest), both over the same buffer."""
        cols = (self.offsets, self.starts, self.ends, self.key_starts, self.key_ends, self.append_ms)
        return RecordBlock(self.buf, *(c[:k] for c in cols)), RecordBlock(self.buf, *(c[k:] for c in cols))

    @classmethod
    def from_values(
        cls,
        values: Sequence[bytes | None],
        offsets: Sequence[int] | None = None,
        keys: Sequence[bytes | None] | None = None,
        append_ms: Sequence[int] | None = None,
    ) -> RecordBlock:
        """A block holding copies of `values` (offsets 0.. unless given; no keys and no append
        times unless given)."""
        n = len(values)
        keys = [None] * n if keys is None else keys
        parts = [*values, *keys]
        lens = np.fromiter((-1 if v is None else len(v) for v in parts), dtype=np.int64, count=2 * n)
        ends = np.cumsum(np.maximum(lens, 0))
        starts = np.where(lens < 0, -1, ends - np.maximum(lens, 0))
        buf = _read_only(np.frombuffer(b"".join(v for v in parts if v is not None), dtype=np.uint8))
        return cls(
            buf,
            np.arange(n, dtype=np.int64) if offsets is None else np.asarray(offsets, dtype=np.int64),
            starts[:n],
            ends[:n],
            starts[n:],
            ends[n:],
            np.full(n, -1, dtype=np.int64) if append_ms is None else np.asarray(append_ms, dtype=np.int64),
        )


def _read_only(a: np.ndarray) -> np.ndarray:
    # numba compiles one copy of a kernel per array flavour: every block is read-only, so the
    # scanner's cached read-only build serves them all (a writable one would be a ~1.5 min compile).
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


def gather(items: Sequence[Any]) -> RecordBlock:
    """One block from what poll() returned for a partition: RecordBlocks, kafka-python
    ConsumerRecords (a fetch its own reader took), or a mix, in order."""
    if len(items) == 1 and type(items[0]) is RecordBlock:
        return items[0]
    values: list[bytes | None] = []
    keys: list[bytes | None] = []
    offsets: list[int] = []
    append_ms: list[int] = []
    for item in items:
        if type(item) is RecordBlock:
            values += item.values()
            keys += item.keys()
            offsets += item.offsets.tolist()
            append_ms += item.append_ms.tolist()
        else:
            values.append(item.value)
            keys.append(item.key)
            offsets.append(item.offset)
            append_ms.append(item.timestamp if item.timestamp_type == _LOG_APPEND_TIME else -1)
    return RecordBlock.from_values(values, offsets, keys, append_ms)


# ---------------------------------------------------------------- the compiled reader


@njit(cache=True, nogil=True)
def _varint(buf, pos, end):  # type: ignore[no-untyped-def]
    """Kafka's zig-zag varint at buf[pos:end]: (value, next pos); next pos -1 when it runs past end
    or past 64 bits."""
    shift = 0
    raw = 0
    while pos < end and shift < 70:
        b = buf[pos]
        pos += 1
        if shift == 63 and b > 1:  # past 64 bits (kafka-python reads these as Python ints)
            return 0, -1
        raw |= (np.int64(b) & 0x7F) << shift
        if b < 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7
    return 0, -1


@njit(cache=True, nogil=True)
def _be(buf, pos, size):  # type: ignore[no-untyped-def]
    """The signed big-endian integer of `size` bytes at buf[pos]."""
    v = np.int64(0)
    for j in range(size):
        v = (v << 8) | np.int64(buf[pos + j])
    bits = 8 * size
    if bits < 64 and v >= (np.int64(1) << (bits - 1)):
        v -= np.int64(1) << bits
    return v


@njit(cache=True, nogil=True)
def _parse(buf, fetch_offset):  # type: ignore[no-untyped-def]
    """The leading run of plain batches in buf that parse (CRCs aside): up to the first batch that
    is not plain (v2, uncompressed, not control, no record headers), does not parse, or is not
    complete (a fetch may end in part of one). Returns (offsets, value starts, value ends, key
    starts, key ends, append times (ms, -1 for CreateTime batches) of its records; one row per
    batch: stored CRC, CRC span from, to (the batch's end), next fetch offset, leader epoch, index
    of its first record)."""
    n = len(buf)
    # pass 1: the complete batches that may be plain, and the records they declare
    nb = 0
    total = 0
    pos = 0
    while n - pos >= 12:
        size = 12 + _be(buf, pos + 8, 4)
        if size > n - pos or size < _HEADER or buf[pos + 16] != 2:
            break
        attributes = _be(buf, pos + 21, 2)
        count = _be(buf, pos + 57, 4)
        if attributes & 0x07 or attributes & 0x20 or count < 0:  # compressed, control, corrupt
            break
        total += count
        nb += 1
        pos += size
    offsets = np.empty(total, dtype=np.int64)
    starts = np.empty(total, dtype=np.int64)
    ends = np.empty(total, dtype=np.int64)
    key_starts = np.empty(total, dtype=np.int64)
    key_ends = np.empty(total, dtype=np.int64)
    append_ms = np.empty(total, dtype=np.int64)
    table = np.empty((nb, 6), dtype=np.int64)
    m = 0
    pos = 0
    for b in range(nb):
        end = pos + 12 + _be(buf, pos + 8, 4)
        base = _be(buf, pos, 8)
        # LogAppendTime (attribute bit 0x08): every record's time is the batch's max timestamp,
        # which the broker set when it appended the batch (as kafka-python reads it)
        appended = _be(buf, pos + 35, 8) if _be(buf, pos + 21, 2) & 0x08 else -1
        first = m
        p = pos + _HEADER
        for _ in range(_be(buf, pos + 57, 4)):
            length, p = _varint(buf, p, end)
            if p < 0 or length < 0 or length > end - p:
                p = -1
                break
            rec_end = p + length
            _attrs, p = _varint(buf, p, rec_end)
            if p < 0:
                break
            _ts_delta, p = _varint(buf, p, rec_end)
            if p < 0:
                break
            offset_delta, p = _varint(buf, p, rec_end)
            if p < 0:
                break
            key_len, p = _varint(buf, p, rec_end)
            if p < 0 or key_len > rec_end - p:
                p = -1
                break
            key_at = p if key_len >= 0 else -1
            if key_len > 0:
                p += key_len
            key_end = p
            value_len, p = _varint(buf, p, rec_end)
            if p < 0 or value_len > rec_end - p:
                p = -1
                break
            value_at = p if value_len >= 0 else -1
            if value_len > 0:
                p += value_len
            value_end = p
            # headers are left to kafka-python, which also checks that their keys are UTF-8
            headers, p = _varint(buf, p, rec_end)
            if p != rec_end or headers != 0:
                p = -1
                break
            offset = base + offset_delta
            # A fetch starts at the batch holding its offset: records before it are skipped, up to
            # the first one kept (as kafka-python's reader skips them: itertools.dropwhile).
            if m or offset >= fetch_offset:
                offsets[m] = offset
                starts[m] = value_at
                ends[m] = value_end
                key_starts[m] = key_at
                key_ends[m] = key_end
                append_ms[m] = appended
                m += 1
        if p != end:  # this batch and what follows are left to kafka-python
            return (
                offsets[:first],
                starts[:first],
                ends[:first],
                key_starts[:first],
                key_ends[:first],
                append_ms[:first],
                table[:b],
            )
        table[b, 0] = _be(buf, pos + 17, 4) & 0xFFFFFFFF
        table[b, 1] = pos + _CRC_FROM
        table[b, 2] = end
        table[b, 3] = base + _be(buf, pos + 23, 4) + 1
        table[b, 4] = _be(buf, pos + 12, 4)
        table[b, 5] = first
        pos = end
    return offsets[:m], starts[:m], ends[:m], key_starts[:m], key_ends[:m], append_ms[:m], table


@dataclass(frozen=True, slots=True)
class ParsedFetch:
    """The records parse_fetch() read, and where kafka-python's reader takes over."""

    block: RecordBlock
    read_to: int  # bytes of the fetch read (0: none; kafka-python's reader has all of it)
    next_offset: int  # the next fetch offset after them (-1: no batch read)
    leader_epoch: int  # of the last batch read (-1: none)


def parse_fetch(data: bytes | memoryview, fetch_offset: int, check_crcs: bool = True) -> ParsedFetch:
    """Read the leading plain batches of a fetch's records (see _parse), each batch's CRC checked
    first where `check_crcs` (the batch that fails, and the rest, are left to kafka-python's
    reader, which raises CorruptRecordError for it)."""
    buf = _read_only(np.frombuffer(data, dtype=np.uint8))
    *columns, table = _parse(buf, fetch_offset)
    nb = len(table)
    if check_crcs:
        view = memoryview(data).cast("B")
        for b, (stored, a, z) in enumerate(table[:, :3].tolist()):
            if calc_crc32c(view[a:z]) != stored:
                nb = b
                break
    if nb == 0:
        return ParsedFetch(RecordBlock(buf, *(c[:0] for c in columns)), 0, -1, -1)
    m = len(columns[0]) if nb == len(table) else int(table[nb, 5])
    _crc, _from, read_to, next_offset, epoch, _first = table[nb - 1].tolist()
    return ParsedFetch(RecordBlock(buf, *(c[:m] for c in columns)), read_to, next_offset, epoch)


class _Taken(list):  # type: ignore[type-arg]
    """What a reader's take() returns: blocks and records, whose len() is the number of records.
    kafka-python's fetcher counts poll()'s max_records with len(), so a block counts as the
    records it holds and poll() returns no more records than max_records, as before."""

    records = 0

    def add(self, item: Any) -> None:
        self.append(item)
        self.records += len(item) if type(item) is RecordBlock else 1

    def __len__(self) -> int:
        return self.records


class _BlockPartitionRecords(Fetcher.PartitionRecords):  # type: ignore[misc]
    """kafka-python's reader of one fetched partition, returning one RecordBlock for plain data."""

    _rest: RecordBlock | None = None  # the part of a block that a take() had no room for
    _after_rest = -1  # the next fetch offset once the rest is taken

    def _maybe_skip_record(self, record: Any) -> bool:
        # a block holds no record before the fetch offset (_parse skips them)
        return type(record) is not RecordBlock and super()._maybe_skip_record(record)

    def take(self, n: int | None = None) -> _Taken:
        """At most n records (all, for None), as blocks and records; a block larger than the room
        left is split, and the next fetch offset is then the one after the last record taken."""
        self._maybe_raise_next_inline_exception()
        taken = _Taken()
        limit = sys.maxsize if n is None else n
        try:
            while taken.records < limit:
                if self._rest is not None:
                    item, self._rest = self._rest, None
                    self.next_fetch_offset = self._after_rest
                elif self.record_iterator is None:
                    break
                else:
                    item = next(self.record_iterator, None)
                    if item is None:
                        break
                room = limit - taken.records
                if type(item) is RecordBlock and len(item) > room:
                    self._after_rest = self.next_fetch_offset
                    item, self._rest = item.split(room)
                    self.next_fetch_offset = int(item.offsets[-1]) + 1
                taken.add(item)
        except Exception as e:  # as kafka-python's take(): raised now, or after what was taken
            if not taken:
                raise
            self._next_inline_exception = e
        return taken

    def drain(self) -> None:
        self._rest = None
        super().drain()

    def _unpack_records(self, tp: Any, records: Any, key_deserializer: Any, value_deserializer: Any) -> Any:
        data = getattr(records, "_buffer", None)
        plain_reader = key_deserializer is None and value_deserializer is None
        if data is None or not plain_reader or self.isolation_level != IsolationLevel.READ_UNCOMMITTED:
            yield from super()._unpack_records(tp, records, key_deserializer, value_deserializer)
            return
        parsed = parse_fetch(data, self.fetch_offset, self.check_crcs)
        if parsed.read_to:  # what kafka-python's reader sets from the last batch it reads
            self.leader_epoch = parsed.leader_epoch
            self.next_fetch_offset = parsed.next_offset
            self.records_read += len(parsed.block)
            self.bytes_read += parsed.read_to
        if len(parsed.block):
            yield parsed.block
        if parsed.read_to < len(data):  # the rest (often only part of a batch) is kafka-python's
            rest = MemoryRecords(data[parsed.read_to :])
            yield from super()._unpack_records(tp, rest, key_deserializer, value_deserializer)
        else:
            self.drain()


def install(consumer: Any) -> bool:
    """Make `consumer`'s poll() return RecordBlocks for plain data. False (and a warning) where
    this kafka-python does not have the reader it replaces: poll() then returns ConsumerRecords,
    which gather() takes too, only slower."""
    fetcher = getattr(consumer, "_fetcher", None)
    if fetcher is None or getattr(fetcher, "PartitionRecords", None) is not Fetcher.PartitionRecords:
        log.warning("this kafka-python's fetcher is not the one fleetwatch knows: records read one by one")
        return False
    fetcher.PartitionRecords = _BlockPartitionRecords
    return True


def warm_up() -> None:
    """Load the compiled reader from numba's cache (compiling it on a fresh install, ~5 s)."""
    _parse(_read_only(np.zeros(0, dtype=np.uint8)), 0)
