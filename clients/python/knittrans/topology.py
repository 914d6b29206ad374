"""The training topology that plans are made for: the backbone, its multimodal encoders, and extra trainer roles.

A job has one final trainer, the *backbone* (the actor, in RL terms), and may declare further trainer roles
(DESIGN.md §10 "Roles", docs/roles.md): a ``reference`` model that computes log-probs, a ``critic`` that computes
values and trains, ... Each role has its own :class:`BackboneTopology` and gets its own plan of every admitted
mini-batch. Roles form a small DAG through fields: a role *produces* fields (it attaches them to the mini-batch's
trajectories, ``AttachFields``) and a role *consumes* fields (it is dispatched a mini-batch only once they are
attached). The backbone consumes and never produces.

Consumers are named by role: ``backbone``, ``encoder:<name>`` and ``role:<name>``. Pure frozen dataclasses.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from knittrans.errors import InvalidArgument
from knittrans.int_checks import check_non_negative_int as _check_non_negative_int
from knittrans.int_checks import check_positive_int as _check_positive_int

BACKBONE_ROLE = "backbone"
ENCODER_ROLE_PREFIX = "encoder:"
ROLE_PREFIX = "role:"
_ROLE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}\Z")




def _check_name(value: str, field_name: str) -> None:
    from knittrans.types import check_id  # types re-exports this module's names, so it imports it last

    check_id(value, field_name)


@dataclass(frozen=True, kw_only=True)
class CostModel:
    """Backbone work of a sequence of length L: ``linear·L + quadratic·L²`` (attention is quadratic)."""

    linear: float = 1.0
    quadratic: float = 0.0

    def __post_init__(self) -> None:
        for name in ("linear", "quadratic"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise InvalidArgument(f"must be a finite non-negative number, got {value!r}", field=name)
        if self.linear == 0 and self.quadratic == 0:
            raise InvalidArgument("linear and quadratic cannot both be 0", field="linear")

    def work(self, length: int) -> float:
        return self.linear * length + self.quadratic * length * length


@dataclass(frozen=True, kw_only=True)
class BackboneTopology:
    dp: int
    cp: int = 1
    tp: int = 1
    max_tokens_per_microbatch: int
    cost: CostModel = field(default_factory=CostModel)
    microbatch_multiple: int = 1  # e.g. the pipeline group: micro-batch counts are multiples of dp times this
    sequence_parallel: bool = False
    pad_multiple: int = 0  # 0: the default, 2·cp (2·cp·tp with sequence parallelism)

    def __post_init__(self) -> None:
        _check_positive_int(self.dp, "dp")
        _check_positive_int(self.cp, "cp")
        _check_positive_int(self.tp, "tp")
        _check_positive_int(self.max_tokens_per_microbatch, "max_tokens_per_microbatch")
        _check_positive_int(self.microbatch_multiple, "microbatch_multiple")
        _check_non_negative_int(self.pad_multiple, "pad_multiple")
        if self.pad_multiple and self.pad_multiple % (2 * self.cp):
            raise InvalidArgument(f"must be a multiple of 2·cp = {2 * self.cp}", field="pad_multiple")

    @property
    def effective_pad_multiple(self) -> int:
        if self.pad_multiple:
            return self.pad_multiple
        return 2 * self.cp * (self.tp if self.sequence_parallel else 1)


@dataclass(frozen=True, kw_only=True)
class EncoderTopology:
    name: str
    dp: int
    tp: int = 1
    max_cost_per_microbatch: float

    def __post_init__(self) -> None:
        _check_name(self.name, "name")
        _check_positive_int(self.dp, "dp")
        _check_positive_int(self.tp, "tp")
        if not (math.isfinite(self.max_cost_per_microbatch) and self.max_cost_per_microbatch >= 1):
            raise InvalidArgument("must be at least 1", field="max_cost_per_microbatch")


@dataclass(frozen=True, kw_only=True)
class TrainerRole:
    """A trainer role besides the backbone (see the module docstring): its own topology, the fields it attaches
    (``produces``) and the fields it needs attached before it is dispatched a mini-batch (``consumes``)."""

    name: str
    backbone: BackboneTopology
    produces: tuple[str, ...] = ()
    consumes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _ROLE_NAME.match(self.name):
            raise InvalidArgument(f"must be 1-64 characters of [A-Za-z0-9_.-], got {self.name!r}", field="name")
        if self.name == BACKBONE_ROLE or self.name.startswith("encoder"):
            raise InvalidArgument(f"{self.name!r} is reserved (the backbone and its encoders)", field="name")
        for name in ("produces", "consumes"):
            values = tuple(getattr(self, name))
            object.__setattr__(self, name, values)
            _check_field_list(values, name)
        both = set(self.produces) & set(self.consumes)
        if both:
            raise InvalidArgument(f"role {self.name!r} both produces and consumes {sorted(both)[0]!r}",
                                  field=f"consumes.{sorted(both)[0]}")

    @property
    def consumer_role(self) -> str:
        """The role string of its consumers (``ConsumerId.role``)."""
        return f"{ROLE_PREFIX}{self.name}"


def _check_field_list(values: tuple[str, ...], name: str) -> None:
    for i, value in enumerate(values):
        if not isinstance(value, str) or not _ROLE_NAME.match(value):
            raise InvalidArgument(f"must be a field name, got {value!r}", field=f"{name}[{i}]")
    if len(set(values)) != len(values):
        raise InvalidArgument("names a field twice", field=name)


def check_role_graph(roles: tuple[TrainerRole, ...], backbone_consumes: tuple[str, ...]) -> None:
    """Role names are unique, every consumed field is produced by exactly one role, and the graph of roles
    (producer -> consumer) has no cycle; errors name the role or field."""
    names = [role.name for role in roles]
    for name in names:
        if names.count(name) > 1:
            raise InvalidArgument(f"role {name!r} is declared twice", field="roles")
    producer: dict[str, str] = {}
    for role in roles:
        for produced in role.produces:
            if produced in producer:
                raise InvalidArgument(f"field {produced!r} is produced by both {producer[produced]!r} and "
                                      f"{role.name!r}", field=f"roles.{role.name}.produces.{produced}")
            producer[produced] = role.name
    consumers = [(role.name, role.consumes, f"roles.{role.name}.consumes") for role in roles]
    consumers.append((BACKBONE_ROLE, backbone_consumes, "consumes"))
    needs: dict[str, set[str]] = {role.name: set() for role in roles}
    for name, consumed, where in consumers:
        for wanted in consumed:
            if wanted not in producer:
                raise InvalidArgument(f"field {wanted!r} is consumed by {name!r} but no role produces it",
                                      field=f"{where}.{wanted}")
            if name != BACKBONE_ROLE:
                needs[name].add(producer[wanted])
    # Kahn's algorithm: a role is placed once every role it needs is; what is left is on a cycle.
    placed: set[str] = set()
    while len(placed) < len(needs):
        ready = [name for name, wanted in needs.items() if name not in placed and wanted <= placed]
        if not ready:
            stuck = sorted(name for name in needs if name not in placed)
            role = next(r for r in roles if r.name == stuck[0])
            field_name = next(f for f in role.consumes if producer[f] in stuck)
            raise InvalidArgument(f"roles {stuck} depend on each other in a cycle (through field {field_name!r})",
                                  field=f"roles.{role.name}.consumes.{field_name}")
        placed.update(ready)


@dataclass(frozen=True, kw_only=True)
class Topology:
    backbone: BackboneTopology
    encoders: tuple[EncoderTopology, ...] = ()
    roles: tuple[TrainerRole, ...] = ()  # trainer roles besides the backbone (docs/roles.md)
    consumes: tuple[str, ...] = ()  # fields the backbone needs attached by roles before it gets a mini-batch

    def __post_init__(self) -> None:
        object.__setattr__(self, "encoders", tuple(self.encoders))
        object.__setattr__(self, "roles", tuple(self.roles))
        object.__setattr__(self, "consumes", tuple(self.consumes))
        names = [e.name for e in self.encoders]
        if len(names) != len(set(names)):
            raise InvalidArgument("encoder names must be unique", field="encoders")
        _check_field_list(self.consumes, "consumes")
        check_role_graph(self.roles, self.consumes)

    def encoder(self, name: str) -> EncoderTopology:
        for enc in self.encoders:
            if enc.name == name:
                return enc
        raise InvalidArgument(f"unknown encoder {name!r}", field="encoder")

    def role(self, name: str) -> TrainerRole:
        for role in self.roles:
            if role.name == name:
                return role
        raise InvalidArgument(f"unknown role {name!r}", field="role")

    def consumed_by(self, consumer_role: str) -> tuple[str, ...]:
        """The fields consumers of ``consumer_role`` (a ConsumerId.role) need attached first."""
        if consumer_role.startswith(ROLE_PREFIX):
            return self.role(consumer_role[len(ROLE_PREFIX):]).consumes
        return self.consumes

    def producer_of(self, field_name: str) -> TrainerRole | None:
        return next((role for role in self.roles if field_name in role.produces), None)

    def view_of(self, consumer_role: str) -> Topology:
        """The topology as a consumer of ``consumer_role`` sees it: a role's own backbone topology stands in for
        the backbone's (its sidecar plans and packs with it); the backbone's and encoders' is this one."""
        if not consumer_role.startswith(ROLE_PREFIX):
            return self
        role = self.role(consumer_role[len(ROLE_PREFIX):])
        return Topology(backbone=role.backbone, roles=(TrainerRole(name=role.name, backbone=role.backbone),))


@dataclass(frozen=True, kw_only=True, order=True)
class ConsumerId:
    """A data-plane endpoint: one reorg sidecar per (role, DP rank, CP rank), shared by its TP ranks."""

    role: str
    dp_rank: int
    cp_rank: int = 0

    def __post_init__(self) -> None:
        prefixes = (ENCODER_ROLE_PREFIX, ROLE_PREFIX)
        if self.role != BACKBONE_ROLE and not any(
            self.role.startswith(prefix) and len(self.role) > len(prefix) for prefix in prefixes
        ):
            raise InvalidArgument(f"must be 'backbone', 'encoder:<name>' or 'role:<name>', got {self.role!r}",
                                  field="role")
        _check_non_negative_int(self.dp_rank, "dp_rank")
        _check_non_negative_int(self.cp_rank, "cp_rank")

    @property
    def encoder_name(self) -> str | None:
        return self.role[len(ENCODER_ROLE_PREFIX) :] if self.role.startswith(ENCODER_ROLE_PREFIX) else None

    @property
    def role_name(self) -> str | None:
        """A trainer role's name (``role:<name>``), None for the backbone and encoders."""
        return self.role[len(ROLE_PREFIX) :] if self.role.startswith(ROLE_PREFIX) else None

    @property
    def trains_sequences(self) -> bool:
        """Whether it is a backbone-like consumer (the backbone, or a trainer role), not an encoder."""
        return self.encoder_name is None

    def check_within(self, topology: Topology) -> None:
        """Raise unless this consumer exists in ``topology``."""
        if self.encoder_name is not None:
            dp, cp = topology.encoder(self.encoder_name).dp, 1
        elif self.role_name is not None:
            role = topology.role(self.role_name).backbone
            dp, cp = role.dp, role.cp
        else:
            dp, cp = topology.backbone.dp, topology.backbone.cp
        if self.dp_rank >= dp:
            raise InvalidArgument(f"dp_rank {self.dp_rank} is outside dp={dp}", field="dp_rank")
        if self.cp_rank >= cp:
            raise InvalidArgument(f"cp_rank {self.cp_rank} is outside cp={cp}", field="cp_rank")

    def __str__(self) -> str:
        return f"{self.role}/dp{self.dp_rank}/cp{self.cp_rank}"
