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

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np

from knittrans.errors import InvalidArgument
from knittrans.types import TrajectoryMeta
from knittrans.v1 import trajectory_pb2
from knittrans.wire.enums import ALIGNMENT_TO_PROTO, DTYPE_TO_PROTO, UNIT_KIND_TO_PROTO
from knittrans.wire.trajectory import TRAJECTORY_COLUMNS, read_plain_fields

_HEADER_COLUMNS = ("dtypes", "ranks", "shape", "has_seq_axis", "seq_axes", "byte_lengths", "content_hashes",
                   "chunk_tokens")


@dataclass(frozen=True)
class _Reading:
    """How to read one source form (messages or domain objects): the rest is the same for both."""

    kind_number: Callable[[Any], int]
    alignment_number: Callable[[Any], int]
    dtype_number: Callable[[Any], int]
    header: Callable[[Any], Any]  # a unit's or reference's header; None when it has none
    seq_axis: Callable[[Any], int | None]
    scalars: Callable[[Any], Iterable[tuple[str, float]]]


# Messages carry proto numbers already (unknown ones included: the service's checks name them).
_MESSAGES = _Reading(
    kind_number=int,
    alignment_number=int,
    dtype_number=int,
    header=lambda part: part.header if part.HasField("header") else None,
    seq_axis=lambda header: header.seq_axis if header.HasField("seq_axis") else None,
    scalars=lambda message: message.scalars.items(),
)
_METAS = _Reading(
    kind_number=UNIT_KIND_TO_PROTO.__getitem__,
    alignment_number=ALIGNMENT_TO_PROTO.__getitem__,
    dtype_number=DTYPE_TO_PROTO.__getitem__,
    header=attrgetter("header"),
    seq_axis=attrgetter("seq_axis"),
    scalars=attrgetter("scalars"),
)


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

    def add(self, header: Any, reading: _Reading) -> None:
        shape = header.shape
        self.dtypes.append(reading.dtype_number(header.dtype))
        self.ranks.append(len(shape))
        self.shape.extend(shape)
        seq_axis = reading.seq_axis(header)
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

    def add_message(self, message: trajectory_pb2.TrajectoryMetadata) -> None:
        self._add(message, _MESSAGES)

    def add_meta(self, meta: TrajectoryMeta) -> None:
        self._add(meta, _METAS)

    def _add(self, t: Any, reading: _Reading) -> None:
        """The one appender: messages and domain objects have the same attribute names; ``reading`` bridges
        the rest (enums as proto numbers, header presence, the scalars' container)."""
        self.plain_rows.append(read_plain_fields(t))
        segments = t.segments
        self.segment_counts.append(len(segments))
        for segment in segments:
            self.segment_versions.append(segment.version)
            self.segment_tokens.append(segment.num_tokens)
        units = t.units
        self.unit_counts.append(len(units))
        names = self.field_names
        kind_number, alignment_number, header_of = reading.kind_number, reading.alignment_number, reading.header
        for unit in units:
            self.unit_keys.append(unit.key)
            self.unit_fields.append(names.setdefault(unit.field_name, len(names)))
            self.unit_kinds.append(kind_number(unit.kind))
            self.unit_alignments.append(alignment_number(unit.alignment))
            header = header_of(unit)
            if header is not None:
                self.unit_has_header.append(True)
                self.unit_headers.add(header, reading)
            else:
                self.unit_has_header.append(False)
                self.unit_headers.add_missing()
        multimodal = t.multimodal
        self.multimodal_counts.append(len(multimodal))
        encoders = self.encoders
        for ref in multimodal:
            self.multimodal_keys.append(ref.key)
            self.multimodal_encoders.append(encoders.setdefault(ref.encoder, len(encoders)))
            self.multimodal_costs.append(ref.cost)
            span = ref.placeholder
            self.placeholder_starts.append(span.start)
            self.placeholder_ends.append(span.end)
            self.multimodal_kinds.append(kind_number(ref.kind))
            header = header_of(ref)
            self.multimodal_has_header.append(header is not None)
            if header is not None:
                self.multimodal_headers.add(header, reading)
        scalars = reading.scalars(t)
        count = len(self.scalar_names)
        for name, value in scalars:
            self.scalar_names.append(name)
            self.scalar_values.append(value)
        self.scalar_counts.append(len(self.scalar_names) - count)

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
                                  if name not in ("unit_has_header", "plain_rows")}
        fields.update(self.plain_columns())
        fields["field_names"] = list(self.field_names)
        fields["encoders"] = list(self.encoders)
        if not any(self.unit_alignments):  # the column is left empty when no unit has an alignment
            fields["unit_alignments"] = []
        fields["unit_headers"] = self.unit_headers.to_proto()
        fields["multimodal_headers"] = self.multimodal_headers.to_proto()
        return trajectory_pb2.TrajectoryBatch(**fields)


def batch_from_messages(messages: Sequence[trajectory_pb2.TrajectoryMetadata]) -> trajectory_pb2.TrajectoryBatch:
    """The batch of these messages. A unit without a header has no columnar form: that raises
    :class:`InvalidArgument` naming it (the service rejects such a report whichever form it comes in)."""
    lists = ColumnLists()
    for message in messages:
        lists.add_message(message)
    return lists.to_proto()


def batch_from_metas(metas: Sequence[TrajectoryMeta]) -> trajectory_pb2.TrajectoryBatch:
    """The batch of these (validated) domain objects."""
    lists = ColumnLists()
    for meta in metas:
        lists.add_meta(meta)
    return lists.to_proto()
