"""Taking a service process's start-up heap out of Python's cyclic garbage collector."""

from __future__ import annotations

import gc


def freeze_startup_heap() -> None:
    """Take what start-up left on the heap (tens of thousands of objects, nearly all from imports: grpc, protobuf,
    numpy; in the admission service, also the ledger recovered from its journal) out of every later garbage
    collection. A full collection traversed all of it: 12-19 ms of CPU each in a sidecar, and, in the transfer
    benchmark, pauses of 46-114 ms of a sidecar's event loop and reader on the loaded machine, where one consumer's
    pause holds back every consumer's verdict on the mini-batch. Garbage is collected first: a frozen reference
    cycle would never be freed."""
    gc.collect()
    gc.freeze()
