"""One assignment stream for the consumers one process hosts (``WatchNodeAssignments``).

With a stream per consumer, the service wrote every mini-batch's message once per consumer: 320 writes for
dp 64 × cp 4 plus 64 encoder ranks, each costing the service and the consumer's process about as much as
building a message, though the four CP ranks of a DP rank get the same bytes. A node's sidecar process holds one
stream for all its consumers instead: each message goes over it once, with the positions of the consumers it is
for, and the messages built by the time the stream gets to run go out together.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from knittrans.admission.service.assignment_messages import message_key
from knittrans.admission.service.roles import group_of_role
from knittrans.admission.service.route_wire import framed, varint
from knittrans.errors import InvalidArgument
from knittrans.types import ConsumerId
from knittrans.v1 import admission_service_pb2 as pb

_ASSIGNMENTS = pb.WatchNodeAssignmentsResponse.DESCRIPTOR.fields_by_name["assignments"].number
_INDICES = pb.NodeAssignment.DESCRIPTOR.fields_by_name["consumer_indices"].number
_ASSIGNMENT = pb.NodeAssignment.DESCRIPTOR.fields_by_name["assignment"].number


@dataclass(frozen=True, kw_only=True)
class NodeConsumers:
    """A node stream's consumers (each once), and, derived from them, their positions in the request by verdict
    group (one plan each) and message key."""

    consumers: tuple[ConsumerId, ...]
    groups: dict[str, dict[ConsumerId, tuple[int, ...]]] = field(init=False)  # group -> message key -> positions

    def __post_init__(self) -> None:
        if not self.consumers:
            raise InvalidArgument("names no consumer", field="consumers")
        seen: dict[ConsumerId, int] = {}
        groups: dict[str, dict[ConsumerId, list[int]]] = {}
        for position, consumer in enumerate(self.consumers):
            if seen.setdefault(consumer, position) != position:
                raise InvalidArgument(f"names {consumer} again (first at {seen[consumer]})",
                                      field=f"consumers[{position}]")
            keys = groups.setdefault(group_of_role(consumer.role), {})
            keys.setdefault(message_key(consumer), []).append(position)
        object.__setattr__(self, "groups", {group: {key: tuple(positions) for key, positions in keys.items()}
                                            for group, keys in groups.items()})

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(consumer.role for consumer in self.consumers))

    def role_of(self, group: str) -> str:
        """A role of the group's consumers (every role of a verdict group gets the same plan)."""
        return next(c.role for c in self.consumers if group_of_role(c.role) == group)


def node_response_bytes(messages: Sequence[tuple[Sequence[int], bytes]]) -> bytes:
    """A serialised ``WatchNodeAssignmentsResponse`` of these (positions, serialised WatchAssignmentsResponse):
    the messages are framed as they are, not parsed and serialised again."""
    out = []
    for positions, data in messages:
        indices = b"".join(varint(p) for p in positions)
        entry = framed(_INDICES, indices) + framed(_ASSIGNMENT, data)
        out.append(framed(_ASSIGNMENTS, entry))
    return b"".join(out)
