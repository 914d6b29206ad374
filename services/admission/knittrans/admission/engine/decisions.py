"""What :func:`~knittrans.admission.engine.decide.decide` returns: :class:`Admit`, :class:`Wait` or :class:`Drop`.

The reasons mirror ``BlockingReason`` and ``DropReason`` of ``proto/knittrans/v1/admission.proto``; their
values are the metric label values of docs/metrics.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from knittrans.errors import InvalidArgument
from knittrans.types import TrajectoryId


class BlockingReason(StrEnum):
    NONE = "none"  # nothing blocks: the last decision admitted or dropped
    TRAIN_BATCH_SIZE = "train_batch_size"  # too few ready units for the size target of the next mini-batch
    SOURCE_QUOTA = "source_quota"  # a source is below its progressive target
    COMPLETION_QUOTA = "completion_quota"  # a rollout step is below its completion quota
    FEASIBILITY = "feasibility"  # no candidate of this size passes the feasibility guard yet
    TRAIN_BATCH_COMPLETE = "train_batch_complete"  # waiting for the policy version before the next train batch

    @property
    def is_quota(self) -> bool:
        """Whether waiting for this reason counts toward starvation (``on_starvation``)."""
        return self in QUOTA_REASONS


# Waiting for these counts toward starvation (on_starvation).
QUOTA_REASONS = frozenset(
    {BlockingReason.SOURCE_QUOTA, BlockingReason.COMPLETION_QUOTA, BlockingReason.FEASIBILITY}
)


class DropReason(StrEnum):
    STALE = "stale"  # over the staleness bound for the version that would train it
    FILTERED = "filtered"  # rejected by a rollout-side filter (reported with accepted = false)


@dataclass(frozen=True, kw_only=True, slots=True)
class Admit:
    """Admit one mini-batch: ``trajectory_ids`` in policy order (for groups, each group's ids together).

    ``minibatch_index`` is 0-based. ``relaxed`` is true when starvation handling waived the quotas.
    """

    trajectory_ids: tuple[TrajectoryId, ...]
    train_batch_index: int
    minibatch_index: int
    num_minibatches: int
    train_version: int
    admitted_at: float
    relaxed: bool = False

    def __post_init__(self) -> None:
        if not self.trajectory_ids:
            raise InvalidArgument("an admission needs at least one trajectory", field="trajectory_ids")
        if not 0 <= self.minibatch_index < self.num_minibatches:
            raise InvalidArgument(
                f"{self.minibatch_index} is outside [0, {self.num_minibatches})", field="minibatch_index"
            )

    @property
    def completes_train_batch(self) -> bool:
        return self.minibatch_index == self.num_minibatches - 1


@dataclass(frozen=True, kw_only=True, slots=True)
class Wait:
    """Nothing to do until the inputs change.

    ``since`` is when this blocking reason began. ``wake_at``, when set, is the time at which deciding again
    can give another answer without any new input (starvation handling takes over then).
    """

    reason: BlockingReason
    detail: str
    since: float
    wake_at: float | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Drop:
    """Remove these trajectories without admitting them; their units can be released at once."""

    trajectory_ids: tuple[TrajectoryId, ...]
    reason: DropReason
    detail: str

    def __post_init__(self) -> None:
        if not self.trajectory_ids:
            raise InvalidArgument("a drop needs at least one trajectory", field="trajectory_ids")


Decision = Admit | Wait | Drop
