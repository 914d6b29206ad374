"""Unit headers as columns (``UnitHeaderColumns``), and the array helpers of the columnar report form that the
admission service reads (:mod:`.trajectory_columns`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from knittrans.errors import InvalidArgument
from knittrans.v1 import trajectory_pb2
from knittrans.wire.columns import HeaderLists


def column_array(values: Sequence, dtype) -> np.ndarray:
    """A repeated protobuf field as an array: through the buffer protocol when long, element by element when
    short (a report of one trajectory has dozens of one-element columns, and that path costs less per call)."""
    if len(values) < 32:
        return np.fromiter(values, dtype=dtype, count=len(values))
    return np.array(values, dtype=dtype)


def offsets_of(counts: np.ndarray) -> np.ndarray:
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return offsets


def check_length(name: str, values: Sequence, expected: int, what: str) -> None:
    if len(values) != expected:
        raise InvalidArgument(f"has {len(values)} values, expected {expected} ({what})", field=f"batch.{name}")


@dataclass(frozen=True, kw_only=True, eq=False)
class HeaderColumns:
    """Unit headers as arrays; header k's shape is ``shape[shape_offsets[k]:shape_offsets[k + 1]]``."""

    dtypes: np.ndarray  # int64 (proto enum numbers)
    ranks: np.ndarray  # int64
    shape_offsets: np.ndarray  # int64 [k + 1]
    shape: np.ndarray  # uint64
    has_seq_axis: np.ndarray  # bool
    seq_axes: np.ndarray  # int64
    byte_lengths: np.ndarray  # uint64
    content_hashes: Sequence[str]
    chunk_tokens: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.dtypes)

    @staticmethod
    def from_lists(lists: HeaderLists) -> HeaderColumns:
        ranks = np.array(lists.ranks, dtype=np.int64)
        return HeaderColumns(
            dtypes=np.array(lists.dtypes, dtype=np.int64),
            ranks=ranks,
            shape_offsets=offsets_of(ranks),
            shape=np.array(lists.shape, dtype=np.uint64),
            has_seq_axis=np.array(lists.has_seq_axis, dtype=bool),
            seq_axes=np.array(lists.seq_axes, dtype=np.int64),
            byte_lengths=np.array(lists.byte_lengths, dtype=np.uint64),
            content_hashes=lists.content_hashes,
            chunk_tokens=np.array(lists.chunk_tokens, dtype=np.int64),
        )

    @staticmethod
    def from_proto(message: trajectory_pb2.UnitHeaderColumns, count: int, name: str) -> HeaderColumns:
        what = "one per header"
        for column in ("dtypes", "ranks", "has_seq_axis", "seq_axes", "byte_lengths", "content_hashes",
                       "chunk_tokens"):
            check_length(f"{name}.{column}", getattr(message, column), count, what)
        ranks = column_array(message.ranks, np.int64)
        offsets = offsets_of(ranks)
        check_length(f"{name}.shape", message.shape, int(offsets[-1]), "the sum of ranks")
        return HeaderColumns(
            dtypes=column_array(message.dtypes, np.int64),
            ranks=ranks,
            shape_offsets=offsets,
            shape=column_array(message.shape, np.uint64),
            has_seq_axis=column_array(message.has_seq_axis, bool),
            seq_axes=column_array(message.seq_axes, np.int64),
            byte_lengths=column_array(message.byte_lengths, np.uint64),
            content_hashes=tuple(message.content_hashes),
            chunk_tokens=column_array(message.chunk_tokens, np.int64),
        )

    @cached_property
    def _rows(self) -> tuple[list, ...]:
        """Plain-Python columns, for building messages (indexing numpy arrays one by one is slow)."""
        # Tuples: they are kept with the columns, and the collector stops tracking tuples of numbers.
        shape = tuple(self.shape.tolist())
        offsets = self.shape_offsets.tolist()
        shapes = tuple(shape[offsets[k] : offsets[k + 1]] for k in range(len(self)))
        return (tuple(self.dtypes.tolist()), shapes, tuple(self.has_seq_axis.tolist()), tuple(self.seq_axes.tolist()),
                tuple(self.byte_lengths.tolist()), self.content_hashes, tuple(self.chunk_tokens.tolist()))

    def fields(self, k: int) -> dict:
        """Header k as ``UnitHeader`` constructor fields (what :func:`knittrans.wire.header_to_proto` sets)."""
        dtypes, shapes, has_axis, axes, byte_lengths, hashes, chunks = self._rows
        fields = {"dtype": dtypes[k], "shape": shapes[k], "byte_length": byte_lengths[k],
                  "content_hash": hashes[k], "chunk_tokens": chunks[k]}
        if has_axis[k]:
            fields["seq_axis"] = axes[k]
        return fields

    def fields_at(self, k: int) -> dict:
        """:meth:`fields`, read from the arrays: for a few headers of a block kept long, whose whole plain-Python
        copy (``fields``' cache) would be kept with it."""
        start, stop = int(self.shape_offsets[k]), int(self.shape_offsets[k + 1])
        fields = {"dtype": int(self.dtypes[k]), "shape": self.shape[start:stop].tolist(),
                  "byte_length": int(self.byte_lengths[k]), "content_hash": self.content_hashes[k],
                  "chunk_tokens": int(self.chunk_tokens[k])}
        if self.has_seq_axis[k]:
            fields["seq_axis"] = int(self.seq_axes[k])
        return fields

    def take(self, rows: np.ndarray | slice) -> trajectory_pb2.UnitHeaderColumns:
        """These headers (an index array, or a slice for a contiguous run) as columns."""
        if isinstance(rows, slice):
            start, stop, _ = rows.indices(len(self))
            shape_index: np.ndarray | slice = slice(int(self.shape_offsets[start]), int(self.shape_offsets[stop]))
            if hasattr(self.content_hashes, "gather"):
                rows = np.arange(start, stop, dtype=np.int64)
        else:
            shape_index = gather_index(self.shape_offsets, rows)
        return trajectory_pb2.UnitHeaderColumns(
            dtypes=self.dtypes[rows].tolist(),
            ranks=self.ranks[rows].tolist(),
            shape=self.shape[shape_index].tolist(),
            has_seq_axis=self.has_seq_axis[rows].tolist(),
            seq_axes=self.seq_axes[rows].tolist(),
            byte_lengths=self.byte_lengths[rows].tolist(),
            content_hashes=gather(rows) if (gather := getattr(self.content_hashes, "gather", None)) is not None
            else self.content_hashes[rows] if isinstance(rows, slice)
            else [self.content_hashes[k] for k in rows.tolist()],
            chunk_tokens=self.chunk_tokens[rows].tolist(),
        )


def gather_index(offsets: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The element indices of ``rows`` (each owning ``offsets[r]:offsets[r + 1]``), in row order."""
    starts = offsets[rows]
    counts = offsets[rows + 1] - starts
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    shift = np.repeat(starts - offsets_of(counts)[:-1], counts)
    return np.arange(total, dtype=np.int64) + shift
