"""A trajectory's typed values beyond its float scalars: integer and boolean scalars, and metadata.

Integer and boolean scalars are packed into tensors beside the float ones (``scalar.<name>``). Metadata (verl's
``non_tensor_batch``: ``uid``, ``data_source``, ground truth, ...) is text, bytes or JSON; it travels inline with
the trajectory's metadata (report, journal, assignment, micro-batch descriptor), so it is small: at most
:data:`MAX_METADATA_BYTES` per trajectory. Larger values belong in a unit (a non-sequence field of uint8).

Pure and protobuf-free, like :mod:`knittrans.types`; :mod:`knittrans.wire` translates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from knittrans.errors import InvalidArgument
from knittrans.tensor_names import scalar_name_problem

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_METADATA_BYTES = 16 * 1024  # per trajectory, all metadata values together
MAX_NAMED_VALUES = 64  # per trajectory: integer scalars, boolean scalars and metadata together


class ScalarKind(StrEnum):
    """The type of a per-trajectory scalar, and of its packed tensor (float64, int64 or bool)."""

    FLOAT = "float"
    INT = "int"
    BOOL = "bool"


class MetadataKind(StrEnum):
    """The type of a metadata value, and what the trainer receives: ``str``, ``bytes`` or the parsed JSON."""

    STR = "str"
    BYTES = "bytes"
    JSON = "json"


def check_value_name(name: str, field: str) -> None:
    problem = scalar_name_problem(name) if isinstance(name, str) else f"must be a string, got {name!r}"
    if problem is not None:
        raise InvalidArgument(problem, field=field)


@dataclass(frozen=True, kw_only=True)
class MetadataValue:
    """One metadata value. ``value`` is the string (``str``), the bytes (``bytes``) or the JSON document's text
    (``json``); :meth:`decoded` is what the trainer gets."""

    kind: MetadataKind
    value: str | bytes

    def __post_init__(self) -> None:
        if not isinstance(self.kind, MetadataKind):
            raise InvalidArgument(f"unknown metadata kind {self.kind!r}", field="kind")
        expected = bytes if self.kind is MetadataKind.BYTES else str
        if not isinstance(self.value, expected):
            raise InvalidArgument(f"a {self.kind} value must be {expected.__name__}, got {type(self.value).__name__}",
                                  field="value")
        if self.kind is MetadataKind.JSON:
            assert isinstance(self.value, str)
            try:
                json.loads(self.value)
            except ValueError as exc:
                raise InvalidArgument(f"is not valid JSON: {exc}", field="value") from None

    @property
    def byte_length(self) -> int:
        """Bytes the value occupies (UTF-8 for text)."""
        return len(self.value) if isinstance(self.value, bytes) else len(self.value.encode("utf-8"))

    def decoded(self) -> Any:
        """The Python value: the string, the bytes, or the JSON document parsed."""
        if self.kind is MetadataKind.JSON:
            assert isinstance(self.value, str)
            return json.loads(self.value)
        return self.value

    @staticmethod
    def of(value: Any) -> MetadataValue:
        """A value as a rollout gives it: ``str`` and ``bytes`` as themselves, a :class:`MetadataValue` as is, and
        anything else as JSON (compact, keys sorted, so equal values make equal text)."""
        if isinstance(value, MetadataValue):
            return value
        if isinstance(value, str):
            return MetadataValue(kind=MetadataKind.STR, value=value)
        if isinstance(value, (bytes, bytearray, memoryview)):
            return MetadataValue(kind=MetadataKind.BYTES, value=bytes(value))
        try:
            text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"must be str, bytes or JSON-serialisable: {exc}", field="value") from None
        return MetadataValue(kind=MetadataKind.JSON, value=text)


@dataclass(frozen=True, kw_only=True)
class TrajectoryValues:
    """A trajectory's integer and boolean scalars and metadata, each sorted by name."""

    int_scalars: tuple[tuple[str, int], ...] = ()
    bool_scalars: tuple[tuple[str, bool], ...] = ()
    metadata: tuple[tuple[str, MetadataValue], ...] = ()

    def __post_init__(self) -> None:
        ints = tuple(sorted((k, v) for k, v in self.int_scalars))
        bools = tuple(sorted((k, v) for k, v in self.bool_scalars))
        metadata = tuple(sorted(((k, v) for k, v in self.metadata), key=lambda kv: kv[0]))
        object.__setattr__(self, "int_scalars", ints)
        object.__setattr__(self, "bool_scalars", bools)
        object.__setattr__(self, "metadata", metadata)
        if len(ints) + len(bools) + len(metadata) > MAX_NAMED_VALUES:
            raise InvalidArgument(f"more than {MAX_NAMED_VALUES} integer scalars, boolean scalars and metadata "
                                  "values together", field="values")
        seen: set[str] = set()
        for column, pairs in (("int_scalars", ints), ("bool_scalars", bools)):
            for name, value in pairs:
                check_value_name(name, f"values.{column}")
                if name in seen:
                    raise InvalidArgument(f"scalar {name!r} has two kinds", field=f"values.{column}.{name}")
                seen.add(name)
                if column == "int_scalars" and (not isinstance(value, int) or isinstance(value, bool)
                                                or not INT64_MIN <= value <= INT64_MAX):
                    raise InvalidArgument(f"must be a 64-bit signed integer, got {value!r}",
                                          field=f"values.{column}.{name}")
                if column == "bool_scalars" and not isinstance(value, bool):
                    raise InvalidArgument(f"must be true or false, got {value!r}", field=f"values.{column}.{name}")
        total = 0
        names: set[str] = set()
        for name, item in metadata:
            check_value_name(name, "values.metadata")
            if name in names:
                raise InvalidArgument("appears twice", field=f"values.metadata.{name}")
            names.add(name)
            if not isinstance(item, MetadataValue):
                raise InvalidArgument("must be a MetadataValue", field=f"values.metadata.{name}")
            total += item.byte_length
        if total > MAX_METADATA_BYTES:
            raise InvalidArgument(f"metadata of {total} bytes exceeds {MAX_METADATA_BYTES} per trajectory; store "
                                  "large values as a unit (a non-sequence field)", field="values.metadata")

    def __bool__(self) -> bool:
        return bool(self.int_scalars or self.bool_scalars or self.metadata)


NO_VALUES = TrajectoryValues()
