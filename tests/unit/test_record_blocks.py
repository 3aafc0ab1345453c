"""fleetwatch.record_blocks reads a fetch's records as kafka-python's own reader does: same
offsets, values, next fetch offset and leader epoch; anything else is left to kafka-python."""

from __future__ import annotations

import struct
import textwrap
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.consumer.fetcher import Fetcher
from kafka.errors import CorruptRecordError
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords
from kafka.record.util import calc_crc32c

from fleetwatch import record_blocks
from fleetwatch.record_blocks import RecordBlock, gather, parse_fetch
from tests.helpers.bounds_checked import run_bounds_checked
from tests.helpers.record_batches import TP, as_pairs, batch


def read(cls: Any, data: bytes, fetch_offset: int, check_crcs: bool = True) -> tuple[list[Any], int, int]:
    """What a partition reader of class `cls` returns for `data`, asked as the fetcher asks until
    it is drained: (items, next fetch offset, leader epoch). Its errors are raised."""
    reader = cls(fetch_offset, TP, MemoryRecords(data), check_crcs=check_crcs)
    items: list[Any] = []
    while reader:
        items += reader.take()
    return items, reader.next_fetch_offset, reader.leader_epoch


def kafka_python(data: bytes, fetch_offset: int, check_crcs: bool = True) -> tuple[list[Any], int, int]:
    return read(Fetcher.PartitionRecords, data, fetch_offset, check_crcs)


def as_records(records: list[Any]) -> list[tuple[int, bytes | None, bytes | None, int]]:
    """The same of kafka-python's ConsumerRecords."""
    return [(r.offset, r.key, r.value, r.timestamp if r.timestamp_type == 1 else -1) for r in records]


keys = st.one_of(st.none(), st.binary(max_size=20))
values = st.one_of(st.none(), st.binary(max_size=300))
batches = st.lists(
    st.tuples(
        st.lists(
            st.tuples(st.integers(1, 3), st.one_of(st.none(), st.binary(max_size=20)), values),
            min_size=1,
            max_size=6,
        ),
        st.integers(0, 5),
        st.one_of(st.none(), st.integers(1_700_000_000_000, 1_800_000_000_000)),
    ),
    min_size=1,
    max_size=5,
)


def fetch_of(spec: Any, gap: int = 0) -> tuple[bytearray, int]:
    """The batches of `spec` ([([(offset step, key, value)], leader epoch, append time or None)]),
    offsets from 11 on, `gap` offsets skipped after each batch: (the fetch's bytes, the offset
    after the last gap)."""
    data = bytearray()
    offset = 10
    for recs, epoch, appended in spec:
        rows = []
        for step, key, value in recs:
            offset += step
            rows.append((offset, key, value, []))
        data += batch(rows, epoch=epoch, appended_ms=appended)
        offset += gap
    return data, offset


@settings(max_examples=300, deadline=None)
@given(spec=batches, gap=st.integers(0, 4), cut=st.integers(0, 400), at=st.integers(0, 40))
def test_a_fetch_reads_as_kafka_python_reads_it(spec: Any, gap: int, cut: int, at: int) -> None:
    """Offset gaps (compaction), null keys and values, several leader epochs, a fetch offset in
    the middle of a batch, a partial batch at the end: the same records, next fetch offset and
    leader epoch as kafka-python's reader."""
    data, offset = fetch_of(spec, gap)
    last = batch([(offset + 1, None, b"x" * cut, [])])
    data += last[: len(last) * at // 41]  # a trailing partial batch, or none
    fetch_offset = 10 + at
    want, want_next, want_epoch = kafka_python(bytes(data), fetch_offset)
    got, got_next, got_epoch = read(record_blocks._BlockPartitionRecords, bytes(data), fetch_offset)
    assert all(type(item) is RecordBlock for item in got) and len(got) <= 1
    assert as_pairs(got) == as_records(want)  # keys and broker times too
    assert (got_next, got_epoch) == (want_next, want_epoch)


def take_in_steps(cls: Any, data: bytes, fetch_offset: int, sizes: list[int]) -> tuple[list[Any], int, int]:
    """take(n) until drained, n cycling through `sizes`: ([(records, next fetch offset)] of each
    take that returned records, final next fetch offset, leader epoch)."""
    reader = cls(fetch_offset, TP, MemoryRecords(data))
    steps = []
    for i in range(10_000):
        if not reader:
            break
        n = sizes[i % len(sizes)]
        part = reader.take(n)
        assert len(part) <= n
        if len(part):
            steps.append((as_pairs(list(part)), reader.next_fetch_offset))
    return steps, reader.next_fetch_offset, reader.leader_epoch


@settings(max_examples=200, deadline=None)
@given(spec=batches, at=st.integers(0, 20), sizes=st.lists(st.integers(1, 9), min_size=1, max_size=10))
def test_poll_takes_at_most_max_records(spec: Any, at: int, sizes: list[int]) -> None:
    """The fetcher takes at most poll()'s max_records from a reader (counted with len()): a block
    is split to fit, each take returns what kafka-python's would, and the next fetch offset after
    a take lies past its last record and not past the next take's first."""
    data, _ = fetch_of(spec)
    want, want_next, want_epoch = take_in_steps(Fetcher.PartitionRecords, bytes(data), 10 + at, sizes)
    got, got_next, got_epoch = take_in_steps(
        record_blocks._BlockPartitionRecords, bytes(data), 10 + at, sizes
    )
    assert [records for records, _ in got] == [records for records, _ in want]
    assert (got_next, got_epoch) == (want_next, want_epoch)
    for k, (records, next_offset) in enumerate(got):
        assert next_offset > records[-1][0]
        if k + 1 < len(got):
            assert next_offset <= got[k + 1][0][0][0]


def test_what_is_not_plain_is_left_to_kafka_python() -> None:
    """Compressed, legacy (v1), control batches and records with headers: parse_fetch leaves
    them, and the worker's reader returns exactly kafka-python's records for them."""
    rows = [(5, b"k", b"v1", []), (6, None, b"v2", [])]
    # kafka-python's builder sends a batch uncompressed when that is no larger
    gzip = bytes(batch([(5, None, b"v1" * 100, []), (6, None, b"v2" * 100, [])], compression=1))
    assert struct.unpack_from(">h", gzip, 21)[0] & 0x07 == 1
    legacy = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
    legacy.append(5, 1_700_000_000_000, b"k", b"v1")
    legacy.append(6, 1_700_000_000_000, None, b"v2")
    control = batch(rows)
    control[21:23] = struct.pack(">h", 0x20 | 0x10)  # a transactional control batch
    control[17:21] = struct.pack(">I", calc_crc32c(memoryview(control)[21:]))
    headers = bytes(batch([(5, b"k", b"v1", [("trace", b"1")]), (6, None, b"v2", [])]))
    for data in (gzip, bytes(legacy.build()), bytes(control), headers):
        assert parse_fetch(data, 5).read_to == 0
        want, want_next, want_epoch = kafka_python(data, 5)
        got, got_next, got_epoch = read(record_blocks._BlockPartitionRecords, data, 5)
        assert [type(r).__name__ for r in got] == [type(r).__name__ for r in want]
        assert as_pairs(got) == as_pairs(want)
        assert (got_next, got_epoch) == (want_next, want_epoch)
    read_back = [(o, v) for o, _k, v, _t in as_pairs(kafka_python(gzip, 5)[0])]
    assert read_back == [(5, b"v1" * 100), (6, b"v2" * 100)]  # something was read


def test_a_bad_crc_or_record_raises_kafka_pythons_error() -> None:
    good = batch([(0, None, b"value-0", []), (1, None, b"value-1", [])])
    flipped = bytearray(good)
    flipped[-3] ^= 0x01  # in a value: only the CRC tells
    assert parse_fetch(bytes(good), 0).read_to == len(good)
    assert parse_fetch(bytes(flipped), 0).read_to == 0
    with pytest.raises(CorruptRecordError):
        read(record_blocks._BlockPartitionRecords, bytes(flipped), 0)
    unchecked, _, _ = read(record_blocks._BlockPartitionRecords, bytes(flipped), 0, check_crcs=False)
    assert as_pairs(unchecked) == as_pairs(kafka_python(bytes(flipped), 0, check_crcs=False)[0])
    short = bytearray(good)
    short[61] = 2  # the first record says it is 1 byte long; its CRC is made to match
    short[17:21] = struct.pack(">I", calc_crc32c(memoryview(short)[21:]))
    assert parse_fetch(bytes(short), 0).read_to == 0
    with pytest.raises(CorruptRecordError):
        kafka_python(bytes(short), 0)
    with pytest.raises(CorruptRecordError):
        read(record_blocks._BlockPartitionRecords, bytes(short), 0)


def test_gather_keeps_order_across_blocks_and_records() -> None:
    first = parse_fetch(bytes(batch([(3, None, b"a", []), (4, None, None, [])])), 3).block
    legacy = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
    legacy.append(5, 1_700_000_000_000, None, b"c")
    records, _, _ = kafka_python(bytes(legacy.build()), 5)
    block = gather([first, *records])
    assert list(zip(block.offsets.tolist(), block.values(), strict=True)) == [(3, b"a"), (4, None), (5, b"c")]
    assert not block.buf.flags.writeable and block.value(1) is None
    assert gather([first]) is first


_BOUNDS_CHECKED = textwrap.dedent(
    """
    import random
    from kafka.consumer.fetcher import Fetcher
    from fleetwatch import record_blocks
    from tests.helpers.record_batches import batch, outcome
    rng = random.Random(11)
    good = bytearray()
    for b in range(4):
        rows = [(10 * b + k, rng.choice([None, b"key"]), bytes(rng.randrange(200)), []) for k in range(5)]
        good += batch(rows)
    compiled = 0
    for i in range(20000):
        data = bytearray(good)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(data))
            op = rng.randrange(3)
            if op == 0:
                data[at] = rng.randrange(256)
            elif op == 1:
                del data[at:]
            else:
                data.insert(at, rng.randrange(256))
            if not data:
                break
        data = bytes(data)
        fetch_offset = rng.choice([0, 0, 12, 25])
        check_crcs = i % 4 == 0
        compiled += record_blocks.parse_fetch(data, fetch_offset, check_crcs).read_to > 0
        ours = outcome(record_blocks._BlockPartitionRecords, data, fetch_offset, check_crcs)
        theirs = outcome(Fetcher.PartitionRecords, data, fetch_offset, check_crcs)
        assert ours == theirs, (ours, theirs, data)
    print("compiled", compiled, "of 20000")
    """
)


def test_mutated_fetches_never_read_out_of_bounds() -> None:
    """numba's bounds checking (compiled into a cache of its own) finds no index out of range on
    20,000 mutated fetches (flipped, cut, inserted bytes), and the worker's reader has the same
    outcome as kafka-python's on each: the same records, next offset and leader epoch, or the
    same error after the same records. CRCs are checked on one in four, so that the compiled
    reader reads mutated fetches at all."""
    done = run_bounds_checked(_BOUNDS_CHECKED, timeout_s=240)
    assert done.returncode == 0, done.stderr[-3000:]
    counts = done.stdout.split()
    assert counts[0] == "compiled" and int(counts[1]) > 5000, done.stdout
