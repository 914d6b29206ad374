"""Atomic-unit storage (DESIGN.md §5): the ``UnitStore`` protocol and its backends.

Backends import their heavy dependencies (Mooncake, Ray) only when opened.
"""

from typing import TYPE_CHECKING, Any

from knittrans.store.protocol import PutResult, ReadStats, ReadStatsSnapshot, UnitRead, UnitStore, UnitWrite

if TYPE_CHECKING:
    from knittrans.store.factory import open_store, parse_store_url

# Lazy: the factory reads store URLs and configs through the config loader (yaml), and the pure packer imports
# knittrans.store.arrays and .buffers, which must not load it.
_LAZY = {"open_store": "knittrans.store.factory", "parse_store_url": "knittrans.store.factory"}

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


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'knittrans.store' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(_LAZY[name]), name)
