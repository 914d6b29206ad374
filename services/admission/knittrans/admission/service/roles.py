"""Trainer roles on the admission side (DESIGN.md §10 "Roles", docs/roles.md): who the planned consumers are, how
they group for verdicts, and what a role's consumers need attached before a mini-batch is theirs.

Consumers group by trainer: the backbone's group is the backbone's (dp, cp) ranks and the encoder consumers (they
feed the backbone's step), and each trainer role is a group of its own. A group's verdict on a mini-batch is
decided by its own consumers' VERIFIED (or the first failure among them), so a producing role can deliver and
attach before the consuming role, which is dispatched only afterwards, verifies anything. Pure functions.
"""

from __future__ import annotations

from knittrans.errors import InvalidArgument
from knittrans.trajectory_schema import TrajectorySchema
from knittrans.types import BACKBONE_ROLE, ENCODER_ROLE_PREFIX, ConsumerId, Topology

BACKBONE_GROUP = ""  # the group of the backbone and its encoders; a trainer role's group is its ConsumerId.role


def all_consumers(topology: Topology) -> tuple[ConsumerId, ...]:
    """Every planned consumer: one per backbone (dp, cp), one per encoder dp rank, one per role (dp, cp)."""
    backbone = topology.backbone
    consumers = [
        ConsumerId(role=BACKBONE_ROLE, dp_rank=dp, cp_rank=cp) for dp in range(backbone.dp) for cp in range(backbone.cp)
    ]
    for encoder in topology.encoders:
        consumers.extend(
            ConsumerId(role=f"{ENCODER_ROLE_PREFIX}{encoder.name}", dp_rank=dp) for dp in range(encoder.dp)
        )
    for role in topology.roles:
        consumers.extend(ConsumerId(role=role.consumer_role, dp_rank=dp, cp_rank=cp)
                         for dp in range(role.backbone.dp) for cp in range(role.backbone.cp))
    return tuple(consumers)


def group_of(consumer: ConsumerId) -> str:
    """The verdict group of a consumer (see the module docstring)."""
    return consumer.role if consumer.role_name is not None else BACKBONE_GROUP


def verdict_groups(consumers: tuple[ConsumerId, ...]) -> dict[str, frozenset[ConsumerId]]:
    """Each verdict group's consumers."""
    groups: dict[str, set[ConsumerId]] = {}
    for consumer in consumers:
        groups.setdefault(group_of(consumer), set()).add(consumer)
    return {group: frozenset(members) for group, members in groups.items()}


def group_of_role(role: str) -> str:
    """The verdict group of consumers with ConsumerId.role ``role`` ("" or "backbone": the backbone's)."""
    return role if role.startswith("role:") else BACKBONE_GROUP


def role_groups(topology: Topology) -> tuple[str, ...]:
    """The trainer roles' groups (the backbone's excepted)."""
    return tuple(role.consumer_role for role in topology.roles)


def check_roles_against_schema(topology: Topology, schema: TrajectorySchema | None) -> None:
    """Every field a role produces is declared in the schema as attached by it, and every attached field is one
    a role produces; errors name the field."""
    attached = {} if schema is None else schema.attached_fields
    if (topology.roles or attached) and schema is None:
        raise InvalidArgument("a job with trainer roles declares its schema, with the fields roles attach",
                              field="schema")
    for role in topology.roles:
        for name in role.produces:
            spec = attached.get(name)
            if spec is None or spec.attached_by != role.name:
                raise InvalidArgument(f"role {role.name!r} produces {name!r}: declare it in the schema's token "
                                      f"fields with attached_by: {role.name}", field=f"schema.token_fields.{name}")
    for name, spec in attached.items():
        producer = topology.producer_of(name)
        if producer is None or producer.name != spec.attached_by:
            raise InvalidArgument(f"field {name!r} is attached by {spec.attached_by!r}, which is not a trainer role "
                                  "that produces it", field=f"schema.token_fields.{name}.attached_by")
