"""Reading the columnar form of many trajectories' metadata (``TrajectoryBatch``), on the admission service's side.

:class:`TrajectoryColumns` reads a batch (or a report of messages) into arrays, checks that its columns fit
together (naming ``batch.<column>``), and gives back trajectory ``i`` as the message it stands for
(:meth:`TrajectoryColumns.message`): the same message :func:`knittrans.wire.trajectory_to_proto` makes of the
trajectory's domain object, so both forms of one trajectory are interchangeable. The SDK builds batches
(:mod:`knittrans.wire.columns`); only the service reads them.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from knittrans.admission.service.header_columns import (
    HeaderColumns,
    check_length,
    column_array,
    gather_index,
    offsets_of,
)
from knittrans.errors import InvalidArgument
from knittrans.v1 import trajectory_pb2
from knittrans.wire.columns import ColumnLists
from knittrans.wire.trajectory import TRAJECTORY_COLUMNS, TRAJECTORY_FIELDS

__all__ = ["HeaderColumns", "TrajectoryColumns", "gather_index", "messages_from_batch"]


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
    unit_coverages: np.ndarray  # int64 (proto TokenCoverage numbers; 0: the whole sequence)
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
    response_starts: np.ndarray = field(init=False)  # uint64

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
            segment_offsets=offsets_of(np.array(lists.segment_counts, dtype=np.int64)),
            segment_versions=np.array(lists.segment_versions, dtype=np.uint64),
            segment_tokens=np.array(lists.segment_tokens, dtype=np.uint64),
            unit_offsets=offsets_of(np.array(lists.unit_counts, dtype=np.int64)),
            unit_keys=lists.unit_keys,
            unit_fields=np.array(lists.unit_fields, dtype=np.int64),
            field_names=list(lists.field_names),
            unit_kinds=np.array(lists.unit_kinds, dtype=np.int64),
            unit_alignments=np.array(lists.unit_alignments, dtype=np.int64),
            unit_coverages=np.array(lists.unit_coverages, dtype=np.int64),
            unit_has_header=np.array(lists.unit_has_header, dtype=bool),
            unit_headers=HeaderColumns.from_lists(lists.unit_headers),
            multimodal_offsets=offsets_of(np.array(lists.multimodal_counts, dtype=np.int64)),
            multimodal_keys=lists.multimodal_keys,
            multimodal_encoder_indices=np.array(lists.multimodal_encoders, dtype=np.int64),
            encoders=list(lists.encoders),
            multimodal_costs=np.array(lists.multimodal_costs, dtype=np.float64),
            placeholder_starts=np.array(lists.placeholder_starts, dtype=np.uint64),
            placeholder_ends=np.array(lists.placeholder_ends, dtype=np.uint64),
            multimodal_kinds=np.array(lists.multimodal_kinds, dtype=np.int64),
            multimodal_header_index=_header_index(has_header),
            multimodal_headers=HeaderColumns.from_lists(lists.multimodal_headers),
            scalar_offsets=offsets_of(np.array(lists.scalar_counts, dtype=np.int64)),
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
            if name not in _SPARSE_COLUMNS or len(getattr(batch, name)):
                check_length(name, getattr(batch, name), n, "one per trajectory")
        segment_offsets = offsets_of(column_array(batch.segment_counts, np.int64))
        unit_offsets = offsets_of(column_array(batch.unit_counts, np.int64))
        multimodal_offsets = offsets_of(column_array(batch.multimodal_counts, np.int64))
        scalar_offsets = offsets_of(column_array(batch.scalar_counts, np.int64))
        for names, offsets, what in (
            (("segment_versions", "segment_tokens"), segment_offsets, "the sum of segment_counts"),
            (("unit_keys", "unit_fields", "unit_kinds"), unit_offsets, "the sum of unit_counts"),
            (("multimodal_keys", "multimodal_encoders", "multimodal_costs", "placeholder_starts", "placeholder_ends",
              "multimodal_kinds", "multimodal_has_header"), multimodal_offsets, "the sum of multimodal_counts"),
            (("scalar_names", "scalar_values"), scalar_offsets, "the sum of scalar_counts"),
        ):
            for name in names:
                check_length(name, getattr(batch, name), int(offsets[-1]), what)
        num_units = int(unit_offsets[-1])
        unit_alignments, unit_coverages = (_sparse_unit_column(batch, name, num_units)
                                           for name in ("unit_alignments", "unit_coverages"))
        unit_fields = _indices(batch.unit_fields, len(batch.field_names), "unit_fields", "field_names")
        encoder_indices = _indices(batch.multimodal_encoders, len(batch.encoders), "multimodal_encoders", "encoders")
        has_header = column_array(batch.multimodal_has_header, bool)
        scalar_names = list(batch.scalar_names)
        values = None
        if len(batch.values):
            check_length("values", batch.values, n, "one per trajectory, or none")
            values = tuple(v if v.int_scalars or v.bool_scalars or v.metadata else None for v in batch.values)
        columns = TrajectoryColumns(
            plain={spec.column: _strings(getattr(batch, spec.column), spec.column in _SHARED_COLUMNS)
                   if spec.dtype == "str"
                   else np.zeros(n, spec.dtype) if spec.sparse and not len(getattr(batch, spec.column))
                   else column_array(getattr(batch, spec.column), spec.dtype) for spec in TRAJECTORY_COLUMNS},
            segment_offsets=segment_offsets,
            segment_versions=column_array(batch.segment_versions, np.uint64),
            segment_tokens=column_array(batch.segment_tokens, np.uint64),
            unit_offsets=unit_offsets,
            unit_keys=tuple(batch.unit_keys),
            unit_fields=unit_fields,
            field_names=list(batch.field_names),
            unit_kinds=column_array(batch.unit_kinds, np.int64),
            unit_alignments=unit_alignments,
            unit_coverages=unit_coverages,
            unit_has_header=np.ones(num_units, dtype=bool),
            unit_headers=HeaderColumns.from_proto(batch.unit_headers, num_units, "unit_headers"),
            multimodal_offsets=multimodal_offsets,
            multimodal_keys=_strings(batch.multimodal_keys, shared=True),
            multimodal_encoder_indices=encoder_indices,
            encoders=list(batch.encoders),
            multimodal_costs=column_array(batch.multimodal_costs, np.float64),
            placeholder_starts=column_array(batch.placeholder_starts, np.uint64),
            placeholder_ends=column_array(batch.placeholder_ends, np.uint64),
            multimodal_kinds=column_array(batch.multimodal_kinds, np.int64),
            multimodal_header_index=_header_index(has_header),
            multimodal_headers=HeaderColumns.from_proto(
                batch.multimodal_headers, int(has_header.sum()), "multimodal_headers"
            ),
            scalar_offsets=scalar_offsets,
            scalar_names=scalar_names,
            scalar_values=column_array(batch.scalar_values, np.float64),
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
                 "unit_coverages",
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
        coverages = p["unit_coverages"]
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
                 **({"alignment": alignments[k]} if alignments[k] else {}),
                 **({"coverage": coverages[k]} if coverages[k] else {})}
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
        return self._batch(rows, *(gather_index(offsets, rows) for offsets in self._element_offsets))

    def take_range(self, start: int, stop: int) -> trajectory_pb2.TrajectoryBatch:
        """The batch of trajectories ``start`` to ``stop`` (exclusive): :meth:`take` of a contiguous run, cut with
        slices (a DP rank's trajectories, from the mini-batch's columns put in rank order)."""
        return self._batch(slice(start, stop), *(slice(int(offsets[start]), int(offsets[stop]))
                                                 for offsets in self._element_offsets))

    @property
    def _element_offsets(self) -> tuple[np.ndarray, ...]:
        return self.segment_offsets, self.unit_offsets, self.multimodal_offsets, self.scalar_offsets

    def _batch(self, rows: np.ndarray | slice, segments: np.ndarray | slice, units: np.ndarray | slice,
               refs: np.ndarray | slice, scalars: np.ndarray | slice) -> trajectory_pb2.TrajectoryBatch:
        """The batch of the trajectories at ``rows`` (index arrays or slices), whose elements are at the others."""
        if not self.unit_has_header[units].all():
            raise InvalidArgument("a unit has no header", field="units")
        header_index = self.multimodal_header_index[refs]
        alignments, coverages = self.unit_alignments[units], self.unit_coverages[units]
        plain = self.plain
        return trajectory_pb2.TrajectoryBatch(
            **{spec.column: _at(plain[spec.column], rows) if spec.dtype == "str"
               else [] if spec.sparse and not plain[spec.column][rows].any()
               else plain[spec.column][rows].tolist() for spec in TRAJECTORY_COLUMNS},
            segment_counts=np.diff(self.segment_offsets)[rows].tolist(),
            segment_versions=self.segment_versions[segments].tolist(),
            segment_tokens=self.segment_tokens[segments].tolist(),
            unit_counts=np.diff(self.unit_offsets)[rows].tolist(),
            unit_keys=_at(self.unit_keys, units),
            unit_fields=self.unit_fields[units].tolist(),
            field_names=self.field_names,
            unit_kinds=self.unit_kinds[units].tolist(),
            unit_alignments=alignments.tolist() if alignments.any() else [],
            unit_coverages=coverages.tolist() if coverages.any() else [],
            unit_headers=self.unit_headers.take(units),
            multimodal_counts=np.diff(self.multimodal_offsets)[rows].tolist(),
            multimodal_keys=_at(self.multimodal_keys, refs),
            multimodal_encoders=self.multimodal_encoder_indices[refs].tolist(),
            encoders=self.encoders,
            multimodal_costs=self.multimodal_costs[refs].tolist(),
            placeholder_starts=self.placeholder_starts[refs].tolist(),
            placeholder_ends=self.placeholder_ends[refs].tolist(),
            multimodal_kinds=self.multimodal_kinds[refs].tolist(),
            multimodal_has_header=(header_index >= 0).tolist(),
            multimodal_headers=self.multimodal_headers.take(header_index[header_index >= 0]),
            scalar_counts=np.diff(self.scalar_offsets)[rows].tolist(),
            scalar_names=_at(self.scalar_names, scalars),
            scalar_values=self.scalar_values[scalars].tolist(),
            values=self._values_column(rows),
        )

    def values_of(self, i: int) -> trajectory_pb2.TrajectoryValues | None:
        """Trajectory i's values (None: it has none)."""
        return None if self.values is None else self.values[i]

    def _values_column(self, rows: np.ndarray | slice) -> list[trajectory_pb2.TrajectoryValues]:
        if self.values is None:
            return []
        values = _at(self.values, rows)
        if all(v is None for v in values):
            return []
        return [v or trajectory_pb2.TrajectoryValues() for v in values]


_PLAIN_COLUMN_NAMES = tuple(spec.column for spec in TRAJECTORY_COLUMNS)
_NAMED_PLAIN_COLUMNS = ("trajectory_ids", "sample_ids", "sources", "rollout_steps", "num_tokens", "num_loss_tokens",
                        "accepted", "finished_at", "response_starts")
_SPARSE_COLUMNS = frozenset(spec.column for spec in TRAJECTORY_COLUMNS if spec.sparse)
# Strings that repeat across trajectories (the trajectories of one sample share its id and its multimodal inputs):
# interned, so that the ledger, the index and the engine hold one object per distinct value, not one per report
# row (a pending trajectory's memory, issue 15).
_SHARED_COLUMNS = frozenset(("sample_ids", "sources"))


def _strings(values: Sequence[str], shared: bool) -> tuple[str, ...]:
    return tuple(map(sys.intern, values)) if shared else tuple(values)


def _at(values: Sequence, index: np.ndarray | slice) -> Sequence:
    """The elements of a sequence (strings, or packed digests) at an index array or a slice, as a sequence."""
    if isinstance(index, slice):
        if hasattr(values, "gather"):  # packed digests: one hex conversion, not one per digest
            return values.gather(np.arange(*index.indices(len(values)), dtype=np.int64))
        return values[index]
    return list(map(values.__getitem__, index.tolist()))  # map: the lookups run in C


def _sparse_unit_column(batch: trajectory_pb2.TrajectoryBatch, name: str, num_units: int) -> np.ndarray:
    """A per-unit enum column that is left empty when every unit has 0 there."""
    values = getattr(batch, name)
    if not values:
        return np.zeros(num_units, dtype=np.int64)
    check_length(name, values, num_units, "the sum of unit_counts, or none")
    return column_array(values, np.int64)


def _indices(values: Sequence[int], size: int, name: str, names: str) -> np.ndarray:
    indices = column_array(values, np.int64)
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
