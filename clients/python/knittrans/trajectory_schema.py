"""The trajectory schema a job may declare (DESIGN.md §10): what every accepted trajectory stores and reports.

The admission service validates every report against it at ingest and names the offending field; without a
declared schema, the job's first accepted trajectory fixes one (see ``knittrans.admission.service.schema``).
Declared in the admission config under ``schema:`` (docs/integration.md, "The trajectory schema"):

- ``token_fields``: per-token fields (stored as units sliced along the sequence): dtype, the shape of one token's
  row (``row_shape``, default ``[]``), and ``coverage``: ``sequence`` (the whole sequence, the default) or
  ``response`` (only tokens ``[response_start, num_tokens)``; packed with 0 over the prompt and a ``<name>.mask``);
  ``attached_by: <role>`` marks a field a trainer role attaches after admission (``AttachFields``, docs/roles.md):
  reports must not carry it;
- ``fields``: non-sequence fields (read whole by every CP rank): dtype (their shape may differ per trajectory);
- ``scalars``: per-trajectory numbers packed into ``scalar.<name>`` tensors: ``float``, ``int`` or ``bool``;
- ``metadata``: per-trajectory ``str``, ``bytes`` or ``json`` values with a size bound, delivered beside each
  micro-batch, aligned with its trajectories.

Scalars and metadata are ``required`` unless declared otherwise (a missing optional one reaches the trainer as a
0 in ``scalar_present.<name>``, or ``None``). Pure: plain frozen dataclasses, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from knittrans.errors import InvalidArgument
from knittrans.tensor_names import field_name_problem, scalar_name_problem
from knittrans.types import Coverage, DType
from knittrans.values import MAX_METADATA_BYTES, MetadataKind, ScalarKind


@dataclass(frozen=True, kw_only=True)
class TokenFieldSchema:
    """A per-token field: its dtype, the shape of one token's row, and the tokens it covers."""

    dtype: DType
    row_shape: tuple[int, ...] = ()
    coverage: Coverage = Coverage.SEQUENCE
    attached_by: str = ""  # the trainer role that attaches it (docs/roles.md); empty: reports carry it

    def __post_init__(self) -> None:
        if not isinstance(self.attached_by, str):
            raise InvalidArgument(f"must be a role name, got {self.attached_by!r}", field="attached_by")
        if not isinstance(self.dtype, DType):
            object.__setattr__(self, "dtype", DType.parse(str(self.dtype)))
        object.__setattr__(self, "row_shape", tuple(self.row_shape))
        for i, dim in enumerate(self.row_shape):
            if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
                raise InvalidArgument(f"must be a positive integer, got {dim!r}", field=f"row_shape[{i}]")
        if not isinstance(self.coverage, Coverage):
            try:
                object.__setattr__(self, "coverage", Coverage(str(self.coverage)))
            except ValueError:
                raise InvalidArgument(f"must be one of {', '.join(Coverage)}, got {self.coverage!r}",
                                      field="coverage") from None


@dataclass(frozen=True, kw_only=True)
class NonSequenceFieldSchema:
    """A non-sequence field: its dtype (its shape may differ per trajectory)."""

    dtype: DType

    def __post_init__(self) -> None:
        if not isinstance(self.dtype, DType):
            object.__setattr__(self, "dtype", DType.parse(str(self.dtype)))


@dataclass(frozen=True, kw_only=True)
class ScalarSchema:
    kind: ScalarKind
    required: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.kind, ScalarKind):
            raise InvalidArgument(f"must be one of {', '.join(ScalarKind)}, got {self.kind!r}", field="kind")


@dataclass(frozen=True, kw_only=True)
class MetadataSchema:
    """A metadata value: its kind and the most bytes it may have (UTF-8 for text)."""

    kind: MetadataKind
    max_bytes: int = 1024
    required: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.kind, MetadataKind):
            raise InvalidArgument(f"must be one of {', '.join(MetadataKind)}, got {self.kind!r}", field="kind")
        if not isinstance(self.max_bytes, int) or isinstance(self.max_bytes, bool) \
                or not 1 <= self.max_bytes <= MAX_METADATA_BYTES:
            raise InvalidArgument(f"must be in [1, {MAX_METADATA_BYTES}] (larger values belong in a unit), got "
                                  f"{self.max_bytes!r}", field="max_bytes")


@dataclass(frozen=True, kw_only=True)
class TrajectorySchema:
    """What every accepted trajectory of the job stores and reports (see the module docstring)."""

    token_fields: Mapping[str, TokenFieldSchema]
    fields: Mapping[str, NonSequenceFieldSchema] = field(default_factory=dict)
    scalars: Mapping[str, ScalarSchema] = field(default_factory=dict)
    metadata: Mapping[str, MetadataSchema] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.token_fields:
            raise InvalidArgument("declare at least the tokens field", field="token_fields")
        for section in ("token_fields", "fields"):
            for name in getattr(self, section):
                problem = field_name_problem(name)
                if problem is not None:
                    raise InvalidArgument(problem, field=f"{section}.{name}")
        both = set(self.token_fields) & set(self.fields)
        if both:
            raise InvalidArgument(f"{sorted(both)} are also token fields", field="fields")
        for section in ("scalars", "metadata"):
            for name in getattr(self, section):
                problem = scalar_name_problem(name)
                if problem is not None:
                    raise InvalidArgument(problem, field=f"{section}.{name}")
        required = sum(spec.max_bytes for spec in self.metadata.values() if spec.required)
        if required > MAX_METADATA_BYTES:
            raise InvalidArgument(f"required metadata may take {required} bytes, more than the {MAX_METADATA_BYTES} "
                                  "a trajectory may carry", field="metadata")

    @property
    def attached_fields(self) -> dict[str, TokenFieldSchema]:
        """The token fields trainer roles attach (``attached_by``), which reports do not carry."""
        return {name: spec for name, spec in self.token_fields.items() if spec.attached_by}

    def check_label_fields(self, label_fields: tuple[str, ...]) -> None:
        """Labels are made from these fields: each must be a declared 1-D integer token field."""
        for name in label_fields:
            spec = self.token_fields.get(name)
            if spec is None:
                raise InvalidArgument(f"labels are made from {name!r}, which is not among the token fields",
                                      field="token_fields")
            if spec.row_shape or spec.dtype not in INTEGER_DTYPES or spec.coverage is not Coverage.SEQUENCE \
                    or spec.attached_by:
                raise InvalidArgument(f"labels are made from {name!r}, so it must be a 1-D integer field over the "
                                      "whole sequence that reports carry", field=f"token_fields.{name}")


INTEGER_DTYPES = frozenset(
    {DType.UINT8, DType.INT8, DType.UINT16, DType.INT16, DType.INT32, DType.UINT32, DType.INT64}
)
