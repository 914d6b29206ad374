"""The closed choices of :mod:`knittrans.types` and their protobuf enum numbers: the one table of each.

Every module that reads or writes these enums as numbers (codecs, the columnar form, the admission service's
array checks, descriptors) takes them from here, so a new member is added in the ``.proto`` and in
:mod:`knittrans.types` and nowhere else. Names follow the proto convention ``<ENUM>_<MEMBER>``.
"""

from __future__ import annotations

from typing import cast

from knittrans.types import Coverage, DType, FieldAlignment, UnitKind
from knittrans.v1 import trajectory_pb2

# The casts: protoc's .pyi types enum fields as the enum class, while EnumTypeWrapper.Value returns a plain int.
DTYPE_TO_PROTO = cast(
    "dict[DType, trajectory_pb2.DType]",
    {dtype: trajectory_pb2.DType.Value(f"D_TYPE_{dtype.name}") for dtype in DType},
)
DTYPE_FROM_PROTO: dict[int, DType] = {number: dtype for dtype, number in DTYPE_TO_PROTO.items()}
ITEMSIZE_BY_PROTO: dict[int, int] = {number: dtype.itemsize for number, dtype in DTYPE_FROM_PROTO.items()}

UNIT_KIND_TO_PROTO = cast(
    "dict[UnitKind, trajectory_pb2.UnitKind]",
    {kind: trajectory_pb2.UnitKind.Value(f"UNIT_KIND_{kind.name}") for kind in UnitKind},
)
UNIT_KIND_FROM_PROTO: dict[int, UnitKind] = {number: kind for kind, number in UNIT_KIND_TO_PROTO.items()}
TOKEN_FIELD_KIND = UNIT_KIND_TO_PROTO[UnitKind.TOKEN_FIELD]
MEDIA_KINDS: frozenset[int] = frozenset((UNIT_KIND_TO_PROTO[UnitKind.IMAGE], UNIT_KIND_TO_PROTO[UnitKind.VIDEO]))

# None (no alignment) travels as FIELD_ALIGNMENT_UNSPECIFIED.
ALIGNMENT_TO_PROTO = cast(
    "dict[FieldAlignment | None, trajectory_pb2.FieldAlignment]",
    {
        None: trajectory_pb2.FIELD_ALIGNMENT_UNSPECIFIED,
        **{a: trajectory_pb2.FieldAlignment.Value(f"FIELD_ALIGNMENT_{a.name}") for a in FieldAlignment},
    },
)
ALIGNMENT_FROM_PROTO: dict[int, FieldAlignment | None] = {
    number: alignment for alignment, number in ALIGNMENT_TO_PROTO.items()
}

# The whole sequence (the default) travels as TOKEN_COVERAGE_UNSPECIFIED, so older reports read as before.
COVERAGE_TO_PROTO = cast(
    "dict[Coverage, trajectory_pb2.TokenCoverage]",
    {Coverage.SEQUENCE: trajectory_pb2.TOKEN_COVERAGE_UNSPECIFIED,
     Coverage.RESPONSE: trajectory_pb2.TOKEN_COVERAGE_RESPONSE},
)
COVERAGE_FROM_PROTO: dict[int, Coverage] = {number: coverage for coverage, number in COVERAGE_TO_PROTO.items()}
