"""Trainer-rank reads as separate processes, each with its own TransferQueue client.

A real job has one client per rank process. Here a pool of ``reader_concurrency`` spawned processes stands in
for the ranks' readers: each holds one TransferQueue client and performs one whole-sample read at a time, so at
most ``reader_concurrency`` reads are in flight, and the client-side decoding of different reads runs in
different processes, as it would on different ranks. The pool's processes also do the redistribution that
follows a read (see ``tq/redistribution.py``), because the reading rank holds the bytes.

Timestamps cross process boundaries as ``time.time()``: one system-wide clock, the one every arm of the
benchmark uses (the KnitTrans sidecars stamp their assignments with it).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from transfer_queue import TransferQueueClient

from tq.layout import StoredImages, StoredRow
from tq.reads import check_images, check_rows, packed, payload_bytes
from tq.redistribution import send_to_peers

# The client of this reader process, made once by the pool's initializer: a process pool offers no other place
# for per-worker state.
_reader_client: TransferQueueClient | None = None


@dataclass(frozen=True, kw_only=True)
class ReadRequest:
    """One rank's whole-sample read of ``keys``, then optionally forwarding some fields to its peers."""

    keys: tuple[str, ...]
    partition: str
    fields: tuple[str, ...]
    rows: tuple[StoredRow, ...] = ()  # what trajectory rows must hold (empty for image rows)
    images: tuple[StoredImages, ...] = ()  # what image rows must hold (empty for trajectory rows)
    routing_width: int = 0
    forward_fields: tuple[str, ...] = ()
    forward_peers: int = 0

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("keys: must not be empty")
        if bool(self.rows) == bool(self.images):
            raise ValueError("rows/images: exactly one of them describes what the keys hold")


@dataclass(frozen=True, kw_only=True)
class ReadOutcome:
    bytes_moved_from_storage: int
    read_s: float
    ready_at: float  # time.time() when the rank and its peers hold the data (checks excluded)
    redistribution_bytes: int
    redistribution_s: float


def _start_reader(controller_info: Any, storage_config: Any) -> None:
    global _reader_client
    _reader_client = TransferQueueClient(client_id=f"reader-{os.getpid()}", controller_info=controller_info)
    _reader_client.initialize_storage_manager(manager_type="SimpleStorage", config=storage_config)


def _started(hold_s: float) -> int:
    # Keeps its worker busy for a moment, so that the warm-up's tasks land on different processes.
    time.sleep(hold_s)
    return os.getpid()


def perform_read(request: ReadRequest) -> ReadOutcome:
    """Runs in a reader process: the same calls as ``transfer_queue.kv_batch_get``, on this process's client."""
    client = _reader_client
    if client is None:
        raise RuntimeError("reader process without a TransferQueue client")
    started = time.time()
    meta = client.kv_retrieve_meta(keys=list(request.keys), partition_id=request.partition, create=False)
    data = client.get_data(meta.select_fields(list(request.fields)))
    read_done = time.time()
    moved = payload_bytes(data)
    if request.rows:
        check_rows(data, request.rows, request.fields, request.routing_width)
    else:
        check_images(data, request.images)
    forwarded = send_to_peers([packed(data, field) for field in request.forward_fields], request.forward_peers)
    return ReadOutcome(
        bytes_moved_from_storage=moved,
        read_s=read_done - started,
        ready_at=read_done + forwarded.seconds,
        redistribution_bytes=forwarded.bytes_sent,
        redistribution_s=forwarded.seconds,
    )


class ReaderPool:
    def __init__(self, *, processes: int, controller_info: Any, storage_config: Any) -> None:
        self._processes = processes
        self._executor = ProcessPoolExecutor(
            max_workers=processes,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start_reader,
            initargs=(controller_info, storage_config),
        )

    async def warm_up(self, *, rounds: int = 5) -> int:
        """Start every reader process, so imports and client set-up stay out of the measured steps.

        Returns how many distinct processes answered (all of them, unless start-up is very uneven).
        """
        loop = asyncio.get_running_loop()
        seen: set[int] = set()
        for round_index in range(rounds):
            hold_s = 0.5 * 2**round_index
            pids = await asyncio.gather(
                *(loop.run_in_executor(self._executor, _started, hold_s) for _ in range(self._processes))
            )
            seen.update(pids)
            if len(seen) >= self._processes:
                break
        return len(seen)

    async def read(self, request: ReadRequest) -> ReadOutcome:
        return await asyncio.get_running_loop().run_in_executor(self._executor, perform_read, request)

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
