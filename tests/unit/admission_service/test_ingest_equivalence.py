"""The ingest fast path accepts exactly what the domain types accept, and names the same field."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.admission.service.ingest.rules import IngestLimits, check_trajectory
from knittrans.errors import InvalidArgument
from knittrans.v1 import trajectory_pb2
from knittrans.wire import trajectory_from_proto, trusted_trajectory_from_proto

LIMITS = IngestLimits(sources={"A", "B"}, encoders={"vision"})
HASH = hashlib.blake2b(b"x", digest_size=16).hexdigest()


def message(tokens: int = 10) -> trajectory_pb2.TrajectoryMetadata:
    return trajectory_pb2.TrajectoryMetadata(
        trajectory_id="t1", sample_id="s1", source="A", num_tokens=tokens, num_loss_tokens=4,
        segments=[trajectory_pb2.VersionSegment(version=0, num_tokens=4)],
        units=[trajectory_pb2.UnitRef(
            key="t1/input_ids", field_name="input_ids", kind=trajectory_pb2.UNIT_KIND_TOKEN_FIELD,
            header=trajectory_pb2.UnitHeader(dtype=trajectory_pb2.D_TYPE_INT32, shape=[tokens], seq_axis=0,
                                             byte_length=4 * tokens, content_hash=HASH))],
        multimodal=[trajectory_pb2.MultimodalRef(
            key="s1/img", encoder="vision", cost=4.0, kind=trajectory_pb2.UNIT_KIND_IMAGE,
            placeholder=trajectory_pb2.TokenSpan(start=1, end=3))],
        accepted=True,
    )


MUTATIONS = {
    "empty id": lambda m: setattr(m, "trajectory_id", ""),
    "bad id": lambda m: setattr(m, "sample_id", "a b"),
    "zero tokens": lambda m: setattr(m, "num_tokens", 0),
    "loss above tokens": lambda m: setattr(m, "num_loss_tokens", 11),
    "no segments": lambda m: m.ClearField("segments"),
    "segment zero": lambda m: setattr(m.segments[0], "num_tokens", 0),
    "segments too long": lambda m: setattr(m.segments[0], "num_tokens", 11),
    "byte length": lambda m: setattr(m.units[0].header, "byte_length", 7),
    "dtype": lambda m: setattr(m.units[0].header, "dtype", 0),
    "hash": lambda m: setattr(m.units[0].header, "content_hash", "XYZ"),
    "kind": lambda m: setattr(m.units[0], "kind", 0),
    "token shape": lambda m: (m.units[0].header.ClearField("shape"), m.units[0].header.shape.append(9),
                              setattr(m.units[0].header, "byte_length", 36)),
    "missing header": lambda m: m.units[0].ClearField("header"),
    "unknown alignment": lambda m: setattr(m.units[0], "alignment", 7),
    "response start past the end": lambda m: setattr(m, "response_start", 11),
    "response rows": lambda m: (setattr(m, "response_start", 2),
                                setattr(m.units[0], "coverage", trajectory_pb2.TOKEN_COVERAGE_RESPONSE)),
    "unknown coverage": lambda m: setattr(m.units[0], "coverage", 5),
    "cost": lambda m: setattr(m.multimodal[0], "cost", -1.0),
    "placeholder": lambda m: setattr(m.multimodal[0].placeholder, "end", 11),
    "placeholder order": lambda m: setattr(m.multimodal[0].placeholder, "start", 5),
    "empty placeholder": lambda m: setattr(m.multimodal[0].placeholder, "end", 1),
    "trailing newline id": lambda m: setattr(m, "trajectory_id", "t1\n"),
    "mm kind": lambda m: setattr(m.multimodal[0], "kind", trajectory_pb2.UNIT_KIND_FIELD),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_fast_path_and_domain_types_reject_the_same_field(name: str) -> None:
    bad = message()
    MUTATIONS[name](bad)
    with pytest.raises(InvalidArgument) as fast:
        check_trajectory(bad, "trajectories[0]", LIMITS, current_version=0)
    with pytest.raises(InvalidArgument) as domain:
        trajectory_from_proto(bad)
    assert fast.value.field.removeprefix("trajectories[0].").split(".")[0] == domain.value.field.split(".")[0]


@given(tokens=st.integers(min_value=3, max_value=5000), loss=st.integers(min_value=0, max_value=5000),
       version=st.integers(min_value=0, max_value=3), end=st.integers(min_value=1, max_value=6000))
@settings(max_examples=200, deadline=None)
def test_fast_path_agrees_with_domain_types(tokens: int, loss: int, version: int, end: int) -> None:
    candidate = message(tokens)
    candidate.num_loss_tokens = loss
    candidate.segments[0].version = version
    candidate.multimodal[0].placeholder.end = end
    try:
        trajectory_from_proto(candidate)
        domain_ok = True
    except InvalidArgument:
        domain_ok = False
    try:
        check_trajectory(candidate, "t", LIMITS, current_version=3)
        fast_ok = True
    except InvalidArgument:
        fast_ok = False
    assert fast_ok == domain_ok


def test_unknown_source_and_future_version_are_service_rules() -> None:
    bad_source = message()
    bad_source.source = "Z"
    with pytest.raises(InvalidArgument, match="unknown source"):
        check_trajectory(bad_source, "t", LIMITS, current_version=0)
    future = message()
    future.segments[0].version = 2
    with pytest.raises(InvalidArgument, match="future") as info:
        check_trajectory(future, "t", LIMITS, current_version=1)
    assert info.value.field == "t.segments[0].version"


@given(tokens=st.integers(min_value=10, max_value=5000), version=st.integers(min_value=0, max_value=3),
       reward=st.floats(min_value=-1, max_value=1))
@settings(max_examples=50, deadline=None)
def test_trusted_conversion_equals_validated_conversion(tokens: int, version: int, reward: float) -> None:
    valid = message(tokens)
    valid.segments[0].version = version
    valid.scalars["reward"] = reward
    valid.multimodal[0].header.CopyFrom(valid.units[0].header)
    check_trajectory(valid, "t", LIMITS, current_version=3)
    assert trusted_trajectory_from_proto(valid) == trajectory_from_proto(valid)
