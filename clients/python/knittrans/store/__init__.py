"""Atomic-unit storage (DESIGN.md §5): the ``UnitStore`` protocol, its backends and the hierarchical index.

Backends import their heavy dependencies (Mooncake, Ray) only when opened.
"""

from knittrans.store.factory import open_store, parse_store_url
from knittrans.store.index import IndexEntry, UnitIndex
from knittrans.store.protocol import PutResult, ReadStats, ReadStatsSnapshot, UnitRead, UnitStore, UnitWrite

__all__ = [
    "IndexEntry",
    "PutResult",
    "ReadStats",
    "ReadStatsSnapshot",
    "UnitIndex",
    "UnitRead",
    "UnitStore",
    "UnitWrite",
    "open_store",
    "parse_store_url",
]
