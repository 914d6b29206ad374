"""What :func:`~knittrans.admission.engine.decide.decide` reads of an :class:`AdmissionState`: a read-only view.

:class:`DecisionView` is the contract, read-only properties only. :class:`DecisionFields` is the one object
that satisfies it: the state keeps its decision inputs there and mutates them in its transitions; ``decide``
receives it typed as the view. A shared object rather than a snapshot per decision, because a decision that
waits must not allocate: reading a slot is as cheap as reading the state's own attribute.
"""

from __future__ import annotations

from typing import Protocol

from knittrans.admission.engine.completion import CompletionTracker
from knittrans.admission.engine.decisions import BlockingReason, Wait
from knittrans.admission.engine.pool import ReadyPool
from knittrans.admission.engine.quotas import AdmissionTargets
from knittrans.types import TrajectoryId


class DecisionView(Protocol):
    """The inputs of one decision. ``decide`` only reads them (and calls the pool's and tracker's queries)."""

    @property
    def targets(self) -> AdmissionTargets: ...
    @property
    def pool(self) -> ReadyPool: ...
    @property
    def completion(self) -> CompletionTracker | None:
        """Completion-quota bookkeeping, or None without a completion quota."""
    @property
    def filtered(self) -> list[TrajectoryId]:
        """Reported trajectories a rollout-side filter rejected, not dropped yet."""
    @property
    def version_base(self) -> int:
        """v₀: train batch k trains at v₀ + k."""
    @property
    def train_batch_index(self) -> int: ...
    @property
    def minibatch_index(self) -> int:
        """0-based index of the next mini-batch in the current train batch."""
    @property
    def admitted(self) -> list[int]:
        """b_i: units admitted per source in the current train batch."""
    @property
    def admitted_total(self) -> int:
        """b₀."""
    @property
    def relaxed(self) -> bool:
        """Whether a quota of the current train batch was waived."""
    @property
    def units_needed(self) -> int:
        """Ready units the size predicate needs for the next mini-batch."""
    @property
    def size_detail(self) -> str: ...
    @property
    def source_targets(self) -> list[int]:
        """⌈τ_{i,t}⌉ per source for the next mini-batch; empty without source predicates."""
    @property
    def source_details(self) -> list[str]: ...
    @property
    def blocking(self) -> BlockingReason: ...
    @property
    def blocked_since(self) -> float | None: ...
    @property
    def starving_since(self) -> float | None:
        """When the current run of quota waits began (for ``on_starvation``)."""
    @property
    def last_wait(self) -> Wait | None:
        """The wait in force, returned as the same object while nothing changes."""


class DecisionFields:
    """The state's decision inputs, owned and mutated by :class:`AdmissionState` only."""

    __slots__ = (
        "admitted",
        "admitted_total",
        "blocked_since",
        "blocking",
        "completion",
        "filtered",
        "last_wait",
        "minibatch_index",
        "pool",
        "relaxed",
        "size_detail",
        "source_details",
        "source_targets",
        "starving_since",
        "targets",
        "train_batch_index",
        "units_needed",
        "version_base",
    )

    def __init__(self, targets: AdmissionTargets, *, version_base: int) -> None:
        num_sources = len(targets.sources)
        self.targets = targets
        self.pool = ReadyPool(num_sources)
        self.completion = CompletionTracker(targets.completion_quota) if targets.completion_quota is not None else None
        self.filtered: list[TrajectoryId] = []
        self.version_base = version_base
        # The train batch being admitted.
        self.train_batch_index = 0
        self.minibatch_index = 0
        self.admitted = [0] * num_sources  # b_i
        self.admitted_total = 0  # b_0
        self.relaxed = False
        # Targets of the next mini-batch, kept current by every transition that changes them.
        self.units_needed = 0  # ready units the size predicate needs: max(m_t, ⌈τ_{0,t}⌉ − b₀)
        self.source_targets: list[int] = []  # ⌈τ_{i,t}⌉; empty when the policy has no source predicates
        # Wait details for those targets, built once per target change: a wait that repeats the wait in force
        # (same reason, same detail object) is returned as that same object, so waiting allocates nothing.
        self.size_detail = ""
        self.source_details: list[str] = []
        self.last_wait: Wait | None = None
        self.blocking = BlockingReason.NONE
        self.blocked_since: float | None = None
        self.starving_since: float | None = None
