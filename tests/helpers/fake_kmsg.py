"""A kernel ring buffer that answers read() as /dev/kmsg does (Documentation/ABI/testing/dev-kmsg):
one record per read, `PRIORITY,SEQ,TIMESTAMP_us,FLAGS;MESSAGE\\n` plus dictionary lines;
BlockingIOError (EAGAIN) when nothing is waiting; BrokenPipeError (EPIPE) once when the reader's
next record was overwritten, after which it reads from the oldest record still there. Sequence
numbers start at 0 with each boot. Only for what the test machine cannot do: wrap the real ring
buffer at will, or reboot."""

from __future__ import annotations

from collections import deque


class RingKmsg:
    def __init__(self, capacity: int = 1024, first_seq: int = 0) -> None:
        self.capacity = capacity
        self.records: deque[tuple[int, bytes]] = deque()
        self.next_seq = first_seq
        self.usec = 1_000_000

    def log(self, message: str, priority: int = 4, meta: dict[str, str] | None = None) -> int:
        """printk: append a record (dropping the oldest when full); its sequence number."""
        seq = self.next_seq
        self.next_seq += 1
        self.usec += 1234
        text = f"{priority},{seq},{self.usec},-;{message}\n" + "".join(
            f" {k}={v}\n" for k, v in (meta or {}).items()
        )
        self.records.append((seq, text.encode()))
        while len(self.records) > self.capacity:
            self.records.popleft()
        return seq

    def open(self) -> RingReader:
        return RingReader(self)


class RingReader:
    """One open file description of the device: its own position, starting at the oldest record."""

    def __init__(self, ring: RingKmsg) -> None:
        self.ring = ring
        self.next = ring.records[0][0] if ring.records else ring.next_seq
        self.closed = False

    def read(self) -> bytes:
        if self.closed:
            raise OSError("read of a closed device")
        records = self.ring.records
        if not records or self.next >= self.ring.next_seq:
            raise BlockingIOError("EAGAIN")
        oldest = records[0][0]
        if self.next < oldest:
            self.next = oldest
            raise BrokenPipeError("EPIPE")
        seq, text = records[self.next - oldest]
        self.next = seq + 1
        return text

    def close(self) -> None:
        self.closed = True
