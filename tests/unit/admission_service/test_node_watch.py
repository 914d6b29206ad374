"""The node stream's pure parts: which message each hosted consumer gets (grouped by plan and message), and the
response framed from messages already serialised, read back by protobuf's own parser as the oracle."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.admission.service.assignment_messages import message_key
from knittrans.admission.service.node_watch import NodeConsumers, node_response_bytes
from knittrans.errors import InvalidArgument
from knittrans.types import ConsumerId
from knittrans.v1 import admission_pb2
from knittrans.v1 import admission_service_pb2 as pb

ROLES = ("backbone", "encoder:vision", "encoder:audio", "role:critic")
consumers = st.lists(
    st.builds(lambda role, dp, cp: ConsumerId(role=role, dp_rank=dp, cp_rank=0 if role.startswith("encoder") else cp),
              st.sampled_from(ROLES), st.integers(0, 6), st.integers(0, 3)),
    min_size=1, max_size=24, unique=True)


@settings(max_examples=200, deadline=None)
@given(consumers)
def test_every_consumer_is_in_exactly_one_group_under_its_own_message(hosted: list[ConsumerId]) -> None:
    node = NodeConsumers(consumers=tuple(hosted))
    seen = []
    for group, keys in node.groups.items():
        for key, positions in keys.items():
            for position in positions:
                consumer = hosted[position]
                assert message_key(consumer) == key
                assert (group == "") == (not consumer.role.startswith("role:"))
                seen.append(position)
    assert sorted(seen) == list(range(len(hosted)))
    for group in node.groups:
        assert node.role_of(group) in {c.role for c in hosted}


@pytest.mark.parametrize(("hosted", "field"), [
    ([], "consumers"),
    ([ConsumerId(role="backbone", dp_rank=0), ConsumerId(role="backbone", dp_rank=1),
      ConsumerId(role="backbone", dp_rank=0)], "consumers[2]"),
])
def test_a_node_names_each_consumer_once(hosted: list[ConsumerId], field: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        NodeConsumers(consumers=tuple(hosted))
    assert raised.value.field == field


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=20),
                          st.integers(1, 2**40), st.binary(max_size=300)), min_size=1, max_size=8))
def test_the_framed_response_is_what_protobuf_reads(parts) -> None:
    messages = []
    for positions, sequence, blob in parts:
        # Any serialised WatchAssignmentsResponse: a sequence and an admission with an arbitrary id.
        message = pb.WatchAssignmentsResponse(sequence=sequence, admission=admission_pb2.MiniBatchAdmission(
            trajectory_ids=[blob.hex()]))
        messages.append((positions, message))
    raw = node_response_bytes([(positions, m.SerializeToString()) for positions, m in messages])
    parsed = pb.WatchNodeAssignmentsResponse.FromString(raw)
    assert [(list(a.consumer_indices), a.assignment) for a in parsed.assignments] == messages
