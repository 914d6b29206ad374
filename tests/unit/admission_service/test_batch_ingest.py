"""The columnar report form: it round-trips, and the column checks accept exactly what the message checks accept,
naming the same ``trajectories[i].field`` in both report forms."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.admission.service.ingest.rules import (
    IngestLimits,
    check_batch,
    check_columns,
    check_trajectory,
    flag_trajectories,
    oldest_versions,
)
from knittrans.admission.service.trajectory_columns import TrajectoryColumns, messages_from_batch
from knittrans.errors import InvalidArgument
from knittrans.v1 import trajectory_pb2
from knittrans.wire import trajectory_from_proto, trajectory_to_proto
from knittrans.wire.columns import batch_from_messages, batch_from_metas

LIMITS = IngestLimits(sources={"A", "B"}, encoders={"vision", "audio"})
HASH = hashlib.blake2b(b"x", digest_size=16).hexdigest()
TOKEN = trajectory_pb2.UNIT_KIND_TOKEN_FIELD


def message(
    index: int, tokens: int = 10, *, images: int = 1, scalars: bool = False
) -> trajectory_pb2.TrajectoryMetadata:
    trajectory_id, sample_id = f"t{index}", f"s{index // 2}"
    m = trajectory_pb2.TrajectoryMetadata(
        trajectory_id=trajectory_id, sample_id=sample_id, source="AB"[index % 2], rollout_step=index % 3,
        num_tokens=tokens, num_loss_tokens=4, segments=[trajectory_pb2.VersionSegment(version=0, num_tokens=4)],
        units=[
            trajectory_pb2.UnitRef(
                key=f"{trajectory_id}/input_ids", field_name="input_ids", kind=TOKEN,
                header=trajectory_pb2.UnitHeader(dtype=trajectory_pb2.D_TYPE_INT32, shape=[tokens], seq_axis=0,
                                                 byte_length=4 * tokens, content_hash=HASH)),
            trajectory_pb2.UnitRef(
                key=f"{trajectory_id}/routing", field_name="routing", kind=TOKEN,
                header=trajectory_pb2.UnitHeader(dtype=trajectory_pb2.D_TYPE_UINT8, shape=[tokens, 8], seq_axis=0,
                                                 byte_length=8 * tokens, content_hash=HASH, chunk_tokens=4),
                # Some trajectories declare an alignment, so the unit_alignments column is exercised.
                alignment=(trajectory_pb2.FIELD_ALIGNMENT_UNSPECIFIED, trajectory_pb2.FIELD_ALIGNMENT_TOKEN,
                           trajectory_pb2.FIELD_ALIGNMENT_LABEL)[index % 3]),
            trajectory_pb2.UnitRef(
                key=f"{trajectory_id}/reward_model", field_name="reward_model", kind=trajectory_pb2.UNIT_KIND_FIELD,
                header=trajectory_pb2.UnitHeader(dtype=trajectory_pb2.D_TYPE_FLOAT32, shape=[3], byte_length=12,
                                                 content_hash=HASH)),
        ],
        multimodal=[
            trajectory_pb2.MultimodalRef(
                key=f"{sample_id}/img{k}", encoder="vision", cost=4.0 + k, kind=trajectory_pb2.UNIT_KIND_IMAGE,
                placeholder=trajectory_pb2.TokenSpan(start=1 + k, end=3 + k))
            for k in range(images)
        ],
        accepted=index % 5 != 4, finished_at=float(index),
    )
    if index % 2:  # a response-only field, so response_starts and unit_coverages are exercised
        m.response_start = 3
        m.units.add(key=f"{trajectory_id}/old_logprobs", field_name="old_logprobs", kind=TOKEN,
                    coverage=trajectory_pb2.TOKEN_COVERAGE_RESPONSE, header=trajectory_pb2.UnitHeader(
                        dtype=trajectory_pb2.D_TYPE_FLOAT32, shape=[tokens - 3], seq_axis=0,
                        byte_length=4 * (tokens - 3), content_hash=HASH))
    if images > 1:
        m.multimodal[1].header.CopyFrom(trajectory_pb2.UnitHeader(
            dtype=trajectory_pb2.D_TYPE_UINT8, shape=[2, 2, 3], byte_length=12, content_hash=HASH))
    if scalars:
        m.scalars["reward"] = 0.5
        m.scalars["advantage"] = -1.25
    return m


def canonical(m: trajectory_pb2.TrajectoryMetadata) -> trajectory_pb2.TrajectoryMetadata:
    return trajectory_to_proto(trajectory_from_proto(m))


def both_forms(messages: list[trajectory_pb2.TrajectoryMetadata]) -> list[TrajectoryColumns]:
    batch = trajectory_pb2.TrajectoryBatch.FromString(batch_from_messages(messages).SerializeToString())
    return [TrajectoryColumns.from_messages(messages), TrajectoryColumns.from_proto(batch)]


def outcome(check) -> tuple[str, str] | None:
    try:
        check()
    except InvalidArgument as exc:
        return exc.field or "", exc.message
    return None


# ---- the form itself ----------------------------------------------------------------------------------------------


def test_batch_round_trips_to_the_canonical_messages() -> None:
    messages = [message(i, 10 + i, images=i % 3, scalars=i % 2 == 0) for i in range(7)]
    decoded = messages_from_batch(batch_from_messages(messages))
    assert decoded == [canonical(m) for m in messages]
    for columns in both_forms(messages):
        for i, m in enumerate(messages):
            assert columns.canonical_message(i).SerializeToString(deterministic=True) == canonical(
                m).SerializeToString(deterministic=True)


def test_batch_from_domain_objects_matches_their_messages() -> None:
    metas = [trajectory_from_proto(message(i, 10 + i, images=2, scalars=True)) for i in range(4)]
    assert messages_from_batch(batch_from_metas(metas)) == [trajectory_to_proto(m) for m in metas]


def test_names_are_stored_once_per_batch() -> None:
    batch = batch_from_messages([message(i, images=2) for i in range(5)])
    assert list(batch.field_names) == ["input_ids", "routing", "reward_model", "old_logprobs"]
    assert list(batch.encoders) == ["vision"]
    assert list(batch.unit_fields) == [0, 1, 2] + [0, 1, 2, 3, 0, 1, 2] * 2


def test_take_keeps_the_chosen_trajectories_in_order() -> None:
    messages = [message(i, 10 + i, images=i % 3, scalars=i % 2 == 0) for i in range(6)]
    columns = TrajectoryColumns.from_proto(batch_from_messages(messages))
    assert messages_from_batch(columns.take([4, 1, 5])) == [canonical(messages[i]) for i in (4, 1, 5)]


def test_a_unit_without_header_has_no_columnar_form() -> None:
    bad = message(0)
    bad.units[1].ClearField("header")
    with pytest.raises(InvalidArgument) as info:
        batch_from_messages([message(1), bad])
    assert info.value.field == "trajectories[1].units[1].header"


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda b: b.sample_ids.pop(), "batch.sample_ids"),
        (lambda b: b.unit_counts.__setitem__(0, 4), "batch.unit_keys"),
        (lambda b: b.unit_headers.byte_lengths.pop(), "batch.unit_headers.byte_lengths"),
        (lambda b: b.unit_headers.shape.append(3), "batch.unit_headers.shape"),
        (lambda b: b.unit_fields.__setitem__(0, 7), "batch.unit_fields"),
        (lambda b: b.unit_alignments.pop(), "batch.unit_alignments"),
        (lambda b: b.multimodal_encoders.__setitem__(0, 1), "batch.multimodal_encoders"),
        (lambda b: b.multimodal_has_header.__setitem__(0, True), "batch.multimodal_headers.dtypes"),
        (lambda b: b.scalar_names.__setitem__(1, b.scalar_names[0]), "trajectories[0].scalars"),
    ],
)
def test_columns_that_do_not_fit_together_are_named(mutate, field: str) -> None:
    batch = batch_from_messages([message(0, scalars=True), message(1)])
    mutate(batch)
    with pytest.raises(InvalidArgument) as info:
        TrajectoryColumns.from_proto(batch)
    assert info.value.field == field


# ---- the checks ---------------------------------------------------------------------------------------------------

MUTATIONS = {
    "empty id": lambda m: setattr(m, "trajectory_id", ""),
    "bad sample id": lambda m: setattr(m, "sample_id", "a b"),
    "long id": lambda m: setattr(m, "trajectory_id", "x" * 257),
    "newline id": lambda m: setattr(m, "trajectory_id", "t\nq"),
    "trailing newline id": lambda m: setattr(m, "sample_id", m.sample_id + "\n"),
    "unicode id": lambda m: setattr(m, "trajectory_id", "tä"),
    "unknown source": lambda m: setattr(m, "source", "Z"),
    "zero tokens": lambda m: setattr(m, "num_tokens", 0),
    "too many tokens": lambda m: setattr(m, "num_tokens", 5 * 1024 * 1024),
    "loss above tokens": lambda m: setattr(m, "num_loss_tokens", 11),
    "no segments": lambda m: m.ClearField("segments"),
    "segment zero": lambda m: setattr(m.segments[0], "num_tokens", 0),
    "segments too long": lambda m: setattr(m.segments[0], "num_tokens", 11),
    "huge segments": lambda m: [m.segments.add(version=0, num_tokens=2**63) for _ in range(2)],
    "future version": lambda m: setattr(m.segments[0], "version", 3),
    "bad unit key": lambda m: setattr(m.units[1], "key", ""),
    "bad field name": lambda m: setattr(m.units[2], "field_name", "a/b c"),
    "field twice": lambda m: setattr(m.units[2], "field_name", "input_ids"),
    "byte length": lambda m: setattr(m.units[0].header, "byte_length", 7),
    "dtype": lambda m: setattr(m.units[0].header, "dtype", 0),
    "unknown dtype": lambda m: setattr(m.units[1].header, "dtype", 99),
    "hash": lambda m: setattr(m.units[0].header, "content_hash", "XYZ"),
    "short hash": lambda m: setattr(m.units[2].header, "content_hash", "abc"),
    "kind": lambda m: setattr(m.units[0], "kind", 0),
    "token shape": lambda m: (m.units[0].header.ClearField("shape"), m.units[0].header.shape.append(9),
                              setattr(m.units[0].header, "byte_length", 36)),
    "token without axis": lambda m: m.units[1].header.ClearField("seq_axis"),
    "axis 1": lambda m: setattr(m.units[0].header, "seq_axis", 1),
    "chunks without axis": lambda m: setattr(m.units[2].header, "chunk_tokens", 4),
    "axis without shape": lambda m: (m.units[2].header.ClearField("shape"), setattr(m.units[2].header, "seq_axis", 0),
                                     setattr(m.units[2].header, "byte_length", 4)),
    "overflowing shape": lambda m: (m.units[2].header.ClearField("shape"),
                                    m.units[2].header.shape.extend([2**32, 2**32, 1]),
                                    setattr(m.units[2].header, "byte_length", 0)),
    "missing header": lambda m: m.units[0].ClearField("header"),
    "aligned non-sequence field": lambda m: setattr(m.units[2], "alignment", trajectory_pb2.FIELD_ALIGNMENT_TOKEN),
    "unknown alignment": lambda m: setattr(m.units[1], "alignment", 7),
    "response start past the end": lambda m: setattr(m, "response_start", 11),
    "response rows": lambda m: (setattr(m, "response_start", 2),
                                setattr(m.units[1], "coverage", trajectory_pb2.TOKEN_COVERAGE_RESPONSE)),
    "unknown coverage": lambda m: setattr(m.units[1], "coverage", 5),
    "response-only non-sequence field": lambda m: setattr(m.units[2], "coverage",
                                                          trajectory_pb2.TOKEN_COVERAGE_RESPONSE),
    "mm key": lambda m: setattr(m.multimodal[0], "key", "bad key"),
    "encoder": lambda m: setattr(m.multimodal[0], "encoder", "lidar"),
    "cost": lambda m: setattr(m.multimodal[0], "cost", -1.0),
    "nan cost": lambda m: setattr(m.multimodal[0], "cost", float("nan")),
    "placeholder": lambda m: setattr(m.multimodal[0].placeholder, "end", 11),
    "placeholder order": lambda m: setattr(m.multimodal[0].placeholder, "start", 5),
    "empty placeholder": lambda m: setattr(m.multimodal[0].placeholder, "end", m.multimodal[0].placeholder.start),
    "mm kind": lambda m: setattr(m.multimodal[0], "kind", trajectory_pb2.UNIT_KIND_FIELD),
    "mm header": lambda m: setattr(m.multimodal[1].header, "byte_length", 5),
    "finished": lambda m: setattr(m, "finished_at", float("inf")),
}


def report(bad_index: int, name: str, count: int = 4) -> list[trajectory_pb2.TrajectoryMetadata]:
    messages = [message(i, images=2) for i in range(count)]
    MUTATIONS[name](messages[bad_index])
    return messages


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_both_forms_reject_a_bad_trajectory_naming_the_same_field(name: str) -> None:
    messages = report(2, name)
    expected = outcome(lambda: check_batch(messages, LIMITS, 2, max_batch=10))
    if name != "trailing newline id":
        assert expected is not None and expected[0].startswith("trajectories[2].")
    columns = TrajectoryColumns.from_messages(messages)
    assert outcome(lambda: check_columns(columns, LIMITS, 2, max_batch=10)) == expected
    if name == "missing header":  # the one case the batch form cannot express
        return
    batch = TrajectoryColumns.from_proto(batch_from_messages(messages))
    assert outcome(lambda: check_columns(batch, LIMITS, 2, max_batch=10)) == expected


def test_the_first_bad_trajectory_is_named_and_a_repeated_id_in_order() -> None:
    messages = report(3, "hash", count=5)
    MUTATIONS["cost"](messages[1])
    messages[4].trajectory_id = messages[0].trajectory_id
    for columns in both_forms(messages):
        assert outcome(lambda c=columns: check_columns(c, LIMITS, 2, max_batch=10)) == (
            "trajectories[1].multimodal[0].cost", "must be a positive finite number")
    messages = [message(i) for i in range(5)]
    messages[3].trajectory_id = messages[1].trajectory_id
    for columns in both_forms(messages):
        assert outcome(lambda c=columns: check_columns(c, LIMITS, 2, max_batch=10)) == (
            "trajectories[3].trajectory_id", "appears twice in one report")


def test_an_oversized_report_names_trajectories() -> None:
    for columns in both_forms([message(i) for i in range(3)]):
        assert outcome(lambda c=columns: check_columns(c, LIMITS, 2, max_batch=2))[0] == "trajectories"


def test_valid_reports_pass_and_give_each_oldest_version() -> None:
    messages = [message(i, 10 + i, images=i % 3, scalars=True) for i in range(9)]
    messages[4].segments.add(version=1, num_tokens=2)
    messages[4].segments[0].version = 2
    for columns in both_forms(messages):
        check_columns(columns, LIMITS, 2, max_batch=10)
        assert not flag_trajectories(columns, LIMITS, 2).any()
        assert oldest_versions(columns) == [min(s.version for s in m.segments) for m in messages]


@st.composite
def mutated_reports(draw) -> list[trajectory_pb2.TrajectoryMetadata]:
    count = draw(st.integers(min_value=5, max_value=9))  # more than the small-report threshold
    messages = [message(i, draw(st.integers(min_value=6, max_value=40)), images=draw(st.integers(0, 3)))
                for i in range(count)]
    for m in messages:
        names = draw(st.lists(st.sampled_from(sorted(MUTATIONS)), max_size=2))
        for name in names:
            if name in ("missing header",):
                continue
            try:
                MUTATIONS[name](m)
            except (IndexError, ValueError, TypeError):
                pass  # a mutation that does not apply to this trajectory's shape
    return messages


@given(messages=mutated_reports(), version=st.integers(min_value=0, max_value=3))
@settings(max_examples=150, deadline=None)
def test_column_checks_never_pass_what_the_message_check_rejects(messages, version: int) -> None:
    expected = outcome(lambda: check_batch(messages, LIMITS, version, max_batch=20))
    for columns in both_forms(messages):
        flagged = flag_trajectories(columns, LIMITS, version)
        for i, m in enumerate(messages):
            if not flagged[i]:
                check_trajectory(m, f"trajectories[{i}]", LIMITS, version)  # must not raise
        assert outcome(lambda c=columns: check_columns(c, LIMITS, version, max_batch=20)) == expected


def test_shapes_too_large_for_array_arithmetic_are_checked_exactly() -> None:
    messages = [message(i) for i in range(6)]
    for m, shape, byte_length in ((messages[1], [2**40, 2**40, 0], 0), (messages[3], [2**31, 2**31], 2**63)):
        m.units[2].header.ClearField("shape")
        m.units[2].header.shape.extend(shape)
        m.units[2].header.dtype = trajectory_pb2.D_TYPE_INT16
        m.units[2].header.byte_length = byte_length
    for columns in both_forms(messages):
        check_columns(columns, LIMITS, 0, max_batch=10)  # exact products: both are valid


def test_flags_are_exact_for_valid_reports() -> None:
    # No false alarms on valid input: the fast path really is the path.
    messages = [message(i, 10 + i, images=i % 4, scalars=i % 2 == 1) for i in range(50)]
    for columns in both_forms(messages):
        assert not np.any(flag_trajectories(columns, LIMITS, 0))
