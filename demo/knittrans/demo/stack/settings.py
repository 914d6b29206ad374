"""What `knittrans demo` runs: sizes, topology, store and state choices (loaded with the config loader)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from knittrans.admission.engine import AdmissionPolicy
from knittrans.demo.chaos.schedule import ChaosSettings
from knittrans.errors import InvalidArgument
from knittrans.job import check_job
from knittrans.stack.local import StateKind, StoreKind

SOURCES = ("math", "code", "chart", "agentic")  # the workload's four sources (knittrans.demo.workload)
DEFAULT_OUT = "demo-out"


class DemoRole(StrEnum):
    """The demo's trainer roles: the actor (the backbone) always; a frozen reference that attaches
    ``ref_logprobs`` if asked (``--roles reference,actor``)."""

    REFERENCE = "reference"
    ACTOR = "actor"


# What ``roles`` may be, as sets (the order they are given in does not matter).
ROLE_CHOICES = (frozenset({DemoRole.ACTOR}), frozenset({DemoRole.REFERENCE, DemoRole.ACTOR}))


@dataclass(frozen=True, kw_only=True)
class DemoSettings:
    # Empty: a fresh job id per run (demo-<random>), so runs at the same time never share a name. A given job is
    # held by its run: a second run of it is refused while the first lives.
    job: str = ""
    # Empty: demo-out, or demo-out-<job> while another run holds demo-out. A given directory is held by its run.
    out: str = ""
    store: StoreKind = StoreKind.FILE
    state: StateKind = StateKind.MEMORY
    policy: AdmissionPolicy = AdmissionPolicy.KNITTRANS
    dp: int = 2
    cp: int = 2
    encoder_dp: int = 2
    group_size: int = 4
    train_batch_size: int = 32  # trajectories; a multiple of 4 sources × group_size keeps the quarter quotas exact
    num_minibatches: int = 4
    train_batches: int = 8
    rollout_workers: int = 2
    rollout_concurrency: int = 6
    time_scale: float = 1.0  # multiplies the workload's per-source rollout durations
    max_tokens_per_microbatch: int = 192
    learning_rate: float = 1e-2
    seed: int = 0
    timeout_seconds: float = 600.0
    # 1: everything on this machine; 3: the three-node layout in network namespaces (root; a mooncake store)
    nodes: int = 1
    # A seed: the chaos run (knittrans.demo.chaos), on Redis state and a Mooncake store
    chaos: ChaosSettings = field(default_factory=ChaosSettings)
    # The trainer roles: the actor alone, or a frozen reference that attaches ref_logprobs too (docs/roles.md)
    roles: tuple[str, ...] = (DemoRole.ACTOR,)
    reference_dp: int = 1  # the reference's DP ranks (cp 1: a producing role holds whole sequences)
    reference_max_tokens_per_microbatch: int = 384
    kl_coefficient: float = 0.05  # weight of the actor's KL(policy || reference) term, with the reference

    def __post_init__(self) -> None:
        object.__setattr__(self, "roles", _parse_roles(self.roles))
        if self.job:
            check_job(self.job)
        for name in ("dp", "cp", "encoder_dp", "group_size", "num_minibatches", "train_batches", "rollout_workers",
                     "rollout_concurrency", "reference_dp", "reference_max_tokens_per_microbatch"):
            if getattr(self, name) < 1:
                raise InvalidArgument("must be at least 1", field=name)
        if self.train_batch_size % (len(SOURCES) * self.group_size):
            raise InvalidArgument(
                f"must be a multiple of {len(SOURCES)} sources × group_size = {len(SOURCES) * self.group_size}",
                field="train_batch_size",
            )
        if self.train_batch_size % self.num_minibatches:
            raise InvalidArgument("must split evenly into num_minibatches", field="train_batch_size")
        if self.encoder_dp > self.dp * self.cp:
            raise InvalidArgument("cannot exceed the number of trainer ranks (dp × cp)", field="encoder_dp")
        if self.time_scale < 0:
            raise InvalidArgument("must not be negative", field="time_scale")
        if self.nodes not in (1, 3):
            raise InvalidArgument("must be 1 (one machine) or 3 (the three-node layout)", field="nodes")
        if self.nodes > 1 and self.store is not StoreKind.MOONCAKE:
            raise InvalidArgument("a file store is private to its node; several nodes share a mooncake store",
                                  field="store")
        if self.chaos.enabled and (self.nodes > 1 or self.state is not StateKind.REDIS
                                   or self.store is not StoreKind.MOONCAKE):
            raise InvalidArgument("the chaos run is on one machine, with redis state and a mooncake store",
                                  field="chaos")
        if self.chaos.enabled and self.with_reference:
            raise InvalidArgument("the chaos run has the actor alone", field="roles")
        if not (self.kl_coefficient >= 0 and math.isfinite(self.kl_coefficient)):
            raise InvalidArgument("must be a finite number, at least 0", field="kl_coefficient")

    @property
    def with_reference(self) -> bool:
        return DemoRole.REFERENCE in self.roles

    @property
    def world_size(self) -> int:
        return self.dp * self.cp

    @property
    def num_samples(self) -> int:
        return self.train_batches * self.train_batch_size // self.group_size

    @property
    def num_steps(self) -> int:
        return self.train_batches * self.num_minibatches


def _parse_roles(roles: object) -> tuple[DemoRole, ...]:
    """``roles`` as :class:`DemoRole` s in dependency order (the reference before the actor that consumes it)."""
    allowed = " or ".join(",".join(r for r in DemoRole if r in choice) for choice in ROLE_CHOICES)
    if isinstance(roles, str) or not isinstance(roles, (list, tuple)):
        raise InvalidArgument(f"must be a list of roles: {allowed}, got {roles!r}", field="roles")
    try:
        parsed = [DemoRole(str(role)) for role in roles]
    except ValueError:
        raise InvalidArgument(f"must be {allowed}, got {','.join(map(str, roles))}", field="roles") from None
    if len(parsed) != len(set(parsed)) or frozenset(parsed) not in ROLE_CHOICES:
        raise InvalidArgument(f"must be {allowed}, got {','.join(map(str, roles))}", field="roles")
    return tuple(role for role in DemoRole if role in parsed)
