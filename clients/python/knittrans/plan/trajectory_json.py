"""JSON forms of trajectories (one line of a BATCH.jsonl file) and topologies (docs/plan-format.md), and the
strict reader the plan's JSON form shares. Unknown keys and wrong types raise
:class:`~knittrans.errors.InvalidArgument` naming the field.
"""

from __future__ import annotations

import base64
import builtins
import dataclasses
import math
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from functools import partial
from typing import Any

from knittrans.config import build
from knittrans.errors import InvalidArgument, within
from knittrans.types import (
    Coverage,
    DType,
    FieldAlignment,
    MultimodalRef,
    TokenSpan,
    Topology,
    TrajectoryMeta,
    UnitHeader,
    UnitKey,
    UnitKind,
    UnitRef,
    VersionSegment,
)
from knittrans.values import NO_VALUES, MetadataKind, MetadataValue, TrajectoryValues


class Fields:
    """Typed, strict reads from one JSON object, naming the field of every error."""

    def __init__(self, data: Any, path: str, known: Sequence[str]) -> None:
        if not isinstance(data, Mapping):
            raise InvalidArgument(f"expected an object, got {type(data).__name__}", field=path or "<root>")
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise InvalidArgument(
                f"unknown key; known keys are: {', '.join(known)}", field=self._join(path, unknown[0])
            )
        self.data = data
        self.path = path

    @staticmethod
    def _join(path: str, key: str) -> str:
        return f"{path}.{key}" if path else key

    def field(self, key: str) -> str:
        return self._join(self.path, key)

    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str, default: Any = ...) -> Any:
        if key not in self.data:
            if default is ...:
                raise InvalidArgument("is required", field=self.field(key))
            return default
        return self.data[key]

    def int(self, key: str, default: Any = ...) -> int:
        value = self.raw(key, default)
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidArgument(f"expected an integer, got {value!r}", field=self.field(key))
        return value

    def float(self, key: str, default: Any = ...) -> float:
        value = self.raw(key, default)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise InvalidArgument(f"expected a number, got {value!r}", field=self.field(key))
        return float(value)

    def str(self, key: str, default: Any = ...) -> str:
        value = self.raw(key, default)
        if not isinstance(value, str):
            raise InvalidArgument(f"expected a string, got {value!r}", field=self.field(key))
        return value

    # Below here the method names shadow the builtins inside the class body, so annotations spell them out.
    def bool(self, key: builtins.str, default: Any = ...) -> builtins.bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise InvalidArgument(f"expected true or false, got {value!r}", field=self.field(key))
        return value

    def list(self, key: builtins.str, default: Any = ...) -> builtins.list[Any]:
        value = self.raw(key, default)
        if not isinstance(value, list):
            raise InvalidArgument(f"expected a list, got {value!r}", field=self.field(key))
        return value

    def ints(self, key: builtins.str, default: Any = ...) -> builtins.list[builtins.int]:
        values = self.list(key, default)
        for i, v in enumerate(values):
            if not isinstance(v, int) or isinstance(v, bool):
                raise InvalidArgument(f"expected an integer, got {v!r}", field=f"{self.field(key)}[{i}]")
        return values


def _header_to_json_dict(header: UnitHeader) -> dict[str, Any]:
    data: dict[str, Any] = {
        "dtype": header.dtype.value,
        "shape": list(header.shape),
        "byte_length": header.byte_length,
        "content_hash": header.content_hash,
    }
    if header.seq_axis is not None:
        data["seq_axis"] = header.seq_axis
    if header.chunk_tokens:
        data["chunk_tokens"] = header.chunk_tokens
    return data


def _header_from_json_dict(data: Any, path: str) -> UnitHeader:
    f = Fields(data, path, ("dtype", "shape", "byte_length", "content_hash", "seq_axis", "chunk_tokens"))
    dtype = DType.parse(f.str("dtype"), f.field("dtype"))
    shape = tuple(f.ints("shape"))
    seq_axis = f.raw("seq_axis", None)
    if seq_axis is not None:
        seq_axis = f.int("seq_axis")
    # Fields are read (and named in full) before `within`, which adds the path only to the dataclass's errors.
    byte_length = f.int("byte_length", math.prod(shape) * dtype.itemsize)
    content_hash = f.str("content_hash")
    chunk_tokens = f.int("chunk_tokens", 0)
    return within(
        path,
        partial(
            UnitHeader, dtype=dtype, shape=shape, byte_length=byte_length, content_hash=content_hash,
            seq_axis=seq_axis, chunk_tokens=chunk_tokens,
        ),
    )


def _kind_from_json(value: str, field: str) -> UnitKind:
    try:
        return UnitKind(value)
    except ValueError:
        choices = ", ".join(k.value for k in UnitKind)
        raise InvalidArgument(f"must be one of {choices}, got {value!r}", field=field) from None


def _coverage_from_json(value: str, field: str) -> Coverage:
    try:
        return Coverage(value)
    except ValueError:
        raise InvalidArgument(f"must be sequence or response, got {value!r}", field=field) from None


def trajectory_to_json_dict(meta: TrajectoryMeta) -> dict[str, Any]:
    """The JSON form of a trajectory's metadata (one line of a BATCH.jsonl file; see docs/plan-format.md)."""
    data: dict[str, Any] = {name: getattr(meta, name) for name in _TRAJECTORY_KEYS}  # plain fields as they are
    data["segments"] = [{"version": s.version, "num_tokens": s.num_tokens} for s in meta.segments]
    data["units"] = [
        {"key": u.key, "field_name": u.field_name, "kind": u.kind.value, "header": _header_to_json_dict(u.header),
         **({"alignment": u.alignment.value} if u.alignment is not None else {}),
         **({"coverage": u.coverage.value} if u.coverage is not Coverage.SEQUENCE else {})}
        for u in meta.units
    ]
    data["multimodal"] = [
        {
            "key": m.key,
            "encoder": m.encoder,
            "cost": m.cost,
            "placeholder": [m.placeholder.start, m.placeholder.end],
            "kind": m.kind.value,
            **({"header": _header_to_json_dict(m.header)} if m.header is not None else {}),
        }
        for m in meta.multimodal
    ]
    data["scalars"] = dict(meta.scalars)
    if meta.values:
        data["values"] = _values_to_json_dict(meta.values)
    else:
        del data["values"]
    return data


def _values_to_json_dict(values: TrajectoryValues) -> dict[str, Any]:
    """Integer and boolean scalars as JSON numbers and booleans; metadata as ``{"kind", "value"}`` with bytes in
    base64, so that every value reads back with its kind."""
    return {
        "int_scalars": dict(values.int_scalars),
        "bool_scalars": dict(values.bool_scalars),
        "metadata": {
            name: {"kind": item.kind.value,
                   "value": base64.b64encode(item.value).decode() if isinstance(item.value, bytes) else item.value}
            for name, item in values.metadata
        },
    }


def _values_from_json_dict(data: Any, path: str) -> TrajectoryValues:
    v = Fields(data, path, ("int_scalars", "bool_scalars", "metadata"))
    columns: dict[str, list[tuple[str, Any]]] = {}
    for column in ("int_scalars", "bool_scalars", "metadata"):
        raw = v.raw(column, {})
        if not isinstance(raw, Mapping):
            raise InvalidArgument("expected an object", field=v.field(column))
        columns[column] = [(str(name), value) for name, value in raw.items()]
    metadata = []
    for name, raw in columns["metadata"]:
        m = Fields(raw, f"{v.field('metadata')}.{name}", ("kind", "value"))
        kind_text, text = m.str("kind"), m.str("value")
        try:
            kind = MetadataKind(kind_text)
        except ValueError:
            raise InvalidArgument(f"unknown metadata kind {kind_text!r}", field=m.field("kind")) from None
        if kind is MetadataKind.BYTES:
            try:
                value: str | bytes = base64.b64decode(text, validate=True)
            except ValueError:
                raise InvalidArgument("expected base64", field=m.field("value")) from None
        else:
            value = text
        metadata.append((name, within(m.path, partial(MetadataValue, kind=kind, value=value))))
    return within(path, lambda: TrajectoryValues(int_scalars=tuple(columns["int_scalars"]),
                                                 bool_scalars=tuple(columns["bool_scalars"]),
                                                 metadata=tuple(metadata)))


# The keys are TrajectoryMeta's fields, in its order. Its plain fields (one str, int, bool or float each) are read
# and written generically, so a new one needs no code here: a missing one takes the dataclass's default, or one
# of these documented defaults.
_TRAJECTORY_KEYS = tuple(f.name for f in dataclasses.fields(TrajectoryMeta))
_PLAIN_READERS = {builtins.str: "str", builtins.int: "int", builtins.bool: "bool", builtins.float: "float"}
_HINTS = typing.get_type_hints(TrajectoryMeta)
_PLAIN_FIELDS = tuple(
    (f, _PLAIN_READERS[hint]) for f in dataclasses.fields(TrajectoryMeta)
    if (hint := getattr(_HINTS[f.name], "__supertype__", _HINTS[f.name])) in _PLAIN_READERS  # NewType ids: str
)
_REQUIRED_FIRST = ("trajectory_id", "num_tokens")
_DERIVED_DEFAULTS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "sample_id": lambda read: read["trajectory_id"],
    "source": lambda read: "default",
    "rollout_step": lambda read: 0,
    "num_loss_tokens": lambda read: max(read["num_tokens"], 0),
}


def _read_plain(f: Fields, field: dataclasses.Field[Any], reader: str, read: dict[str, Any]) -> Any:
    if field.name in _DERIVED_DEFAULTS:
        default = _DERIVED_DEFAULTS[field.name](read)
    elif field.default is not dataclasses.MISSING:
        default = field.default
    else:
        default = ...  # required
    return getattr(f, reader)(field.name, default)


def trajectory_from_json_dict(data: Any, path: str = "") -> TrajectoryMeta:
    """Parse the JSON form of a trajectory, naming the field of any error (prefixed with ``path``).

    Only ``trajectory_id`` and ``num_tokens`` are required: ``sample_id`` defaults to the trajectory id,
    ``source`` to ``default``, ``num_loss_tokens`` to ``num_tokens``, ``segments`` to one version-0 segment
    over every token, and ``accepted`` to true.
    """
    f = Fields(data, path, _TRAJECTORY_KEYS)
    read: dict[str, Any] = {}
    for field, reader in _PLAIN_FIELDS:
        if field.name in _REQUIRED_FIRST:
            read[field.name] = _read_plain(f, field, reader, read)
    num_tokens = read["num_tokens"]
    segments = []
    default_segments = [{"version": 0, "num_tokens": num_tokens}] if num_tokens > 0 else []
    for i, raw in enumerate(f.list("segments", default_segments)):
        s = Fields(raw, f"{f.field('segments')}[{i}]", ("version", "num_tokens"))
        version, segment_tokens = s.int("version"), s.int("num_tokens")
        segments.append(
            within(s.path, partial(VersionSegment, version=version, num_tokens=segment_tokens))
        )
    units = []
    for i, raw in enumerate(f.list("units", [])):
        u = Fields(raw, f"{f.field('units')}[{i}]", ("key", "field_name", "kind", "header", "alignment", "coverage"))
        header = _header_from_json_dict(u.raw("header"), u.field("header"))
        kind = _kind_from_json(u.str("kind"), u.field("kind"))
        key, field_name = UnitKey(u.str("key")), u.str("field_name")
        alignment = FieldAlignment.parse(u.str("alignment"), u.field("alignment")) if u.has("alignment") else None
        coverage = _coverage_from_json(u.str("coverage", Coverage.SEQUENCE.value), u.field("coverage"))
        units.append(within(u.path, partial(UnitRef, key=key, field_name=field_name, kind=kind, header=header,
                                            alignment=alignment, coverage=coverage)))
    multimodal = []
    for i, raw in enumerate(f.list("multimodal", [])):
        m = Fields(raw, f"{f.field('multimodal')}[{i}]", ("key", "encoder", "cost", "placeholder", "kind", "header"))
        span = m.ints("placeholder")
        if len(span) != 2:
            raise InvalidArgument("expected [start, end]", field=m.field("placeholder"))
        placeholder = within(m.field("placeholder"), partial(TokenSpan, start=span[0], end=span[1]))
        ref_header = _header_from_json_dict(m.raw("header"), m.field("header")) if m.has("header") else None
        kind = _kind_from_json(m.str("kind", "image"), m.field("kind"))
        key, encoder, cost = UnitKey(m.str("key")), m.str("encoder"), m.float("cost")
        multimodal.append(
            within(
                m.path,
                partial(MultimodalRef, key=key, encoder=encoder, cost=cost, placeholder=placeholder, kind=kind,
                        header=ref_header),
            )
        )
    scalars_raw = f.raw("scalars", {})
    if not isinstance(scalars_raw, Mapping):
        raise InvalidArgument("expected an object of numbers", field=f.field("scalars"))
    scalars = []
    for name, value in sorted(scalars_raw.items()):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise InvalidArgument(f"expected a number, got {value!r}", field=f"{f.field('scalars')}.{name}")
        scalars.append((str(name), float(value)))
    for field, reader in _PLAIN_FIELDS:
        if field.name not in read:
            read[field.name] = _read_plain(f, field, reader, read)
    values = _values_from_json_dict(f.raw("values"), f.field("values")) if f.has("values") else NO_VALUES
    return within(
        path,
        lambda: TrajectoryMeta(
            **read,
            segments=tuple(segments),
            units=tuple(units),
            multimodal=tuple(multimodal),
            scalars=tuple(scalars),
            values=values,
        ),
    )


def topology_to_json_dict(topology: Topology) -> dict[str, Any]:
    data = asdict(topology)
    data["encoders"] = list(data["encoders"])
    return data


def topology_from_json_dict(data: Any, path: str = "topology") -> Topology:
    """A topology from its JSON/YAML mapping, with the config loader's strict key checks."""
    return within(path, lambda: build(Topology, data))
