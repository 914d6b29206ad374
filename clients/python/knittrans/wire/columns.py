"""The columnar form of many trajectories' metadata (``TrajectoryBatch`` in proto/knittrans/v1/trajectory.proto).

A report of a thousand trajectories as a thousand ``TrajectoryMetadata`` messages costs the admission service
about a hundred protobuf attribute reads per trajectory before it can even check them. As columns, the same
report is a few dozen packed arrays that it reads and checks whole (with numpy), and it builds a trajectory's
message only when it needs one (admission, release). :class:`~knittrans.client.admission.AdmissionClient`
sends this form; plain gRPC users may send either.

:func:`batch_from_metas` and :func:`batch_from_messages` build a batch. The service reads one with
:class:`knittrans.admission.service.trajectory_columns.TrajectoryColumns`, which fills the same
:class:`ColumnLists` from a report of messages, so both forms of one trajectory read the same.

A trajectory's plain per-trajectory fields (one value each: ids, counts, flags, times) are listed once, in
:data:`knittrans.wire.trajectory.TRAJECTORY_COLUMNS`; the appender, the batch writer and the service's reader
all follow that table, so a new field of that sort is one entry there (plus the ``.proto`` and
:mod:`knittrans.types`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from knittrans.errors import InvalidArgument
from knittrans.types import TrajectoryMeta
from knittrans.v1 import trajectory_pb2
from knittrans.wire.enums import ALIGNMENT_TO_PROTO, COVERAGE_TO_PROTO, DTYPE_TO_PROTO, UNIT_KIND_TO_PROTO
from knittrans.wire.trajectory import TRAJECTORY_COLUMNS, read_plain_fields
from knittrans.wire.values import has_values, values_to_proto

_HEADER_COLUMNS = ("dtypes", "ranks", "shape", "has_seq_axis", "seq_axes", "byte_lengths", "content_hashes",
                   "chunk_tokens")


class HeaderLists:
    __slots__ = _HEADER_COLUMNS

    def __init__(self) -> None:
        self.dtypes: list[int] = []
        self.ranks: list[int] = []
        self.shape: list[int] = []
        self.has_seq_axis: list[bool] = []
        self.seq_axes: list[int] = []
        self.byte_lengths: list[int] = []
        self.content_hashes: list[str] = []
        self.chunk_tokens: list[int] = []

    def add(self, header: Any, *, from_message: bool) -> None:
        shape = header.shape
        if from_message:  # proto numbers already (unknown ones included: the service's checks name them)
            dtype, seq_axis = header.dtype, header.seq_axis if header.HasField("seq_axis") else None
        else:
            dtype, seq_axis = DTYPE_TO_PROTO[header.dtype], header.seq_axis
        self.dtypes.append(dtype)
        self.ranks.append(len(shape))
        self.shape.extend(shape)
        self.has_seq_axis.append(seq_axis is not None)
        self.seq_axes.append(seq_axis or 0)
        self.byte_lengths.append(header.byte_length)
        self.content_hashes.append(header.content_hash)
        self.chunk_tokens.append(header.chunk_tokens)

    def add_missing(self) -> None:
        """A unit message without a header (invalid, but its trajectory must still be checked in place)."""
        for column in (self.dtypes, self.ranks, self.seq_axes, self.byte_lengths, self.chunk_tokens):
            column.append(0)
        self.has_seq_axis.append(False)
        self.content_hashes.append("")

    def to_proto(self) -> trajectory_pb2.UnitHeaderColumns:
        return trajectory_pb2.UnitHeaderColumns(**{name: getattr(self, name) for name in _HEADER_COLUMNS})


class ColumnLists:
    """Column lists filled trajectory by trajectory, from messages or domain objects."""

    def __init__(self) -> None:
        self.plain_rows: list[tuple[Any, ...]] = []  # per trajectory, its TRAJECTORY_COLUMNS values in order
        self.segment_counts: list[int] = []
        self.segment_versions: list[int] = []
        self.segment_tokens: list[int] = []
        self.unit_counts: list[int] = []
        self.unit_keys: list[str] = []
        self.unit_fields: list[int] = []
        self.field_names: dict[str, int] = {}  # name -> its index
        self.unit_kinds: list[int] = []
        self.unit_alignments: list[int] = []
        self.unit_coverages: list[int] = []
        self.unit_has_header: list[bool] = []
        self.unit_headers = HeaderLists()
        self.multimodal_counts: list[int] = []
        self.multimodal_keys: list[str] = []
        self.multimodal_encoders: list[int] = []
        self.encoders: dict[str, int] = {}
        self.multimodal_costs: list[float] = []
        self.placeholder_starts: list[int] = []
        self.placeholder_ends: list[int] = []
        self.multimodal_kinds: list[int] = []
        self.multimodal_has_header: list[bool] = []
        self.multimodal_headers = HeaderLists()
        self.scalar_counts: list[int] = []
        self.scalar_names: list[str] = []
        self.scalar_values: list[float] = []
        # Per trajectory: its TrajectoryValues message, None where it has none.
        self.values: list[trajectory_pb2.TrajectoryValues | None] = []

    def add_messages(self, messages: Iterable[trajectory_pb2.TrajectoryMetadata]) -> None:
        self._extend(messages, from_message=True)

    def add_metas(self, metas: Iterable[TrajectoryMeta]) -> None:
        self._extend(metas, from_message=False)

    def _extend(self, trajectories: Iterable[Any], *, from_message: bool) -> None:
        """The one appender: messages and domain objects have the same attribute names; ``from_message`` bridges
        the rest (enums as proto numbers, header presence, the scalars' container). The service reads reports of
        messages through it, so the list methods are looked up once per call, not once per trajectory."""
        plain_rows = self.plain_rows.append
        segment_counts, segment_versions = self.segment_counts.append, self.segment_versions.append
        segment_tokens = self.segment_tokens.append
        unit_counts, unit_keys, unit_fields = self.unit_counts.append, self.unit_keys.append, self.unit_fields.append
        unit_kinds, unit_alignments = self.unit_kinds.append, self.unit_alignments.append
        unit_coverages = self.unit_coverages.append
        unit_has_header, add_unit_header = self.unit_has_header.append, self.unit_headers.add
        multimodal_counts, multimodal_keys = self.multimodal_counts.append, self.multimodal_keys.append
        multimodal_encoders, multimodal_costs = self.multimodal_encoders.append, self.multimodal_costs.append
        placeholder_starts, placeholder_ends = self.placeholder_starts.append, self.placeholder_ends.append
        multimodal_kinds, multimodal_has_header = self.multimodal_kinds.append, self.multimodal_has_header.append
        add_multimodal_header = self.multimodal_headers.add
        scalar_counts, scalar_names, scalar_values = (self.scalar_counts.append, self.scalar_names.append,
                                                      self.scalar_values.append)
        names, encoders = self.field_names, self.encoders
        for t in trajectories:
            plain_rows(read_plain_fields(t))
            segments = t.segments
            segment_counts(len(segments))
            for segment in segments:
                segment_versions(segment.version)
                segment_tokens(segment.num_tokens)
            units = t.units
            unit_counts(len(units))
            for unit in units:
                unit_keys(unit.key)
                unit_fields(names.setdefault(unit.field_name, len(names)))
                if from_message:
                    unit_kinds(unit.kind)
                    unit_alignments(unit.alignment)
                    unit_coverages(unit.coverage)
                    header = unit.header if unit.HasField("header") else None
                else:
                    unit_kinds(UNIT_KIND_TO_PROTO[unit.kind])
                    unit_alignments(ALIGNMENT_TO_PROTO[unit.alignment])
                    unit_coverages(COVERAGE_TO_PROTO[unit.coverage])
                    header = unit.header
                unit_has_header(header is not None)
                if header is not None:
                    add_unit_header(header, from_message=from_message)
                else:
                    self.unit_headers.add_missing()
            multimodal = t.multimodal
            multimodal_counts(len(multimodal))
            for ref in multimodal:
                multimodal_keys(ref.key)
                multimodal_encoders(encoders.setdefault(ref.encoder, len(encoders)))
                multimodal_costs(ref.cost)
                span = ref.placeholder
                placeholder_starts(span.start)
                placeholder_ends(span.end)
                if from_message:
                    multimodal_kinds(ref.kind)
                    header = ref.header if ref.HasField("header") else None
                else:
                    multimodal_kinds(UNIT_KIND_TO_PROTO[ref.kind])
                    header = ref.header
                multimodal_has_header(header is not None)
                if header is not None:
                    add_multimodal_header(header, from_message=from_message)
            scalars = t.scalars.items() if from_message else t.scalars
            scalar_counts(len(scalars))
            for name, value in scalars:
                scalar_names(name)
                scalar_values(value)
            if from_message:
                self.values.append(t.values if has_values(t) else None)
            else:
                self.values.append(values_to_proto(t.values) if t.values else None)

    def values_column(self) -> list[trajectory_pb2.TrajectoryValues]:
        """``TrajectoryBatch.values``: one per trajectory, or none when no trajectory has any."""
        if not any(v is not None for v in self.values):
            return []
        return [trajectory_pb2.TrajectoryValues() if v is None else v for v in self.values]

    def plain_columns(self) -> dict[str, list[Any]]:
        """The :data:`TRAJECTORY_COLUMNS` values, by column name."""
        values = list(map(list, zip(*self.plain_rows, strict=True))) if self.plain_rows else [
            [] for _ in TRAJECTORY_COLUMNS]
        return {spec.column: column for spec, column in zip(TRAJECTORY_COLUMNS, values, strict=True)}

    def to_proto(self) -> trajectory_pb2.TrajectoryBatch:
        missing = self.unit_has_header.index(False) if not all(self.unit_has_header) else None
        if missing is not None:
            owners = np.repeat(np.arange(len(self.unit_counts)), self.unit_counts)
            i = int(owners[missing])
            j = missing - sum(self.unit_counts[:i])
            raise InvalidArgument("is required", field=f"trajectories[{i}].units[{j}].header")
        fields: dict[str, Any] = {name: value for name, value in vars(self).items()
                                  if name not in ("unit_has_header", "plain_rows", "values")}
        fields.update(self.plain_columns())
        fields["field_names"] = list(self.field_names)
        fields["encoders"] = list(self.encoders)
        for name in ("unit_alignments", "unit_coverages"):  # left empty when no unit has one
            if not any(fields[name]):
                fields[name] = []
        for spec in TRAJECTORY_COLUMNS:
            if spec.sparse and not any(fields[spec.column]):
                fields[spec.column] = []
        fields["unit_headers"] = self.unit_headers.to_proto()
        fields["multimodal_headers"] = self.multimodal_headers.to_proto()
        fields["values"] = self.values_column()
        return trajectory_pb2.TrajectoryBatch(**fields)


def batch_from_messages(messages: Sequence[trajectory_pb2.TrajectoryMetadata]) -> trajectory_pb2.TrajectoryBatch:
    """The batch of these messages. A unit without a header has no columnar form: that raises
    :class:`InvalidArgument` naming it (the service rejects such a report whichever form it comes in)."""
    lists = ColumnLists()
    lists.add_messages(messages)
    return lists.to_proto()


def batch_from_metas(metas: Sequence[TrajectoryMeta]) -> trajectory_pb2.TrajectoryBatch:
    """The batch of these (validated) domain objects."""
    lists = ColumnLists()
    lists.add_metas(metas)
    return lists.to_proto()
