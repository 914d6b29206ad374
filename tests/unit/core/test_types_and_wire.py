"""Domain types validate their fields, and survive a protobuf round trip unchanged."""

import hashlib
import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.errors import InvalidArgument
from knittrans.types import (
    BackboneTopology,
    ConsumerId,
    CostModel,
    DType,
    EncoderTopology,
    FieldAlignment,
    MultimodalRef,
    TokenSpan,
    Topology,
    TrajectoryMeta,
    UnitHeader,
    UnitKind,
    UnitRef,
    VersionSegment,
)
from knittrans.v1 import trajectory_pb2
from knittrans.values import MetadataKind, MetadataValue, TrajectoryValues
from knittrans.wire import (
    consumer_from_proto,
    consumer_to_proto,
    topology_from_proto,
    topology_to_proto,
    trajectory_from_proto,
    trajectory_to_proto,
)

HASH = hashlib.blake2b(b"x", digest_size=16).hexdigest()


def token_field(name: str, tokens: int, dtype: DType = DType.INT32, width: int = 1) -> UnitRef:
    shape = (tokens,) if width == 1 else (tokens, width)
    return UnitRef(
        key=f"t1/{name}",
        field_name=name,
        kind=UnitKind.TOKEN_FIELD,
        header=UnitHeader(dtype=dtype, shape=shape, byte_length=tokens * width * dtype.itemsize,
                          content_hash=HASH, seq_axis=0),
    )


def make_meta(tokens: int = 10, **overrides) -> TrajectoryMeta:
    fields = dict(
        trajectory_id="t1", sample_id="s1", source="A", rollout_step=0, num_tokens=tokens, num_loss_tokens=4,
        segments=(VersionSegment(version=0, num_tokens=4),),
        units=(token_field("input_ids", tokens), token_field("routing", tokens, DType.UINT8, 64)),
        multimodal=(MultimodalRef(key="s1/img/ab12", encoder="vision", cost=16.0,
                                  placeholder=TokenSpan(start=1, end=5)),),
    )
    fields.update(overrides)
    return TrajectoryMeta(**fields)


def test_header_converts_token_ranges_to_byte_ranges() -> None:
    header = token_field("routing", 100, DType.UINT8, 64).header
    byte_range = header.byte_range(TokenSpan(start=10, end=20))
    assert (byte_range.offset, byte_range.length) == (640, 640)
    with pytest.raises(InvalidArgument, match="range"):
        header.byte_range(TokenSpan(start=90, end=101))


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"trajectory_id": ""}, "trajectory_id"),
        ({"num_tokens": 0}, "num_tokens"),
        ({"num_loss_tokens": 11}, "num_loss_tokens"),
        ({"segments": ()}, "segments"),
        ({"units": (token_field("input_ids", 9),)}, "units[0].header.shape"),
    ],
)
def test_trajectory_meta_names_the_bad_field(overrides, field) -> None:
    with pytest.raises(InvalidArgument) as info:
        make_meta(**overrides)
    assert info.value.field == field


def test_header_rejects_shape_byte_mismatch() -> None:
    with pytest.raises(InvalidArgument) as info:
        UnitHeader(dtype=DType.INT32, shape=(10,), byte_length=41, content_hash=HASH, seq_axis=0)
    assert info.value.field == "byte_length"


def test_unknown_dtype_is_named() -> None:
    with pytest.raises(InvalidArgument, match="unknown dtype 'complex7'"):
        DType.parse("complex7")


@given(tokens=st.integers(min_value=5, max_value=10_000), step=st.integers(min_value=0, max_value=50),
       accepted=st.booleans())
@settings(max_examples=50, deadline=None)
def test_trajectory_round_trips_through_proto(tokens: int, step: int, accepted: bool) -> None:
    meta = make_meta(tokens, rollout_step=step, accepted=accepted, scalars=(("reward", 0.5),))
    message = trajectory_pb2.TrajectoryMetadata.FromString(trajectory_to_proto(meta).SerializeToString())
    assert trajectory_from_proto(message) == meta


@pytest.mark.parametrize("alignment", [FieldAlignment.TOKEN, FieldAlignment.LABEL])
def test_a_declared_alignment_travels_through_proto_and_json(alignment: FieldAlignment) -> None:
    from knittrans.plan.json import trajectory_from_json_dict, trajectory_to_json_dict

    mask = replace(token_field("loss_mask", 10, DType.UINT8), alignment=alignment)
    meta = make_meta(units=(token_field("input_ids", 10), mask))
    message = trajectory_pb2.TrajectoryMetadata.FromString(trajectory_to_proto(meta).SerializeToString())
    assert message.units[1].alignment == trajectory_pb2.FieldAlignment.Value(f"FIELD_ALIGNMENT_{alignment.name}")
    assert trajectory_from_proto(message) == meta
    assert trajectory_from_json_dict(trajectory_to_json_dict(meta)) == meta


def test_only_token_fields_have_an_alignment_and_unknown_ones_are_named() -> None:
    header = UnitHeader(dtype=DType.FLOAT32, shape=(3,), byte_length=12, content_hash=HASH)
    with pytest.raises(InvalidArgument) as info:
        UnitRef(key="t1/stats", field_name="stats", kind=UnitKind.FIELD, header=header, alignment=FieldAlignment.TOKEN)
    assert info.value.field == "alignment"
    with pytest.raises(InvalidArgument, match="unknown alignment 'shifted'") as info:
        replace(token_field("loss_mask", 10), alignment="shifted")
    assert info.value.field == "alignment"
    message = trajectory_to_proto(make_meta())
    message.units[1].alignment = 9
    with pytest.raises(InvalidArgument) as info:
        trajectory_from_proto(message)
    assert info.value.field == "units[1].alignment"


def test_wire_errors_carry_the_full_field_path() -> None:
    message = trajectory_to_proto(make_meta())
    message.units[1].header.byte_length = 3
    with pytest.raises(InvalidArgument) as info:
        trajectory_from_proto(message)
    assert info.value.field == "units[1].header.byte_length"


def test_topology_and_consumer_round_trip() -> None:
    topology = Topology(
        backbone=BackboneTopology(dp=2, cp=2, tp=2, max_tokens_per_microbatch=4096,
                                  cost=CostModel(linear=1.0, quadratic=0.001)),
        encoders=(EncoderTopology(name="vision", dp=2, max_cost_per_microbatch=1000),),
    )
    assert topology_from_proto(topology_to_proto(topology)) == topology
    consumer = ConsumerId(role="encoder:vision", dp_rank=1)
    assert consumer_from_proto(consumer_to_proto(consumer)) == consumer


def test_consumer_outside_topology_is_rejected() -> None:
    topology = Topology(backbone=BackboneTopology(dp=2, cp=2, max_tokens_per_microbatch=10))
    with pytest.raises(InvalidArgument) as info:
        ConsumerId(role="backbone", dp_rank=0, cp_rank=2).check_within(topology)
    assert info.value.field == "cp_rank"
    with pytest.raises(InvalidArgument, match="role"):
        ConsumerId(role="decoder", dp_rank=0)


_value_names = st.sampled_from(["uid", "data_source", "ground_truth", "turns", "correct", "extra"])
_metadata_values = st.one_of(
    st.text(max_size=40).map(lambda text: MetadataValue(kind=MetadataKind.STR, value=text)),
    st.binary(max_size=40).map(lambda data: MetadataValue(kind=MetadataKind.BYTES, value=data)),
    st.recursive(st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=8),
                 lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                 max_leaves=6).map(MetadataValue.of),
)


@settings(max_examples=150, deadline=None)
@given(
    ints=st.dictionaries(_value_names, st.integers(-(2**63), 2**63 - 1), max_size=3),
    bools=st.dictionaries(_value_names, st.booleans(), max_size=3),
    metadata=st.dictionaries(_value_names, _metadata_values, max_size=4),
)
def test_typed_values_survive_proto_and_plan_json_round_trips(ints, bools, metadata) -> None:
    """Every value reads back with its kind: an integer stays an integer (not a float), bytes stay bytes, and
    JSON text stays the same text (a plan written to BATCH.jsonl and read back plans the same trajectory)."""
    from knittrans.plan.json import trajectory_from_json_dict, trajectory_to_json_dict

    bools = {name: flag for name, flag in bools.items() if name not in ints}  # one kind per scalar name
    values = TrajectoryValues(int_scalars=tuple(ints.items()), bool_scalars=tuple(bools.items()),
                              metadata=tuple(metadata.items()))
    meta = make_meta(values=values)
    message = trajectory_pb2.TrajectoryMetadata.FromString(trajectory_to_proto(meta).SerializeToString())
    assert trajectory_from_proto(message) == meta
    assert trajectory_from_json_dict(json.loads(json.dumps(trajectory_to_json_dict(meta)))) == meta
