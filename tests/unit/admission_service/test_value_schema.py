"""The ingest check of scalars and metadata against the job's schema (declared, or fixed by the first accepted
trajectory) agrees with a naive reference written over the domain objects: a report passes exactly when the
reference finds no violation, and otherwise the error names the first violating trajectory and one of its
violations, in both report forms."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.admission.service.schema import check_schema, declared_schema
from knittrans.admission.service.trajectory_columns import TrajectoryColumns
from knittrans.errors import InvalidArgument
from knittrans.trajectory_schema import MetadataSchema, ScalarSchema, TokenFieldSchema, TrajectorySchema
from knittrans.types import DType, TrajectoryMeta, UnitHeader, UnitKey, UnitKind, UnitRef, VersionSegment
from knittrans.values import MAX_METADATA_BYTES, MetadataKind, MetadataValue, ScalarKind, TrajectoryValues
from knittrans.wire import trajectory_to_proto
from knittrans.wire.columns import batch_from_metas

SCALARS = ("a", "b", "c", "d")
METADATA = ("m", "n", "o")
LABELS = ("input_ids",)


def _meta(i: int, accepted: bool, scalars: dict, metadata: dict) -> TrajectoryMeta:
    header = UnitHeader(dtype=DType.INT64, shape=(4,), byte_length=32, content_hash="0123abcd", seq_axis=0)
    return TrajectoryMeta(
        trajectory_id=f"t{i}", sample_id=f"s{i}", source="A", rollout_step=0, num_tokens=4, num_loss_tokens=3,
        segments=(VersionSegment(version=0, num_tokens=4),),
        units=(UnitRef(key=UnitKey(f"k{i}"), field_name="input_ids", kind=UnitKind.TOKEN_FIELD, header=header),),
        accepted=accepted,
        scalars=tuple((n, v) for n, (k, v) in scalars.items() if k is ScalarKind.FLOAT),
        values=TrajectoryValues(
            int_scalars=tuple((n, v) for n, (k, v) in scalars.items() if k is ScalarKind.INT),
            bool_scalars=tuple((n, v) for n, (k, v) in scalars.items() if k is ScalarKind.BOOL),
            metadata=tuple(metadata.items())),
    )


_SCALAR_VALUE = {ScalarKind.FLOAT: st.floats(allow_nan=False), ScalarKind.INT: st.integers(-(2**63), 2**63 - 1),
                 ScalarKind.BOOL: st.booleans()}


def _chance(draw: st.DrawFn, percent: int) -> bool:
    return draw(st.integers(0, 99)) < percent


def _metadata_value(draw: st.DrawFn, kind: MetadataKind, size: int) -> MetadataValue:
    if kind is MetadataKind.BYTES:
        return MetadataValue(kind=kind, value=draw(st.binary(min_size=size, max_size=size)))
    if kind is MetadataKind.STR:
        return MetadataValue(kind=kind, value="x" * size)
    return MetadataValue.of("x" * max(size - 2, 0))  # a JSON string: its quotes count


@st.composite
def trajectories(draw: st.DrawFn, i: int, template: TrajectorySchema) -> TrajectoryMeta:
    """A trajectory that mostly follows ``template``, and now and then breaks one of its rules."""
    scalars = {}
    for name in SCALARS:
        rule = template.scalars.get(name)
        present = _chance(draw, (95 if rule.required else 50) if rule else 8)
        if present:
            kind = rule.kind if rule and _chance(draw, 95) else draw(st.sampled_from(ScalarKind))
            scalars[name] = (kind, draw(_SCALAR_VALUE[kind]))
    metadata = {}
    for name in METADATA:
        meta_rule = template.metadata.get(name)
        if _chance(draw, (95 if meta_rule.required else 50) if meta_rule else 8):
            kind = meta_rule.kind if meta_rule and _chance(draw, 95) else draw(st.sampled_from(MetadataKind))
            bound = meta_rule.max_bytes if meta_rule else 40
            size = draw(st.integers(2, bound)) if _chance(draw, 90) else bound + draw(st.integers(1, 3))
            metadata[name] = _metadata_value(draw, kind, size)
    return _meta(i, _chance(draw, 85), scalars, metadata)


@st.composite
def declared(draw: st.DrawFn) -> TrajectorySchema:
    scalars = {name: ScalarSchema(kind=draw(st.sampled_from(ScalarKind)), required=draw(st.booleans()))
               for name in SCALARS if draw(st.booleans())}
    metadata = {name: MetadataSchema(kind=draw(st.sampled_from(MetadataKind)), max_bytes=draw(st.sampled_from(
        (8, 40, 200))), required=draw(st.booleans())) for name in METADATA if draw(st.booleans())}
    return TrajectorySchema(token_fields={"input_ids": TokenFieldSchema(dtype=DType.INT64)}, scalars=scalars,
                            metadata=metadata)


def _size(value: MetadataValue) -> int:
    return len(value.value) if isinstance(value.value, bytes) else len(value.value.encode())


def naive_violations(metas: list[TrajectoryMeta], schema: TrajectorySchema | None) -> tuple[int, set[str]] | None:
    """The first accepted trajectory that breaks a rule, with every field it breaks one at; None when none does."""
    accepted = [i for i, m in enumerate(metas) if m.accepted]
    if not accepted:
        return None
    if schema is None:  # the first accepted trajectory fixes names and kinds, all optional; new floats may come
        first = metas[accepted[0]]
        scalar_rules = {n: (ScalarKind.FLOAT, False) for n, _ in first.scalars}
        scalar_rules |= {n: (ScalarKind.INT, False) for n, _ in first.values.int_scalars}
        scalar_rules |= {n: (ScalarKind.BOOL, False) for n, _ in first.values.bool_scalars}
        metadata_rules = {n: (v.kind, MAX_METADATA_BYTES, False) for n, v in first.values.metadata}
        open_floats = True
    else:
        scalar_rules = {n: (r.kind, r.required) for n, r in schema.scalars.items()}
        metadata_rules = {n: (r.kind, r.max_bytes, r.required) for n, r in schema.metadata.items()}
        open_floats = False
    for i in accepted:
        meta = metas[i]
        where = f"trajectories[{i}]"
        present = {n: (ScalarKind.FLOAT, f"{where}.scalars.{n}") for n, _ in meta.scalars}
        present |= {n: (ScalarKind.INT, f"{where}.values.int_scalars.{n}") for n, _ in meta.values.int_scalars}
        present |= {n: (ScalarKind.BOOL, f"{where}.values.bool_scalars.{n}") for n, _ in meta.values.bool_scalars}
        broken = set()
        for name, (kind, field) in present.items():
            rule = scalar_rules.get(name)
            if (rule is None and not (open_floats and kind is ScalarKind.FLOAT)) or (rule and rule[0] is not kind):
                broken.add(field)
        for name, (kind, required) in scalar_rules.items():
            if required and name not in present:
                broken.add(f"{where}.scalars" if kind is ScalarKind.FLOAT else f"{where}.values.{kind}_scalars")
        metadata = dict(meta.values.metadata)
        for name, value in metadata.items():
            meta_rule = metadata_rules.get(name)
            if meta_rule is None or meta_rule[0] is not value.kind or _size(value) > meta_rule[1]:
                broken.add(f"{where}.values.metadata.{name}")
        for name, (_, _, required) in metadata_rules.items():
            if required and name not in metadata:
                broken.add(f"{where}.values.metadata")
        if broken:
            return i, broken
    return None


@settings(max_examples=300, deadline=None)
@given(count=st.integers(1, 6), data=st.data(), template=declared(), is_declared=st.booleans(), batch=st.booleans())
def test_the_check_agrees_with_the_naive_reference(count: int, data: st.DataObject, template: TrajectorySchema,
                                                   is_declared: bool, batch: bool) -> None:
    metas = [data.draw(trajectories(i, template)) for i in range(count)]
    schema = template if is_declared else None
    if batch:
        columns = TrajectoryColumns.from_proto(batch_from_metas(metas))
    else:
        columns = TrajectoryColumns.from_messages([trajectory_to_proto(m) for m in metas])
    expected = naive_violations(metas, schema)
    job = None if schema is None else declared_schema(schema)
    if expected is None:
        check_schema(columns, job, LABELS)
        return
    _, fields = expected
    with pytest.raises(InvalidArgument) as caught:
        check_schema(columns, job, LABELS)
    assert caught.value.field in fields, (caught.value, fields)


def test_a_declared_schema_refuses_a_label_field_it_lacks_or_that_is_not_integer() -> None:
    with pytest.raises(InvalidArgument, match="not among the token fields"):
        TrajectorySchema(token_fields={"ids": TokenFieldSchema(dtype=DType.INT64)}).check_label_fields(LABELS)
    with pytest.raises(InvalidArgument) as caught:
        TrajectorySchema(token_fields={"input_ids": TokenFieldSchema(dtype=DType.FLOAT32)}).check_label_fields(LABELS)
    assert caught.value.field == "token_fields.input_ids"


@pytest.mark.parametrize(("value", "field"), [
    (MetadataValue(kind=MetadataKind.STR, value="x" * (MAX_METADATA_BYTES + 1)), "values.metadata"),
])
def test_a_trajectory_carries_bounded_metadata(value: MetadataValue, field: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        TrajectoryValues(metadata=(("m", value),))
    assert caught.value.field == field


def test_a_metadata_value_is_checked_for_its_kind() -> None:
    with pytest.raises(InvalidArgument, match="not valid JSON"):
        MetadataValue(kind=MetadataKind.JSON, value="{")
    with pytest.raises(InvalidArgument, match="must be bytes"):
        MetadataValue(kind=MetadataKind.BYTES, value="text")  # type: ignore[arg-type]
