"""Atomic-unit storage (DESIGN.md §5): the ``UnitStore`` protocol and its backends.

Names are loaded on first use, so pure modules can import ``knittrans.store.arrays`` without the
backends and the config loader; backends import their heavy dependencies (Mooncake, Ray) only when opened.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "open_store": "knittrans.store.factory",
    "parse_store_url": "knittrans.store.factory",
    "PutResult": "knittrans.store.protocol",
    "ReadStats": "knittrans.store.protocol",
    "ReadStatsSnapshot": "knittrans.store.protocol",
    "UnitRead": "knittrans.store.protocol",
    "UnitStore": "knittrans.store.protocol",
    "UnitWrite": "knittrans.store.protocol",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'knittrans.store' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
