"""Rank-to-rank redistribution after a sample-level read, done as a real transfer over loopback sockets.

The sample-level baseline lets one rank read data that other ranks need and then redistributes it (an
all-to-all in the paper's cluster). Here the reading rank sends the bytes to each receiving rank through a
Unix socket pair, a kernel copy like any intra-node IPC, and the receivers write them into their own
buffers. Bytes and wall time are measured; the received bytes are compared with the sent ones afterwards.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# A stuck peer must fail the benchmark, not hang it.
SOCKET_TIMEOUT_S = 120.0


class RedistributionError(RuntimeError):
    """A receiver got different bytes than were sent."""


@dataclass(frozen=True, kw_only=True)
class Redistribution:
    bytes_sent: int
    seconds: float


def _receive(connection: socket.socket, buffer: np.ndarray) -> None:
    view = memoryview(buffer).cast("B")
    received = 0
    while received < len(view):
        count = connection.recv_into(view[received:])
        if count == 0:
            break
        received += count


def send_to_peers(payloads: Sequence[np.ndarray], peers: int) -> Redistribution:
    """Send every payload (contiguous byte arrays) to each of ``peers`` receivers, one after another."""
    if peers == 0 or not payloads:
        return Redistribution(bytes_sent=0, seconds=0.0)
    total = sum(payload.nbytes for payload in payloads)
    receive_buffers = [np.empty(total, dtype=np.uint8) for _ in range(peers)]
    pairs = [socket.socketpair() for _ in range(peers)]
    for left, right in pairs:
        left.settimeout(SOCKET_TIMEOUT_S)
        right.settimeout(SOCKET_TIMEOUT_S)
    started = time.perf_counter()
    receivers = [
        threading.Thread(target=_receive, args=(pair[1], buffer), daemon=True)
        for pair, buffer in zip(pairs, receive_buffers, strict=True)
    ]
    try:
        for receiver in receivers:
            receiver.start()
        for sender, _ in pairs:
            for payload in payloads:
                sender.sendall(memoryview(np.ascontiguousarray(payload)).cast("B"))
        for receiver in receivers:
            receiver.join()
        seconds = time.perf_counter() - started
    finally:
        for left, right in pairs:
            left.close()
            right.close()
    sent = np.concatenate([payload.reshape(-1).view(np.uint8) for payload in payloads])
    for buffer in receive_buffers:
        if not np.array_equal(buffer, sent):
            raise RedistributionError("a receiver got different bytes than were sent")
    return Redistribution(bytes_sent=total * peers, seconds=seconds)
