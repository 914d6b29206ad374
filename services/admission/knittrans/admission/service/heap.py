"""Handing the heap pages that recovery freed back to the operating system.

Recovery parses the snapshot (tens of megabytes at a few hundred thousand pending trajectories) and builds the
ledger from it; the parsed message and the intermediate columns are freed at once, but glibc keeps the freed
pages of its heap, where the ledger's long-lived objects now sit between them, so the service's RSS stays at the
peak of recovery (issue 15: in benchmarks/recovery.py at 50,000 pending trajectories in reports of 10, a
recovered service held 2,301 bytes per pending trajectory against 1,725 for one that ingested them live).
``malloc_trim(0)`` returns every whole free page; elsewhere (another C library) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)


def release_free_heap() -> bool:
    """Return the C heap's free pages to the operating system; False where the C library cannot."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    released = bool(trim(0))
    logger.debug("malloc_trim released memory: %s", released)
    return True
