"""Raw byte views of caller buffers, and their addresses for backends that move bytes by pointer."""

from __future__ import annotations

from typing import Any, TypeAlias

import numpy as np

from knittrans.errors import InvalidArgument

# Anything exporting a C-contiguous buffer: bytes, bytearray, memoryview, numpy arrays, mmap.
BufferLike: TypeAlias = Any


def byte_view(data: BufferLike, *, field: str = "data") -> memoryview:
    """A flat unsigned-byte view of ``data`` without copying; rejects non-contiguous buffers."""
    try:
        view = data if isinstance(data, memoryview) else memoryview(data)
    except TypeError as exc:
        raise InvalidArgument(f"does not expose a buffer: {type(data).__name__}", field=field) from exc
    if not view.c_contiguous:
        raise InvalidArgument("must be C-contiguous", field=field)
    if view.format == "B" and view.ndim == 1:
        return view
    return view.cast("B")


def writable_byte_view(buffer: BufferLike, *, field: str = "buffer") -> memoryview:
    view = byte_view(buffer, field=field)
    if view.readonly:
        raise InvalidArgument("must be writable", field=field)
    return view


def address_of(view: memoryview) -> int:
    """The address of the first byte of a contiguous view (read-only views included)."""
    if view.nbytes == 0:
        return 0
    # ctypes refuses read-only buffers; numpy reads the address of either kind without copying.
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)
