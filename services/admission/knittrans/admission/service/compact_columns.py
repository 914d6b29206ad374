"""A block's columns in the smaller form the ledger keeps while its rows are pending (issue 15: at most 2 KB per
pending trajectory).

Two representations, both exact (every read gives back the same values, of the same types):

* a numeric column whose values are all equal is a read-only stride-0 view of one element
  (``np.broadcast_to``): indexing, ``tolist`` and arithmetic see the whole column, its memory is one element.
  Within a report most per-unit and per-reference columns are constant (kinds, alignments, coverages, sequence
  axes, encoder indices, header indices, chunk sizes ...), and each costs 8 bytes per element otherwise;
* content hashes that are all 32-character lower-case hex digests (the store's 128-bit digests) are kept as their
  16 raw bytes each (:class:`PackedHashes`) instead of one ``str`` object each (81 bytes, plus the tuple's pointer).
  A column with any other hash stays a tuple of strings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import overload

import numpy as np

from knittrans.admission.service.header_columns import HeaderColumns
from knittrans.admission.service.trajectory_columns import TrajectoryColumns

_DIGEST_BYTES = 16
_DIGEST_CHARS = 2 * _DIGEST_BYTES


class PackedHashes(Sequence[str]):
    """Lower-case hex digests of 16 bytes, held as one ``bytes`` of their raw values."""

    __slots__ = ("_raw",)

    def __init__(self, raw: bytes) -> None:
        if len(raw) % _DIGEST_BYTES:
            raise ValueError(f"{len(raw)} bytes is not a whole number of {_DIGEST_BYTES}-byte digests")
        self._raw = raw

    def __len__(self) -> int:
        return len(self._raw) // _DIGEST_BYTES

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[str, ...]: ...

    def __getitem__(self, index: int | slice) -> str | tuple[str, ...]:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        count = len(self)
        if index < 0:
            index += count
        if not 0 <= index < count:
            raise IndexError("hash index out of range")
        start = index * _DIGEST_BYTES
        return self._raw[start : start + _DIGEST_BYTES].hex()

    def __iter__(self) -> Iterator[str]:
        text = self._raw.hex()
        return iter([text[i : i + _DIGEST_CHARS] for i in range(0, len(text), _DIGEST_CHARS)])

    def gather(self, rows: np.ndarray) -> list[str]:
        """The digests at ``rows`` (an index array), in order: one hex conversion, not one lookup per digest."""
        raw = np.frombuffer(self._raw, dtype=np.uint8).reshape(-1, _DIGEST_BYTES)[rows].tobytes().hex()
        return [raw[i : i + _DIGEST_CHARS] for i in range(0, len(raw), _DIGEST_CHARS)]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PackedHashes):
            return self._raw == other._raw
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._raw)

    def __repr__(self) -> str:
        return f"PackedHashes({len(self)} digests)"


def join_packed(parts: Sequence[PackedHashes]) -> PackedHashes:
    """Packed digests one after the other, still packed."""
    return PackedHashes(b"".join(part._raw for part in parts))


def pack_hashes(values: Sequence[str]) -> Sequence[str]:
    """``values`` as :class:`PackedHashes` when every one is a 32-character lower-case hex digest, else as a
    tuple (the packed form must give back exactly the strings it was given)."""
    if isinstance(values, PackedHashes):
        return values
    if not values or set(map(len, values)) != {_DIGEST_CHARS}:
        return tuple(values)
    text = "".join(values)
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        return tuple(values)
    # fromhex also takes upper case and spaces: only the digests it gives back exactly are packed.
    if len(raw) != _DIGEST_BYTES * len(values) or raw.hex() != text:
        return tuple(values)
    return PackedHashes(raw)


def constant_array(values: np.ndarray) -> np.ndarray:
    """``values`` as a stride-0 view of its first element when all its elements are equal, else itself."""
    if values.ndim != 1 or len(values) < 2 or values.strides == (0,) or not values.flags.c_contiguous:
        return values
    # Compared bit for bit: -0.0 is not 0.0 here, and NaNs with equal bits are equal.
    bits = values.view(f"u{values.dtype.itemsize}")
    if not (bits == bits[0]).all():
        return values
    return np.broadcast_to(values[:1].copy(), values.shape)


def compact_headers(headers: HeaderColumns) -> HeaderColumns:
    return dataclasses.replace(
        headers,
        **{name: constant_array(getattr(headers, name))
           for name in ("dtypes", "ranks", "shape_offsets", "shape", "has_seq_axis", "seq_axes", "byte_lengths",
                        "chunk_tokens")},
        content_hashes=pack_hashes(headers.content_hashes),
    )


_NUMERIC = tuple(f.name for f in dataclasses.fields(TrajectoryColumns)
                 if f.init and f.type in ("np.ndarray", np.ndarray))


def compact_columns(columns: TrajectoryColumns) -> TrajectoryColumns:
    """The same columns in the compact form (see the module docstring); columns of messages are left as they are
    (their messages are kept, and are what the ledger answers with)."""
    if columns.messages is not None:
        return columns
    return dataclasses.replace(
        columns,
        plain={name: column if isinstance(column, (tuple, list)) else constant_array(column)
               for name, column in columns.plain.items()},
        **{name: constant_array(getattr(columns, name)) for name in _NUMERIC},
        unit_headers=compact_headers(columns.unit_headers),
        multimodal_headers=compact_headers(columns.multimodal_headers),
    )
