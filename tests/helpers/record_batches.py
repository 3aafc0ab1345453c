"""Kafka record batches for the record-block reader's tests: a v2 batch built as a producer and
the broker build it, and what a partition reader returns for a fetch, as comparable tuples."""

from __future__ import annotations

import struct
from typing import Any

from kafka import TopicPartition
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords
from kafka.record.util import calc_crc32c

from fleetwatch.record_blocks import RecordBlock, gather

TP = TopicPartition("t", 0)


def batch(
    records: list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]],
    *,
    epoch: int = 0,
    compression: int = 0,
    appended_ms: int | None = None,
) -> bytearray:
    """One v2 batch of (offset, key, value, headers), its base offset and leader epoch set; with
    `appended_ms`, timestamped as the broker does a LogAppendTime topic's batches (the timestamp
    type bit set and that time as the batch's max timestamp)."""
    b = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=False,
        producer_id=1000,
        producer_epoch=0,
        base_sequence=0,
        batch_size=1 << 30,
    )
    for offset, key, value, headers in records:
        assert b.append(offset - records[0][0], 1_700_000_000_000, key, value, headers) is not None
    data = b.build()
    data[0:8] = struct.pack(">q", records[0][0])  # neither field is under the CRC
    data[12:16] = struct.pack(">i", epoch)
    if appended_ms is not None:
        (attributes,) = struct.unpack(">h", data[21:23])
        data[21:23] = struct.pack(">h", attributes | 0x08)
        data[35:43] = struct.pack(">q", appended_ms)
        data[17:21] = struct.pack(">I", calc_crc32c(memoryview(data)[21:]))
    return data


def as_pairs(items: list[Any]) -> list[tuple[int, bytes | None, bytes | None, int]]:
    """(offset, key, value, append time in ms or -1) of every record read."""
    block = gather(items) if items else RecordBlock.from_values([])
    return list(
        zip(block.offsets.tolist(), block.keys(), block.values(), block.append_ms.tolist(), strict=True)
    )


def outcome(cls: Any, data: bytes, fetch_offset: int, check_crcs: bool) -> tuple[Any, ...]:
    """("read", records, next fetch offset, leader epoch), or ("raised", error, records before)."""
    reader = cls(fetch_offset, TP, MemoryRecords(data), check_crcs=check_crcs)
    items: list[Any] = []
    try:
        while reader:
            items += reader.take()
    except Exception as e:  # the same error from both readers, whatever it is
        return "raised", type(e).__name__, as_pairs(items)
    return "read", as_pairs(items), reader.next_fetch_offset, reader.leader_epoch
