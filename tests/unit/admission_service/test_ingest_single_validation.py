"""One validation of a trajectory: the service's column checks accept a report exactly when every trajectory in it
builds as a domain object (:func:`knittrans.wire.trajectory_from_proto`) and fits the job's limits, and name the
first bad trajectory, in both report forms.

The oracle is independent of the column rules: the domain types, plus the job's limits written out here. The
trajectories are drawn from a valid template with each field sometimes replaced by an invalid value, so that
valid and invalid reports are both common.
"""

from __future__ import annotations

import hashlib
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.admission.service.ingest.rules import IngestLimits, check_columns
from knittrans.admission.service.trajectory_columns import TrajectoryColumns
from knittrans.errors import InvalidArgument
from knittrans.v1 import trajectory_pb2
from knittrans.wire import trajectory_from_proto
from knittrans.wire.columns import batch_from_messages

LIMITS = IngestLimits(sources={"A", "B"}, encoders={"vision"}, max_units=3, max_multimodal=2, max_segments=3,
                      max_tokens=1000)
VERSION = 2
HASH = hashlib.blake2b(b"x", digest_size=8).hexdigest()
ITEMSIZE = {trajectory_pb2.D_TYPE_UINT8: 1, trajectory_pb2.D_TYPE_INT32: 4, trajectory_pb2.D_TYPE_FLOAT64: 8}


def mostly(valid, *invalid, rate: int):
    """``valid``, or with probability ``rate`` per mille one of ``invalid`` (hypothesis shrinks towards valid)."""
    return st.integers(0, 999).flatmap(
        lambda roll: st.sampled_from(invalid) if roll < rate and invalid else st.just(valid))


@st.composite
def headers(draw, tokens: int, per_token: bool, rate: int) -> trajectory_pb2.UnitHeader:
    dtype = draw(mostly(trajectory_pb2.D_TYPE_INT32, trajectory_pb2.D_TYPE_UINT8, trajectory_pb2.D_TYPE_FLOAT64, 0,
                        99, rate=rate))
    shape = [tokens, draw(st.integers(1, 3))] if per_token else [draw(st.integers(0, 4))]
    shape = draw(mostly(shape, [], [tokens + 1], [2**40, 2**40, 0], rate=rate))
    byte_length = math.prod(shape) * ITEMSIZE.get(dtype, 1)
    header = trajectory_pb2.UnitHeader(
        dtype=dtype, shape=shape, byte_length=draw(mostly(byte_length, byte_length + 1, 0, rate=rate)),
        content_hash=draw(mostly(HASH, "XYZ", "abc", HASH.upper(), rate=rate)),
        chunk_tokens=draw(mostly(0, 4, rate=rate)),
    )
    seq_axis = draw(mostly(0 if per_token else None, 1, None if per_token else 0, rate=rate))
    if seq_axis is not None:
        header.seq_axis = seq_axis
    return header


@st.composite
def trajectories(draw, index: int, rate: int) -> trajectory_pb2.TrajectoryMetadata:
    tokens = draw(mostly(draw(st.integers(4, 40)), 0, 2000, rate=rate))
    m = trajectory_pb2.TrajectoryMetadata(
        trajectory_id=draw(mostly(f"t{index}", "", "a b", "x" * 257, "t0", "t\n", rate=rate)),
        sample_id=draw(mostly(f"s{index // 2}", "", "ü", rate=rate)),
        source=draw(mostly("A", "B", "Z", rate=rate)),
        rollout_step=draw(st.integers(0, 3)),
        num_tokens=tokens,
        num_loss_tokens=draw(mostly(min(tokens, 3), tokens + 1, rate=rate)),
        accepted=draw(st.booleans()),
        finished_at=draw(mostly(1.5, math.inf, math.nan, rate=rate)),
    )
    for _ in range(draw(mostly(1, 0, 2, 4, rate=rate))):
        m.segments.add(version=draw(mostly(1, 0, 3, rate=rate)), num_tokens=draw(mostly(1, 0, tokens, rate=rate)))
    names = ["input_ids", "routing", "stats", "input_ids", "bad name"]
    for k in range(draw(mostly(2, 0, 1, 4, rate=rate))):
        per_token = k != 1 or draw(st.booleans())
        kind = trajectory_pb2.UNIT_KIND_TOKEN_FIELD if per_token else trajectory_pb2.UNIT_KIND_FIELD
        unit = m.units.add(key=draw(mostly(f"{m.trajectory_id}/{k}", "", "k k", rate=rate)),
                           field_name=draw(mostly(names[k], *names, rate=rate)),
                           kind=draw(mostly(kind, 0, trajectory_pb2.UNIT_KIND_IMAGE, 9, rate=rate)),
                           alignment=draw(mostly(0, trajectory_pb2.FIELD_ALIGNMENT_TOKEN, 7, rate=rate)))
        if draw(mostly(True, False, rate=rate)):
            unit.header.CopyFrom(draw(headers(tokens, per_token, rate)))
    for k in range(draw(mostly(1, 0, 2, 3, rate=rate))):
        start = draw(st.integers(0, max(tokens - 1, 0)))
        ref = m.multimodal.add(
            key=draw(mostly(f"s{index // 2}/img{k}", "", "k k", rate=rate)),
            encoder=draw(mostly("vision", "lidar", rate=rate)),
            cost=draw(mostly(4.0, 0.0, -1.0, math.nan, math.inf, rate=rate)),
            kind=draw(mostly(trajectory_pb2.UNIT_KIND_IMAGE, trajectory_pb2.UNIT_KIND_VIDEO,
                             trajectory_pb2.UNIT_KIND_FIELD, 0, rate=rate)),
            placeholder=trajectory_pb2.TokenSpan(
                start=start, end=draw(mostly(start + 1, start, tokens + 1, max(start - 1, 0), rate=rate))),
        )
        if draw(st.booleans()):
            ref.header.CopyFrom(draw(headers(tokens, False, rate)))
    if draw(st.booleans()):
        m.scalars["reward"] = draw(st.floats(allow_nan=True))
    return m


@st.composite
def reports(draw) -> list[trajectory_pb2.TrajectoryMetadata]:
    count = draw(st.sampled_from([1, 3, 6, 9]))  # both sides of the small-report threshold
    rate = draw(st.sampled_from([0, 5, 20, 100]))  # per mille of fields made invalid: valid reports are common
    return [draw(trajectories(i, rate)) for i in range(count)]


def fits_the_job(m: trajectory_pb2.TrajectoryMetadata) -> bool:
    """The job's limits, written out plainly."""
    return (m.source in LIMITS.sources and m.num_tokens <= LIMITS.max_tokens
            and len(m.segments) <= LIMITS.max_segments and all(s.version <= VERSION for s in m.segments)
            and len(m.units) <= LIMITS.max_units and len(m.multimodal) <= LIMITS.max_multimodal
            and all(r.encoder in LIMITS.encoders for r in m.multimodal))


def is_valid(m: trajectory_pb2.TrajectoryMetadata) -> bool:
    if not fits_the_job(m):
        return False
    try:
        trajectory_from_proto(m)
    except InvalidArgument:
        return False
    return True


def first_rejected(messages: list[trajectory_pb2.TrajectoryMetadata]) -> int | None:
    """The trajectory a rejection must name: the first invalid one or the first repeated id, whichever is first."""
    seen: set[str] = set()
    for i, m in enumerate(messages):
        if not is_valid(m) or m.trajectory_id in seen:
            return i
        seen.add(m.trajectory_id)
    return None


@given(messages=reports())
@settings(max_examples=300, deadline=None)
def test_column_checks_accept_exactly_what_the_domain_types_and_limits_accept(messages) -> None:
    expected = first_rejected(messages)
    forms = [TrajectoryColumns.from_messages(messages)]
    if all(u.HasField("header") for m in messages for u in m.units):
        forms.append(TrajectoryColumns.from_proto(batch_from_messages(messages)))
    for columns in forms:
        try:
            check_columns(columns, LIMITS, VERSION, max_batch=20)
        except InvalidArgument as exc:
            assert expected is not None, exc
            assert exc.field.startswith(f"trajectories[{expected}]"), (exc, expected)
        else:
            assert expected is None
