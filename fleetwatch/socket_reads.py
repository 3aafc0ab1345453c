"""Larger socket reads for kafka-python's plaintext connections.

kafka-python 3.0 reads a connection 4 KB per recv() call: ~2,000 calls for one 8 MB fetch
response, ~40% of a detect worker's network thread (py-spy). install() makes its plaintext
transport read up to READ_BYTES per call; the rest of the read loop is kafka-python's, unchanged.
It applies to every plaintext connection of the process (the worker calls it); TLS connections
(KafkaSSLTransport, its own read loop) keep kafka-python's reads.
"""

from __future__ import annotations

import logging
from typing import Any

import kafka.errors as Errors
from kafka.net import transport

log = logging.getLogger(__name__)

READ_BYTES = 256 * 1024


def _sock_recv(self: Any) -> tuple[bytes, Exception | None]:
    """kafka-python's KafkaTCPTransport._sock_recv (3.0.12) with READ_BYTES in place of 4096:
    everything the socket has, up to the call that would block."""
    recvd = []
    err = None
    while True:
        try:
            data = self._sock.recv(READ_BYTES)
            if not data:  # the peer closed the connection
                log.error("%s: socket disconnected", self)
                err = Errors.KafkaConnectionError("socket disconnected")
                break
            recvd.append(data)
        except (BlockingIOError, InterruptedError):
            break
        except BaseException as e:
            log.exception("%s: Error receiving network data closing socket", self)
            err = Errors.KafkaConnectionError(e)
            break
    return b"".join(recvd), err


def install() -> bool:
    """Make kafka-python's plaintext transport read READ_BYTES per call. False (and a warning)
    where this kafka-python has no such read loop; its own reads are then kept."""
    tcp = getattr(transport, "KafkaTCPTransport", None)
    if tcp is None or not callable(getattr(tcp, "_sock_recv", None)):
        log.warning("this kafka-python's transport is not the one fleetwatch knows: 4 KB socket reads kept")
        return False
    tcp._sock_recv = _sock_recv
    return True
