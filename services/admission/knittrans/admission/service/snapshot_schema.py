"""The job's trajectory schema (:class:`~knittrans.admission.service.schema.JobSchema`) in a snapshot, and back:
its stored fields (each per-token field's coverage included), its scalar and metadata rules, and whether the
config declared it. Derived schemas exist only in the ledger (the first accepted trajectory fixed them, possibly
long released), so a snapshot must carry them."""

from __future__ import annotations

from knittrans.admission.service.schema import FieldSchema, JobSchema
from knittrans.trajectory_schema import MetadataSchema, ScalarSchema
from knittrans.v1 import snapshot_pb2
from knittrans.values import MetadataKind, ScalarKind

_SCALAR_TO_PROTO = {ScalarKind.FLOAT: snapshot_pb2.SCALAR_VALUE_KIND_FLOAT,
                    ScalarKind.INT: snapshot_pb2.SCALAR_VALUE_KIND_INT,
                    ScalarKind.BOOL: snapshot_pb2.SCALAR_VALUE_KIND_BOOL}
_SCALAR_FROM_PROTO = {number: kind for kind, number in _SCALAR_TO_PROTO.items()}
_METADATA_TO_PROTO = {MetadataKind.STR: snapshot_pb2.METADATA_VALUE_KIND_STR,
                      MetadataKind.BYTES: snapshot_pb2.METADATA_VALUE_KIND_BYTES,
                      MetadataKind.JSON: snapshot_pb2.METADATA_VALUE_KIND_JSON}
_METADATA_FROM_PROTO = {number: kind for kind, number in _METADATA_TO_PROTO.items()}


def write_schema(message: snapshot_pb2.JobSchemaSnapshot, schema: JobSchema) -> None:
    message.SetInParent()  # present even for a schema without fields
    for name, field in schema.fields.items():
        message.fields.add(name=name, kind=field.kind, dtype=field.dtype,
                           has_trailing_shape=field.trailing_shape is not None,
                           trailing_shape=field.trailing_shape or (), coverage=field.coverage)
    for name, scalar in schema.scalars.items():
        message.scalars.add(name=name, kind=_SCALAR_TO_PROTO[scalar.kind], required=scalar.required)
    for name, rule in schema.metadata.items():
        message.metadata.add(name=name, kind=_METADATA_TO_PROTO[rule.kind], max_bytes=rule.max_bytes,
                             required=rule.required)
    message.declared = schema.declared


def read_schema(message: snapshot_pb2.JobSchemaSnapshot) -> JobSchema:
    return JobSchema(
        fields={entry.name: FieldSchema(kind=entry.kind, dtype=entry.dtype,
                                        trailing_shape=tuple(entry.trailing_shape) if entry.has_trailing_shape
                                        else None, coverage=entry.coverage)
                for entry in message.fields},
        scalars={rule.name: ScalarSchema(kind=_SCALAR_FROM_PROTO[rule.kind], required=rule.required)
                 for rule in message.scalars},
        metadata={rule.name: MetadataSchema(kind=_METADATA_FROM_PROTO[rule.kind], max_bytes=rule.max_bytes,
                                            required=rule.required)
                  for rule in message.metadata},
        declared=message.declared,
    )
