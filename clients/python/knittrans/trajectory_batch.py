"""The columnar form of many trajectories' metadata (``TrajectoryBatch`` in proto/knittrans/v1/trajectory.proto).

A report of a thousand trajectories as a thousand ``TrajectoryMetadata`` messages costs the admission service
about a hundred protobuf attribute reads per trajectory before it can even check them. As columns, the same
report is a few dozen packed arrays that it reads and checks whole (with numpy), and it builds a trajectory's
message only when it needs one (admission, release). :class:`~knittrans.client.admission.AdmissionClient`
sends this form; plain gRPC users may send either.

:func:`batch_from_metas` and :func:`batch_from_messages` build a batch. The service reads one with
:class:`knittrans.admission.service.trajectory_columns.TrajectoryColumns`, which fills the same
:class:`ColumnLists` from a report of messages, so both forms of one trajectory read the same.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from knittrans.errors import InvalidArgument
from knittrans.types import DType, FieldAlignment, TrajectoryMeta, UnitHeader, UnitKind
from knittrans.v1 import trajectory_pb2

_DTYPE_TO_PROTO = {dtype: trajectory_pb2.DType.Value(f"D_TYPE_{dtype.name}") for dtype in DType}
_KIND_TO_PROTO = {kind: trajectory_pb2.UnitKind.Value(f"UNIT_KIND_{kind.name}") for kind in UnitKind}
_ALIGNMENT_TO_PROTO = {
    None: trajectory_pb2.FIELD_ALIGNMENT_UNSPECIFIED,
    **{a: trajectory_pb2.FieldAlignment.Value(f"FIELD_ALIGNMENT_{a.name}") for a in FieldAlignment},
}

_HEADER_COLUMNS = ("dtypes", "ranks", "shape", "has_seq_axis", "seq_axes", "byte_lengths", "content_hashes",
                   "chunk_tokens")


class HeaderLists:
    __slots__ = _HEADER_COLUMNS

    def __init__(self) -> None:
        for name in _HEADER_COLUMNS:
            setattr(self, name, [])

    def add_message(self, header: trajectory_pb2.UnitHeader) -> None:
        shape = header.shape
        self.dtypes.append(header.dtype)
        self.ranks.append(len(shape))
        self.shape.extend(shape)
        has_axis = header.HasField("seq_axis")
        self.has_seq_axis.append(has_axis)
        self.seq_axes.append(header.seq_axis if has_axis else 0)
        self.byte_lengths.append(header.byte_length)
        self.content_hashes.append(header.content_hash)
        self.chunk_tokens.append(header.chunk_tokens)

    def add_meta(self, header: UnitHeader) -> None:
        self.dtypes.append(_DTYPE_TO_PROTO[header.dtype])
        self.ranks.append(len(header.shape))
        self.shape.extend(header.shape)
        self.has_seq_axis.append(header.seq_axis is not None)
        self.seq_axes.append(header.seq_axis or 0)
        self.byte_lengths.append(header.byte_length)
        self.content_hashes.append(header.content_hash)
        self.chunk_tokens.append(header.chunk_tokens)

    def add_missing(self) -> None:
        """A unit message without a header (invalid, but its trajectory must still be checked in place)."""
        for name in ("dtypes", "ranks", "seq_axes", "byte_lengths", "chunk_tokens"):
            getattr(self, name).append(0)
        self.has_seq_axis.append(False)
        self.content_hashes.append("")

    def to_proto(self) -> trajectory_pb2.UnitHeaderColumns:
        return trajectory_pb2.UnitHeaderColumns(**{name: getattr(self, name) for name in _HEADER_COLUMNS})


class ColumnLists:
    """Column lists filled trajectory by trajectory, from messages or domain objects."""

    def __init__(self) -> None:
        self.trajectory_ids: list[str] = []
        self.sample_ids: list[str] = []
        self.sources: list[str] = []
        self.rollout_steps: list[int] = []
        self.num_tokens: list[int] = []
        self.num_loss_tokens: list[int] = []
        self.accepted: list[bool] = []
        self.finished_at: list[float] = []
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

    def add_message(self, m: trajectory_pb2.TrajectoryMetadata) -> None:
        self.trajectory_ids.append(m.trajectory_id)
        self.sample_ids.append(m.sample_id)
        self.sources.append(m.source)
        self.rollout_steps.append(m.rollout_step)
        self.num_tokens.append(m.num_tokens)
        self.num_loss_tokens.append(m.num_loss_tokens)
        self.accepted.append(m.accepted)
        self.finished_at.append(m.finished_at)
        segments = m.segments
        self.segment_counts.append(len(segments))
        for segment in segments:
            self.segment_versions.append(segment.version)
            self.segment_tokens.append(segment.num_tokens)
        units = m.units
        self.unit_counts.append(len(units))
        names = self.field_names
        for unit in units:
            self.unit_keys.append(unit.key)
            self.unit_fields.append(names.setdefault(unit.field_name, len(names)))
            self.unit_kinds.append(unit.kind)
            self.unit_alignments.append(unit.alignment)
            if unit.HasField("header"):
                self.unit_has_header.append(True)
                self.unit_headers.add_message(unit.header)
            else:
                self.unit_has_header.append(False)
                self.unit_headers.add_missing()
        multimodal = m.multimodal
        self.multimodal_counts.append(len(multimodal))
        encoders = self.encoders
        for ref in multimodal:
            self.multimodal_keys.append(ref.key)
            self.multimodal_encoders.append(encoders.setdefault(ref.encoder, len(encoders)))
            self.multimodal_costs.append(ref.cost)
            span = ref.placeholder
            self.placeholder_starts.append(span.start)
            self.placeholder_ends.append(span.end)
            self.multimodal_kinds.append(ref.kind)
            has_header = ref.HasField("header")
            self.multimodal_has_header.append(has_header)
            if has_header:
                self.multimodal_headers.add_message(ref.header)
        scalars = m.scalars
        self.scalar_counts.append(len(scalars))
        for name, value in scalars.items():
            self.scalar_names.append(name)
            self.scalar_values.append(value)

    def add_meta(self, meta: TrajectoryMeta) -> None:
        self.trajectory_ids.append(meta.trajectory_id)
        self.sample_ids.append(meta.sample_id)
        self.sources.append(meta.source)
        self.rollout_steps.append(meta.rollout_step)
        self.num_tokens.append(meta.num_tokens)
        self.num_loss_tokens.append(meta.num_loss_tokens)
        self.accepted.append(meta.accepted)
        self.finished_at.append(meta.finished_at)
        self.segment_counts.append(len(meta.segments))
        for segment in meta.segments:
            self.segment_versions.append(segment.version)
            self.segment_tokens.append(segment.num_tokens)
        self.unit_counts.append(len(meta.units))
        names = self.field_names
        for unit in meta.units:
            self.unit_keys.append(unit.key)
            self.unit_fields.append(names.setdefault(unit.field_name, len(names)))
            self.unit_kinds.append(_KIND_TO_PROTO[unit.kind])
            self.unit_alignments.append(_ALIGNMENT_TO_PROTO[unit.alignment])
            self.unit_has_header.append(True)
            self.unit_headers.add_meta(unit.header)
        self.multimodal_counts.append(len(meta.multimodal))
        encoders = self.encoders
        for ref in meta.multimodal:
            self.multimodal_keys.append(ref.key)
            self.multimodal_encoders.append(encoders.setdefault(ref.encoder, len(encoders)))
            self.multimodal_costs.append(ref.cost)
            self.placeholder_starts.append(ref.placeholder.start)
            self.placeholder_ends.append(ref.placeholder.end)
            self.multimodal_kinds.append(_KIND_TO_PROTO[ref.kind])
            self.multimodal_has_header.append(ref.header is not None)
            if ref.header is not None:
                self.multimodal_headers.add_meta(ref.header)
        self.scalar_counts.append(len(meta.scalars))
        for name, value in meta.scalars:
            self.scalar_names.append(name)
            self.scalar_values.append(value)

    def to_proto(self) -> trajectory_pb2.TrajectoryBatch:
        missing = self.unit_has_header.index(False) if not all(self.unit_has_header) else None
        if missing is not None:
            owners = np.repeat(np.arange(len(self.unit_counts)), self.unit_counts)
            i = int(owners[missing])
            j = missing - sum(self.unit_counts[:i])
            raise InvalidArgument("is required", field=f"trajectories[{i}].units[{j}].header")
        fields = {name: value for name, value in vars(self).items() if name not in ("unit_has_header",)}
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
