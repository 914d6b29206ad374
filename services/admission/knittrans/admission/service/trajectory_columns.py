"""Reading the columnar form of many trajectories' metadata (``TrajectoryBatch``), on the admission service's side.

:class:`TrajectoryColumns` reads a batch (or a report of messages) into arrays, checks that its columns fit
together (naming ``batch.<column>``), and gives back trajectory ``i`` as the message it stands for
(:meth:`TrajectoryColumns.message`): the same message :func:`knittrans.wire.trajectory_to_proto` makes of the
trajectory's domain object, so both forms of one trajectory are interchangeable. The SDK builds batches
(:mod:`knittrans.wire.columns`); only the service reads them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from knittrans.errors import InvalidArgument
from knittrans.v1 import trajectory_pb2
from knittrans.wire.columns import ColumnLists, HeaderLists
from knittrans.wire.trajectory import TRAJECTORY_COLUMNS, TRAJECTORY_FIELDS


def _column(values: Sequence, dtype) -> np.ndarray:
    """A repeated protobuf field as an array: through the buffer protocol when long, element by element when
    short (a report of one trajectory has dozens of one-element columns, and that path costs less per call)."""
    if len(values) < 32:
        return np.fromiter(values, dtype=dtype, count=len(values))
    return np.array(values, dtype=dtype)


def _offsets(counts: np.ndarray) -> np.ndarray:
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return offsets


def _check_length(name: str, values: Sequence, expected: int, what: str) -> None:
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
            shape_offsets=_offsets(ranks),
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
            _check_length(f"{name}.{column}", getattr(message, column), count, what)
        ranks = _column(message.ranks, np.int64)
        offsets = _offsets(ranks)
        _check_length(f"{name}.shape", message.shape, int(offsets[-1]), "the sum of ranks")
        return HeaderColumns(
            dtypes=_column(message.dtypes, np.int64),
            ranks=ranks,
            shape_offsets=offsets,
            shape=_column(message.shape, np.uint64),
            has_seq_axis=_column(message.has_seq_axis, bool),
            seq_axes=_column(message.seq_axes, np.int64),
            byte_lengths=_column(message.byte_lengths, np.uint64),
            content_hashes=tuple(message.content_hashes),
            chunk_tokens=_column(message.chunk_tokens, np.int64),
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

    def take(self, rows: np.ndarray) -> trajectory_pb2.UnitHeaderColumns:
        shape_index = gather_index(self.shape_offsets, rows)
        return trajectory_pb2.UnitHeaderColumns(
            dtypes=self.dtypes[rows].tolist(),
            ranks=self.ranks[rows].tolist(),
            shape=self.shape[shape_index].tolist(),
            has_seq_axis=self.has_seq_axis[rows].tolist(),
            seq_axes=self.seq_axes[rows].tolist(),
            byte_lengths=self.byte_lengths[rows].tolist(),
            content_hashes=[self.content_hashes[k] for k in rows.tolist()],
            chunk_tokens=self.chunk_tokens[rows].tolist(),
        )


def gather_index(offsets: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The element indices of ``rows`` (each owning ``offsets[r]:offsets[r + 1]``), in row order."""
    starts = offsets[rows]
    counts = offsets[rows + 1] - starts
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    shift = np.repeat(starts - _offsets(counts)[:-1], counts)
    return np.arange(total, dtype=np.int64) + shift


@dataclass(frozen=True, kw_only=True, eq=False)
class TrajectoryColumns:
    """Trajectories as arrays. Trajectory ``i``'s segments are ``segment_*[segment_offsets[i]:segment_offsets[i+1]]``,
    and likewise for units, multimodal references and scalars. ``unit_has_header`` is false only for units of
    messages that lack one (the batch form cannot express that); ``multimodal_header_index`` maps a reference to
    its header in ``multimodal_headers`` (-1: none). ``messages`` are the messages the columns came from, if any.
    """

    # The knittrans.wire.trajectory.TRAJECTORY_COLUMNS columns, by column name: str ones as sequences of strings
    # (tuples when read from a batch: the collector stops tracking tuples of strings), the others as arrays.
    plain: Mapping[str, Sequence]
    segment_offsets: np.ndarray
    segment_versions: np.ndarray  # uint64
    segment_tokens: np.ndarray  # uint64
    unit_offsets: np.ndarray
    unit_keys: Sequence[str]
    unit_fields: np.ndarray  # int64, indices into field_names
    field_names: list[str]
    unit_kinds: np.ndarray  # int64
    unit_alignments: np.ndarray  # int64 (proto FieldAlignment numbers; 0: none)
    unit_has_header: np.ndarray  # bool
    unit_headers: HeaderColumns
    multimodal_offsets: np.ndarray
    multimodal_keys: Sequence[str]
    multimodal_encoder_indices: np.ndarray  # int64, indices into encoders
    encoders: list[str]
    multimodal_costs: np.ndarray  # float64
    placeholder_starts: np.ndarray  # uint64
    placeholder_ends: np.ndarray  # uint64
    multimodal_kinds: np.ndarray  # int64
    multimodal_header_index: np.ndarray  # int64
    multimodal_headers: HeaderColumns
    scalar_offsets: np.ndarray
    scalar_names: list[str]
    scalar_values: np.ndarray  # float64
    messages: Sequence[trajectory_pb2.TrajectoryMetadata] | None = None
    # Per trajectory: its TrajectoryValues message (None where it has none); None when no trajectory has any.
    values: Sequence[trajectory_pb2.TrajectoryValues | None] | None = None
    # The plain columns the service reads by name (views of ``plain``).
    trajectory_ids: Sequence[str] = field(init=False)
    sample_ids: Sequence[str] = field(init=False)
    sources: Sequence[str] = field(init=False)
    rollout_steps: np.ndarray = field(init=False)  # uint64
    num_tokens: np.ndarray = field(init=False)  # uint64
    num_loss_tokens: np.ndarray = field(init=False)  # uint64
    accepted: np.ndarray = field(init=False)  # bool
    finished_at: np.ndarray = field(init=False)  # float64

    def __post_init__(self) -> None:
        for name in _NAMED_PLAIN_COLUMNS:
            object.__setattr__(self, name, self.plain[name])

    def __len__(self) -> int:
        return len(self.trajectory_ids)

    # ---- building ----------------------------------------------------------------------------------------------

    @staticmethod
    def from_messages(messages: Sequence[trajectory_pb2.TrajectoryMetadata]) -> TrajectoryColumns:
        lists = ColumnLists()
        lists.add_messages(messages)
        has_header = np.array(lists.multimodal_has_header, dtype=bool)
        plain = lists.plain_columns()
        return TrajectoryColumns(
            plain={spec.column: plain[spec.column] if spec.dtype == "str" else np.array(plain[spec.column], spec.dtype)
                   for spec in TRAJECTORY_COLUMNS},
            segment_offsets=_offsets(np.array(lists.segment_counts, dtype=np.int64)),
            segment_versions=np.array(lists.segment_versions, dtype=np.uint64),
            segment_tokens=np.array(lists.segment_tokens, dtype=np.uint64),
            unit_offsets=_offsets(np.array(lists.unit_counts, dtype=np.int64)),
            unit_keys=lists.unit_keys,
            unit_fields=np.array(lists.unit_fields, dtype=np.int64),
            field_names=list(lists.field_names),
            unit_kinds=np.array(lists.unit_kinds, dtype=np.int64),
            unit_alignments=np.array(lists.unit_alignments, dtype=np.int64),
            unit_has_header=np.array(lists.unit_has_header, dtype=bool),
            unit_headers=HeaderColumns.from_lists(lists.unit_headers),
            multimodal_offsets=_offsets(np.array(lists.multimodal_counts, dtype=np.int64)),
            multimodal_keys=lists.multimodal_keys,
            multimodal_encoder_indices=np.array(lists.multimodal_encoders, dtype=np.int64),
            encoders=list(lists.encoders),
            multimodal_costs=np.array(lists.multimodal_costs, dtype=np.float64),
            placeholder_starts=np.array(lists.placeholder_starts, dtype=np.uint64),
            placeholder_ends=np.array(lists.placeholder_ends, dtype=np.uint64),
            multimodal_kinds=np.array(lists.multimodal_kinds, dtype=np.int64),
            multimodal_header_index=_header_index(has_header),
            multimodal_headers=HeaderColumns.from_lists(lists.multimodal_headers),
            scalar_offsets=_offsets(np.array(lists.scalar_counts, dtype=np.int64)),
            scalar_names=lists.scalar_names,
            scalar_values=np.array(lists.scalar_values, dtype=np.float64),
            messages=tuple(messages),
            values=tuple(lists.values) if any(v is not None for v in lists.values) else None,
        )

    @staticmethod
    def from_proto(batch: trajectory_pb2.TrajectoryBatch) -> TrajectoryColumns:
        """Read a batch, checking that its columns fit together (``batch.<column>`` names a misfit)."""
        n = len(batch.trajectory_ids)
        for name in (*_PLAIN_COLUMN_NAMES, "segment_counts", "unit_counts", "multimodal_counts", "scalar_counts"):
            _check_length(name, getattr(batch, name), n, "one per trajectory")
        segment_offsets = _offsets(_column(batch.segment_counts, np.int64))
        unit_offsets = _offsets(_column(batch.unit_counts, np.int64))
        multimodal_offsets = _offsets(_column(batch.multimodal_counts, np.int64))
        scalar_offsets = _offsets(_column(batch.scalar_counts, np.int64))
        for names, offsets, what in (
            (("segment_versions", "segment_tokens"), segment_offsets, "the sum of segment_counts"),
            (("unit_keys", "unit_fields", "unit_kinds"), unit_offsets, "the sum of unit_counts"),
            (("multimodal_keys", "multimodal_encoders", "multimodal_costs", "placeholder_starts", "placeholder_ends",
              "multimodal_kinds", "multimodal_has_header"), multimodal_offsets, "the sum of multimodal_counts"),
            (("scalar_names", "scalar_values"), scalar_offsets, "the sum of scalar_counts"),
        ):
            for name in names:
                _check_length(name, getattr(batch, name), int(offsets[-1]), what)
        num_units = int(unit_offsets[-1])
        if batch.unit_alignments:
            _check_length("unit_alignments", batch.unit_alignments, num_units, "the sum of unit_counts, or none")
            unit_alignments = _column(batch.unit_alignments, np.int64)
        else:
            unit_alignments = np.zeros(num_units, dtype=np.int64)
        unit_fields = _indices(batch.unit_fields, len(batch.field_names), "unit_fields", "field_names")
        encoder_indices = _indices(batch.multimodal_encoders, len(batch.encoders), "multimodal_encoders", "encoders")
        has_header = _column(batch.multimodal_has_header, bool)
        scalar_names = list(batch.scalar_names)
        values = None
        if len(batch.values):
            _check_length("values", batch.values, n, "one per trajectory, or none")
            values = tuple(v if v.int_scalars or v.bool_scalars or v.metadata else None for v in batch.values)
        columns = TrajectoryColumns(
            plain={spec.column: tuple(getattr(batch, spec.column)) if spec.dtype == "str"
                   else _column(getattr(batch, spec.column), spec.dtype) for spec in TRAJECTORY_COLUMNS},
            segment_offsets=segment_offsets,
            segment_versions=_column(batch.segment_versions, np.uint64),
            segment_tokens=_column(batch.segment_tokens, np.uint64),
            unit_offsets=unit_offsets,
            unit_keys=tuple(batch.unit_keys),
            unit_fields=unit_fields,
            field_names=list(batch.field_names),
            unit_kinds=_column(batch.unit_kinds, np.int64),
            unit_alignments=unit_alignments,
            unit_has_header=np.ones(num_units, dtype=bool),
            unit_headers=HeaderColumns.from_proto(batch.unit_headers, num_units, "unit_headers"),
            multimodal_offsets=multimodal_offsets,
            multimodal_keys=tuple(batch.multimodal_keys),
            multimodal_encoder_indices=encoder_indices,
            encoders=list(batch.encoders),
            multimodal_costs=_column(batch.multimodal_costs, np.float64),
            placeholder_starts=_column(batch.placeholder_starts, np.uint64),
            placeholder_ends=_column(batch.placeholder_ends, np.uint64),
            multimodal_kinds=_column(batch.multimodal_kinds, np.int64),
            multimodal_header_index=_header_index(has_header),
            multimodal_headers=HeaderColumns.from_proto(
                batch.multimodal_headers, int(has_header.sum()), "multimodal_headers"
            ),
            scalar_offsets=scalar_offsets,
            scalar_names=scalar_names,
            scalar_values=_column(batch.scalar_values, np.float64),
            values=values if values is not None and any(v is not None for v in values) else None,
        )
        if scalar_names:
            columns._check_scalar_names()
        return columns

    def _check_scalar_names(self) -> None:
        """A message's scalars are a map; the batch form must not give one trajectory a name twice."""
        offsets = self.scalar_offsets.tolist()
        names = self.scalar_names
        for i in range(len(self)):
            start, end = offsets[i], offsets[i + 1]
            if end - start > 1 and len(set(names[start:end])) != end - start:
                seen: set[str] = set()
                for name in names[start:end]:
                    if name in seen:
                        raise InvalidArgument(f"scalar {name!r} appears twice", field=f"trajectories[{i}].scalars")
                    seen.add(name)

    # ---- decoded columns ---------------------------------------------------------------------------------------

    @cached_property
    def unit_field_names(self) -> tuple[str, ...]:
        """Per unit: its field name."""
        return tuple(map(self.field_names.__getitem__, self.unit_fields.tolist()))

    @cached_property
    def multimodal_encoders(self) -> tuple[str, ...]:
        """Per multimodal reference: its encoder's name."""
        return tuple(map(self.encoders.__getitem__, self.multimodal_encoder_indices.tolist()))

    # ---- per-element owners ------------------------------------------------------------------------------------

    @cached_property
    def segment_rows(self) -> np.ndarray:
        """Per segment: its trajectory."""
        return np.repeat(np.arange(len(self), dtype=np.int64), np.diff(self.segment_offsets))

    @cached_property
    def unit_rows(self) -> np.ndarray:
        return np.repeat(np.arange(len(self), dtype=np.int64), np.diff(self.unit_offsets))

    @cached_property
    def multimodal_rows(self) -> np.ndarray:
        return np.repeat(np.arange(len(self), dtype=np.int64), np.diff(self.multimodal_offsets))

    # ---- back to messages --------------------------------------------------------------------------------------

    @cached_property
    def _python(self) -> dict[str, list]:
        """Plain-Python numeric columns, for building messages (indexing numpy arrays one by one is slow)."""
        names = ("segment_offsets",
                 "segment_versions", "segment_tokens", "unit_offsets", "unit_kinds", "unit_alignments",
                 "multimodal_offsets",
                 "multimodal_costs", "placeholder_starts", "placeholder_ends", "multimodal_kinds",
                 "multimodal_header_index", "scalar_offsets", "scalar_values")
        return {name: tuple(getattr(self, name).tolist()) for name in names}  # untracked by the collector

    @cached_property
    def _plain_python(self) -> tuple[Sequence, ...]:
        """The plain columns as Python sequences, in TRAJECTORY_COLUMNS order."""
        return tuple(column if isinstance(column, (tuple, list)) else tuple(column.tolist())
                     for column in (self.plain[name] for name in _PLAIN_COLUMN_NAMES))

    def message_fields(self, i: int) -> dict:
        """Trajectory i as ``TrajectoryMetadata`` constructor fields: exactly what
        :func:`knittrans.wire.trajectory_to_proto` sets for its domain object (every placeholder is set)."""
        p = self._python
        s0, s1 = p["segment_offsets"][i], p["segment_offsets"][i + 1]
        versions, lengths = p["segment_versions"], p["segment_tokens"]
        u0, u1 = p["unit_offsets"][i], p["unit_offsets"][i + 1]
        keys, names, kinds, alignments = self.unit_keys, self.unit_field_names, p["unit_kinds"], p["unit_alignments"]
        unit_header = self.unit_headers.fields
        m0, m1 = p["multimodal_offsets"][i], p["multimodal_offsets"][i + 1]
        multimodal = []
        if m1 > m0:
            mm_keys, encoders, costs = self.multimodal_keys, self.multimodal_encoders, p["multimodal_costs"]
            starts, ends, mm_kinds = p["placeholder_starts"], p["placeholder_ends"], p["multimodal_kinds"]
            header_index = p["multimodal_header_index"]
            for k in range(m0, m1):
                ref = {"key": mm_keys[k], "encoder": encoders[k], "cost": costs[k],
                       "placeholder": {"start": starts[k], "end": ends[k]}, "kind": mm_kinds[k]}
                if header_index[k] >= 0:
                    ref["header"] = self.multimodal_headers.fields(header_index[k])
                multimodal.append(ref)
        c0, c1 = p["scalar_offsets"][i], p["scalar_offsets"][i + 1]
        values = self.values[i] if self.values is not None else None
        return {
            **({"values": values} if values is not None else {}),
            **{name: column[i] for name, column in zip(TRAJECTORY_FIELDS, self._plain_python, strict=True)},
            "segments": [{"version": versions[k], "num_tokens": lengths[k]} for k in range(s0, s1)],
            "units": [
                {"key": keys[k], "field_name": names[k], "kind": kinds[k], "header": unit_header(k),
                 **({"alignment": alignments[k]} if alignments[k] else {})}
                for k in range(u0, u1)
            ],
            "multimodal": multimodal,
            "scalars": dict(zip(self.scalar_names[c0:c1], p["scalar_values"][c0:c1], strict=True)) if c1 > c0 else {},
        }

    def message(self, i: int) -> trajectory_pb2.TrajectoryMetadata:
        """Trajectory i as the message it stands for (the original one, when the columns came from messages)."""
        if self.messages is not None:
            return self.messages[i]
        return self.canonical_message(i)

    def canonical_message(self, i: int) -> trajectory_pb2.TrajectoryMetadata:
        """Trajectory i as :func:`knittrans.wire.trajectory_to_proto` writes it, whichever form it came in:
        equal content gives equal deterministic serialisations."""
        if not self._all_units_have_headers:
            raise InvalidArgument("a unit has no header", field="units")
        return trajectory_pb2.TrajectoryMetadata(**self.message_fields(i))

    @cached_property
    def _all_units_have_headers(self) -> bool:
        return bool(self.unit_has_header.all())

    def take(self, rows: Sequence[int]) -> trajectory_pb2.TrajectoryBatch:
        """The batch of these trajectories, in this order (every unit must have a header)."""
        rows = np.asarray(rows, dtype=np.int64)
        row_list = rows.tolist()
        segments = gather_index(self.segment_offsets, rows)
        units = gather_index(self.unit_offsets, rows)
        refs = gather_index(self.multimodal_offsets, rows)
        scalars = gather_index(self.scalar_offsets, rows)
        unit_list, ref_list, scalar_list = units.tolist(), refs.tolist(), scalars.tolist()
        if not self.unit_has_header[units].all():
            raise InvalidArgument("a unit has no header", field="units")
        header_index = self.multimodal_header_index[refs]
        alignments = self.unit_alignments[units]
        plain = self.plain
        return trajectory_pb2.TrajectoryBatch(
            **{spec.column: [plain[spec.column][i] for i in row_list] if spec.dtype == "str"
               else plain[spec.column][rows].tolist() for spec in TRAJECTORY_COLUMNS},
            segment_counts=np.diff(self.segment_offsets)[rows].tolist(),
            segment_versions=self.segment_versions[segments].tolist(),
            segment_tokens=self.segment_tokens[segments].tolist(),
            unit_counts=np.diff(self.unit_offsets)[rows].tolist(),
            unit_keys=[self.unit_keys[k] for k in unit_list],
            unit_fields=self.unit_fields[units].tolist(),
            field_names=self.field_names,
            unit_kinds=self.unit_kinds[units].tolist(),
            unit_alignments=alignments.tolist() if alignments.any() else [],
            unit_headers=self.unit_headers.take(units),
            multimodal_counts=np.diff(self.multimodal_offsets)[rows].tolist(),
            multimodal_keys=[self.multimodal_keys[k] for k in ref_list],
            multimodal_encoders=self.multimodal_encoder_indices[refs].tolist(),
            encoders=self.encoders,
            multimodal_costs=self.multimodal_costs[refs].tolist(),
            placeholder_starts=self.placeholder_starts[refs].tolist(),
            placeholder_ends=self.placeholder_ends[refs].tolist(),
            multimodal_kinds=self.multimodal_kinds[refs].tolist(),
            multimodal_has_header=(header_index >= 0).tolist(),
            multimodal_headers=self.multimodal_headers.take(header_index[header_index >= 0]),
            scalar_counts=np.diff(self.scalar_offsets)[rows].tolist(),
            scalar_names=[self.scalar_names[k] for k in scalar_list],
            scalar_values=self.scalar_values[scalars].tolist(),
            values=self._values_column(row_list),
        )

    def values_of(self, i: int) -> trajectory_pb2.TrajectoryValues | None:
        """Trajectory i's values (None: it has none)."""
        return None if self.values is None else self.values[i]

    def _values_column(self, rows: list[int]) -> list[trajectory_pb2.TrajectoryValues]:
        if self.values is None or all(self.values[i] is None for i in rows):
            return []
        return [self.values[i] or trajectory_pb2.TrajectoryValues() for i in rows]


_PLAIN_COLUMN_NAMES = tuple(spec.column for spec in TRAJECTORY_COLUMNS)
_NAMED_PLAIN_COLUMNS = ("trajectory_ids", "sample_ids", "sources", "rollout_steps", "num_tokens", "num_loss_tokens",
                        "accepted", "finished_at")


def _indices(values: Sequence[int], size: int, name: str, names: str) -> np.ndarray:
    indices = _column(values, np.int64)
    if len(indices) and int(indices.max()) >= size:
        raise InvalidArgument(f"index {int(indices.max())} is outside {names} ({size} names)", field=f"batch.{name}")
    return indices


def _header_index(has_header: np.ndarray) -> np.ndarray:
    index = np.cumsum(has_header, dtype=np.int64) - 1
    index[~has_header] = -1
    return index


def messages_from_batch(batch: trajectory_pb2.TrajectoryBatch) -> list[trajectory_pb2.TrajectoryMetadata]:
    """Every trajectory of a batch as a message."""
    columns = TrajectoryColumns.from_proto(batch)
    return [columns.message(i) for i in range(len(columns))]
