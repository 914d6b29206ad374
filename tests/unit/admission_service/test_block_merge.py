"""Merging small blocks keeps every row as it was reported, typed values and response-only fields included.

The oracle is the messages the rows were reported as: each merged row must read back as its own message, whichever
of its block's columns (units and their coverage, response starts, scalars, typed values) it had.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.admission.service.block_merge import merge_rows
from knittrans.admission.service.trajectory_columns import TrajectoryColumns
from knittrans.v1 import trajectory_pb2
from knittrans.wire.columns import batch_from_messages

HASH = "ab" * 16


def _message(index: int, typed: bool) -> trajectory_pb2.TrajectoryMetadata:
    tokens = 8 + index % 5
    m = trajectory_pb2.TrajectoryMetadata(
        trajectory_id=f"t{index}", sample_id=f"s{index // 2}", source="A", num_tokens=tokens,
        segments=[trajectory_pb2.VersionSegment(version=0, num_tokens=tokens)],
        units=[trajectory_pb2.UnitRef(
            key=f"t{index}/input_ids", field_name="input_ids", kind=trajectory_pb2.UNIT_KIND_TOKEN_FIELD,
            header=trajectory_pb2.UnitHeader(dtype=trajectory_pb2.D_TYPE_INT32, shape=[tokens], seq_axis=0,
                                             byte_length=4 * tokens, content_hash=HASH))],
        accepted=True,
    )
    m.scalars["reward"] = index / 3
    if typed:  # and a response-only field
        response = tokens - 3
        m.response_start = 3
        m.units.add(key=f"t{index}/old_logprobs", field_name="old_logprobs", kind=trajectory_pb2.UNIT_KIND_TOKEN_FIELD,
                    coverage=trajectory_pb2.TOKEN_COVERAGE_RESPONSE,
                    header=trajectory_pb2.UnitHeader(dtype=trajectory_pb2.D_TYPE_FLOAT32, shape=[response],
                                                     seq_axis=0, byte_length=4 * response, content_hash=HASH))
        m.values.int_scalars["turns"] = index
        m.values.bool_scalars["solved"] = index % 2 == 0
        m.values.metadata["uid"].text = f"u{index}"
    return m


@settings(max_examples=50, deadline=None)
@given(blocks=st.lists(st.lists(st.booleans(), min_size=1, max_size=4), min_size=1, max_size=4), data=st.data())
def test_merged_rows_read_back_as_reported(blocks: list[list[bool]], data: st.DataObject) -> None:
    parts, expected, index = [], [], 0
    for typed in blocks:
        messages = [_message(index + i, flag) for i, flag in enumerate(typed)]
        index += len(typed)
        columns = TrajectoryColumns.from_proto(batch_from_messages(messages))
        rows = sorted(data.draw(st.sets(st.integers(0, len(messages) - 1), min_size=1), label="rows"))
        parts.append((columns, rows))
        expected.extend(messages[i] for i in rows)
    merged = merge_rows(parts)
    assert [merged.message(i) for i in range(len(merged))] == expected
