"""The compact form the ledger keeps a pending block in reads back exactly as the block it was made of.

Oracles independent of the packing: plain Python lists of the strings (hashes), the bits of each element
(numeric columns), and the messages the trajectories were reported as (whole blocks, and blocks merged after
being compacted), for hashes that pack and hashes that must not (upper case, other lengths, empty).
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.admission.service.block_merge import merge_rows
from knittrans.admission.service.compact_columns import PackedHashes, compact_columns, constant_array, pack_hashes
from knittrans.admission.service.trajectory_columns import TrajectoryColumns
from knittrans.v1 import trajectory_pb2
from knittrans.wire.columns import batch_from_messages

HEX = "0123456789abcdef"
digests = st.text(HEX, min_size=32, max_size=32)
odd_hashes = st.one_of(st.text(HEX, min_size=8, max_size=64), st.text(HEX.upper(), min_size=32, max_size=32),
                       st.just(""), st.just(" " * 32), st.text(HEX + " ", min_size=32, max_size=32))


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.one_of(digests, digests, odd_hashes), max_size=12))
def test_hashes_read_back_as_given(values: list[str]) -> None:
    packed = pack_hashes(values)
    assert list(packed) == values
    assert [packed[i] for i in range(len(values))] == values
    assert [packed[-i] for i in range(1, len(values) + 1)] == [values[-i] for i in range(1, len(values) + 1)]
    assert tuple(packed[1:-1]) == tuple(values[1:-1])
    assert len(packed) == len(values)
    plain = bool(values) and all(len(v) == 32 and set(v) <= set(HEX) for v in values)
    assert isinstance(packed, PackedHashes) == plain


@st.composite
def arrays(draw: st.DrawFn) -> np.ndarray:
    dtype = draw(st.sampled_from([np.int64, np.uint64, np.float64, bool]))
    if dtype is np.float64:
        element = st.sampled_from([0.0, -0.0, 1.5, float("nan"), float("inf")])
    elif dtype is bool:
        element = st.booleans()
    else:
        element = st.integers(0, 3) if dtype is np.uint64 else st.integers(-2, 2)
    values = draw(st.lists(element, max_size=6))
    if draw(st.booleans()) and values:  # often all equal
        values = [values[0]] * len(values)
    return np.array(values, dtype=dtype)


@settings(max_examples=300, deadline=None)
@given(values=arrays())
def test_constant_columns_read_back_bit_for_bit(values: np.ndarray) -> None:
    compact = constant_array(values)
    assert compact.dtype == values.dtype and compact.shape == values.shape
    assert compact.tobytes() == values.tobytes()
    assert [repr(x) for x in compact.tolist()] == [repr(x) for x in values.tolist()]
    rows = np.arange(len(values))[::-1]
    assert values[rows].tobytes() == compact[rows].tobytes()


@st.composite
def messages(draw: st.DrawFn, first: int, count: int) -> list[trajectory_pb2.TrajectoryMetadata]:
    same_hash = draw(st.booleans())
    hashes = st.one_of(digests, odd_hashes) if draw(st.booleans()) else digests
    constant = draw(st.booleans())
    result = []
    for index in range(first, first + count):
        tokens = 8 if constant else draw(st.integers(4, 12))
        m = trajectory_pb2.TrajectoryMetadata(
            trajectory_id=f"t{index}", sample_id=f"s{index // 2}", source=draw(st.sampled_from("AB")),
            num_tokens=tokens, num_loss_tokens=tokens // 2, rollout_step=0 if constant else index % 3,
            finished_at=draw(st.sampled_from([0.0, -0.0, 12.5])), accepted=True,
            segments=[trajectory_pb2.VersionSegment(version=0, num_tokens=tokens)])
        for name, dtype, width in (("input_ids", trajectory_pb2.D_TYPE_INT32, 1),
                                   ("routing", trajectory_pb2.D_TYPE_UINT8, draw(st.sampled_from([1, 4])))):
            m.units.add(key=f"t{index}/{name}", field_name=name, kind=trajectory_pb2.UNIT_KIND_TOKEN_FIELD,
                        header=trajectory_pb2.UnitHeader(
                            dtype=dtype, shape=[tokens] + ([width] if width > 1 else []), seq_axis=0,
                            byte_length=tokens * width * (4 if dtype == trajectory_pb2.D_TYPE_INT32 else 1),
                            content_hash="ab" * 16 if same_hash else draw(hashes)))
        for k in range(draw(st.integers(0, 2))):
            header = trajectory_pb2.UnitHeader(dtype=trajectory_pb2.D_TYPE_UINT8, shape=[4], byte_length=4,
                                                content_hash=draw(hashes))
            m.multimodal.add(key=f"s{index // 2}/img{k}-{index}", encoder="vision", cost=16.0 + k,
                             kind=trajectory_pb2.UNIT_KIND_IMAGE, placeholder=trajectory_pb2.TokenSpan(
                                 start=1 + k, end=2 + k), **({"header": header} if draw(st.booleans()) else {}))
        if draw(st.booleans()):
            m.scalars["reward"] = draw(st.sampled_from([0.0, -0.0, 0.5]))
        result.append(m)
    return result


@settings(max_examples=60, deadline=None)
@given(data=st.data(), sizes=st.lists(st.integers(1, 5), min_size=1, max_size=3))
def test_compact_blocks_read_back_as_reported(data: st.DataObject, sizes: list[int]) -> None:
    parts, expected, first = [], [], 0
    for size in sizes:
        reported = data.draw(messages(first, size), label="messages")
        first += size
        columns = TrajectoryColumns.from_proto(batch_from_messages(reported))
        compact = compact_columns(columns)
        assert [compact.message(i) for i in range(size)] == reported
        assert [compact.canonical_message(i) for i in range(size)] == [columns.canonical_message(i)
                                                                        for i in range(size)]
        rows = sorted(data.draw(st.sets(st.integers(0, size - 1), min_size=1), label="rows"))
        assert compact.take(rows) == columns.take(rows)
        parts.append((compact, rows))
        expected.extend(reported[i] for i in rows)
    merged = compact_columns(merge_rows(parts))
    assert [merged.message(i) for i in range(len(merged))] == expected
