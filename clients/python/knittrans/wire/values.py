"""Translation between ``TrajectoryValues`` messages and :class:`knittrans.values.TrajectoryValues`."""

from __future__ import annotations

from functools import partial

from knittrans.errors import InvalidArgument, within
from knittrans.v1 import trajectory_pb2
from knittrans.values import NO_VALUES, MetadataKind, MetadataValue, TrajectoryValues

# MetadataValue's oneof member for each kind.
METADATA_MEMBER: dict[MetadataKind, str] = {MetadataKind.STR: "text", MetadataKind.BYTES: "data",
                                            MetadataKind.JSON: "json"}
METADATA_KIND_OF_MEMBER: dict[str, MetadataKind] = {member: kind for kind, member in METADATA_MEMBER.items()}


def metadata_value_to_proto(value: MetadataValue) -> trajectory_pb2.MetadataValue:
    message = trajectory_pb2.MetadataValue()
    setattr(message, METADATA_MEMBER[value.kind], value.value)
    return message


def metadata_value_from_proto(message: trajectory_pb2.MetadataValue) -> MetadataValue:
    member = message.WhichOneof("value")
    if member is None:
        raise InvalidArgument("has no value", field="value")
    return MetadataValue(kind=METADATA_KIND_OF_MEMBER[member], value=getattr(message, member))


def values_to_proto(values: TrajectoryValues) -> trajectory_pb2.TrajectoryValues:
    return trajectory_pb2.TrajectoryValues(
        int_scalars=dict(values.int_scalars), bool_scalars=dict(values.bool_scalars),
        metadata={name: metadata_value_to_proto(value) for name, value in values.metadata},
    )


def values_from_proto(message: trajectory_pb2.TrajectoryValues) -> TrajectoryValues:
    metadata = [(name, within(f"values.metadata.{name}", partial(metadata_value_from_proto, value)))
                for name, value in sorted(message.metadata.items())]
    return TrajectoryValues(int_scalars=tuple(message.int_scalars.items()),
                            bool_scalars=tuple(message.bool_scalars.items()), metadata=tuple(metadata))


def has_values(message: trajectory_pb2.TrajectoryMetadata) -> bool:
    return message.HasField("values") and bool(
        message.values.int_scalars or message.values.bool_scalars or message.values.metadata)


def trajectory_values(message: trajectory_pb2.TrajectoryMetadata) -> TrajectoryValues:
    """A trajectory message's values (validated)."""
    return values_from_proto(message.values) if has_values(message) else NO_VALUES


def trusted_values(message: trajectory_pb2.TrajectoryMetadata) -> TrajectoryValues:
    """:func:`trajectory_values` without re-validation, for reports the service's ingest check accepted."""
    if not has_values(message):
        return NO_VALUES
    values = message.values
    instance = object.__new__(TrajectoryValues)
    metadata = []
    for name, value in sorted(values.metadata.items()):
        member = value.WhichOneof("value")
        item = object.__new__(MetadataValue)
        item.__dict__.update(kind=METADATA_KIND_OF_MEMBER[member], value=getattr(value, member))
        metadata.append((name, item))
    instance.__dict__.update(int_scalars=tuple(sorted(values.int_scalars.items())),
                             bool_scalars=tuple(sorted(values.bool_scalars.items())), metadata=tuple(metadata))
    return instance
