"""fleetwatch.socket_reads: kafka-python's plaintext read loop, reading 256 KB a call, on a stand-in
socket (against the real broker: tests/integration/test_socket_reads.py)."""

from __future__ import annotations

from typing import Any

from kafka.errors import KafkaConnectionError

from fleetwatch import socket_reads


class ChunkSocket:
    """A non-blocking socket with `chunks` waiting, then `end` (an exception, or b"": closed)."""

    def __init__(self, chunks: list[bytes], end: Any) -> None:
        self.chunks = list(chunks)
        self.end = end
        self.asked: list[int] = []

    def recv(self, n: int) -> bytes:
        self.asked.append(n)
        if self.chunks:
            return self.chunks.pop(0)[:n]
        if isinstance(self.end, BaseException):
            raise self.end
        return self.end


class Conn:
    def __init__(self, sock: ChunkSocket) -> None:
        self._sock = sock


def test_reads_everything_waiting_until_the_socket_would_block() -> None:
    sock = ChunkSocket([b"a" * 300_000, b"b" * 10], BlockingIOError())
    data, err = socket_reads._sock_recv(Conn(sock))
    assert data == b"a" * socket_reads.READ_BYTES + b"b" * 10 and err is None
    assert set(sock.asked) == {socket_reads.READ_BYTES} and len(sock.asked) == 3


def test_a_closed_or_failed_socket_is_a_connection_error_after_what_was_read() -> None:
    data, err = socket_reads._sock_recv(Conn(ChunkSocket([b"x"], b"")))
    assert data == b"x" and isinstance(err, KafkaConnectionError) and "disconnected" in str(err)
    data, err = socket_reads._sock_recv(Conn(ChunkSocket([], ConnectionResetError("reset"))))
    assert data == b"" and isinstance(err, KafkaConnectionError) and "reset" in str(err)
