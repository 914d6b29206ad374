"""Atomic-unit storage (DESIGN.md §5): the ``UnitStore`` protocol and its backends.

Backends import their heavy dependencies (Mooncake, Ray) only when opened.
"""

from knittrans.store.factory import open_store, parse_store_url
from knittrans.store.protocol import PutResult, ReadStats, ReadStatsSnapshot, UnitRead, UnitStore, UnitWrite

__all__ = [
    "PutResult",
    "ReadStats",
    "ReadStatsSnapshot",
    "UnitRead",
    "UnitStore",
    "UnitWrite",
    "open_store",
    "parse_store_url",
]
