"""Quota arithmetic: minimum source quotas, mini-batch sizes, α schedules and progressive targets.

:class:`AdmissionTargets` resolves an :class:`EngineConfig` and its policy into the fixed numbers the engine checks
against, once, so that a decision only does arithmetic on counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from knittrans.admission.engine.config import AdmissionPolicy, EngineConfig, OnStarvation
from knittrans.types import AdmissionUnit, SourceName

# Targets are computed in floating point from exact integers and user fractions; a target that is an
# integer up to rounding must not round up to the next one.
_TARGET_TOLERANCE = 1e-9


def largest_remainder(weights: tuple[float, ...], seats: int) -> tuple[int, ...]:
    """Hamilton apportionment of ``seats`` by ``weights``: floors, then one extra seat per largest remainder.

    Ties go to the earlier weight. Only weights with a positive remainder get an extra seat, so no share
    ever exceeds the ceiling of its exact quota.
    """
    exact = [w * seats for w in weights]
    floors = [math.floor(x + _TARGET_TOLERANCE) for x in exact]
    remainders = [x - f for x, f in zip(exact, floors, strict=True)]
    ceilings = sum(f + (1 if r > _TARGET_TOLERANCE else 0) for f, r in zip(floors, remainders, strict=True))
    extra = min(seats, ceilings) - sum(floors)
    order = sorted(
        (i for i, r in enumerate(remainders) if r > _TARGET_TOLERANCE), key=lambda i: (-remainders[i], i)
    )
    for i in order[: max(0, extra)]:
        floors[i] += 1
    return tuple(floors)


def source_quotas(ratios: tuple[float, ...], train_batch_size: int) -> tuple[int, ...]:
    """τ_i = ⌈r_i·τ₀⌉, or the largest-remainder apportionment of τ₀ when those ceilings overfill it (§3.1)."""
    ceilings = tuple(math.ceil(r * train_batch_size - _TARGET_TOLERANCE) for r in ratios)
    if sum(ceilings) <= train_batch_size:
        return ceilings
    return largest_remainder(ratios, train_batch_size)


def minibatch_sizes(train_batch_size: int, num_minibatches: int) -> tuple[int, ...]:
    """m₁…mₙ: as equal as possible, the larger ones first."""
    base, extra = divmod(train_batch_size, num_minibatches)
    return tuple(base + (1 if t < extra else 0) for t in range(num_minibatches))


def linear_schedule(sizes: tuple[int, ...]) -> tuple[float, ...]:
    """α_t = M_t/τ₀: the cumulative share of the train batch after mini-batch t."""
    total = sum(sizes)
    cumulative = 0
    alphas = []
    for size in sizes:
        cumulative += size
        alphas.append(cumulative / total)
    alphas[-1] = 1.0
    return tuple(alphas)


def relaxed_schedule(num_minibatches: int) -> tuple[float, ...]:
    """0 for the first ⌊n/2⌋ mini-batches, then linear up to 1: (0, 0, 0.5, 1) for n = 4, as in the paper."""
    held = num_minibatches // 2
    return tuple(max(0.0, (t - held) / (num_minibatches - held)) for t in range(1, num_minibatches + 1))


def progressive_target(start: int, final: int, alpha: float) -> int:
    """⌈τ_{i,t}⌉ with τ_{i,t} = s_{i,0} + α_{i,t}(τ_i − s_{i,0}) (DESIGN.md §3.2)."""
    return math.ceil(start + alpha * (final - start) - _TARGET_TOLERANCE)


def mirror_requirements(quotas: tuple[int, ...], sizes: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Per mini-batch t, the cumulative count ⌈M_t·τ_i/τ₀⌉ each source needs under the ``linear`` policy."""
    total = sum(sizes)
    cumulative = 0
    rows = []
    for size in sizes:
        cumulative += size
        rows.append(tuple(math.ceil(cumulative * q / total - _TARGET_TOLERANCE) for q in quotas))
    return tuple(rows)


@dataclass(frozen=True, kw_only=True)
class AdmissionTargets:
    """The resolved numbers for one config and policy; ``None`` schedules mean "no such predicate"."""

    policy: AdmissionPolicy
    sources: tuple[SourceName, ...]
    quotas: tuple[int, ...]
    train_batch_size: int
    sizes: tuple[int, ...]
    size_alpha: tuple[float, ...]
    source_alpha: tuple[float, ...] | None
    completion_alpha: tuple[float, ...] | None
    completion_quota: float | None
    guard: bool
    mirror: tuple[tuple[int, ...], ...] | None
    staleness_bound: int | None
    admission_unit: AdmissionUnit
    group_size: int | None
    on_starvation: OnStarvation
    max_batches_ahead: int | None

    @property
    def num_minibatches(self) -> int:
        return len(self.sizes)

    @classmethod
    def build(cls, config: EngineConfig) -> AdmissionTargets:
        n = config.num_minibatches
        sizes = minibatch_sizes(config.train_batch_size, n)
        linear = linear_schedule(sizes)
        whole = (1.0,) * n
        source_schedule = config.source_schedule or relaxed_schedule(n)
        size_schedule = config.size_schedule or linear
        completion_schedule = config.completion_schedule or source_schedule
        quotas = source_quotas(tuple(config.sources.values()), config.train_batch_size)
        policy = config.policy
        with_completion = config.completion_quota is not None
        mirror = None
        if policy is AdmissionPolicy.TRAIN_BATCH:
            size_alpha, source_alpha, completion_alpha, guard = whole, whole, whole, True
        elif policy is AdmissionPolicy.LINEAR:
            size_alpha, source_alpha, completion_alpha, guard = linear, linear, linear, True
            mirror = mirror_requirements(quotas, sizes)
        elif policy is AdmissionPolicy.STREAM:
            size_alpha, source_alpha, completion_alpha, guard = linear, None, None, False
        else:
            size_alpha, source_alpha, completion_alpha = size_schedule, source_schedule, completion_schedule
            guard = policy is AdmissionPolicy.KNITTRANS
        return cls(
            policy=policy,
            sources=config.source_names,
            quotas=quotas,
            train_batch_size=config.train_batch_size,
            sizes=sizes,
            size_alpha=size_alpha,
            source_alpha=source_alpha,
            completion_alpha=completion_alpha if with_completion else None,
            completion_quota=config.completion_quota if completion_alpha is not None else None,
            guard=guard,
            mirror=mirror,
            staleness_bound=config.staleness_bound,
            admission_unit=config.admission_unit,
            group_size=config.group_size,
            on_starvation=config.starvation,
            max_batches_ahead=config.max_batches_ahead,
        )
