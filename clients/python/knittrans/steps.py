"""The identity of an optimizer step (DESIGN.md §9): which mini-batch of which train batch, trained at which
policy version. A trainer that restored a checkpoint knows from it which steps it already applied."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from knittrans.errors import InvalidArgument


@dataclass(frozen=True, kw_only=True, order=True)
class StepId:
    """One optimizer step: mini-batch ``minibatch_index`` of train batch ``train_batch_index``, trained at
    policy version ``train_version``. Steps order by (train batch, mini-batch)."""

    train_batch_index: int
    minibatch_index: int
    train_version: int = 0

    def __post_init__(self) -> None:
        for name in ("train_batch_index", "minibatch_index", "train_version"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidArgument(f"must be a non-negative integer, got {value!r}", field=name)

    def __str__(self) -> str:
        return f"train batch {self.train_batch_index}, mini-batch {self.minibatch_index} (v{self.train_version})"

    def sequence(self, num_minibatches: int) -> int:
        """The mini-batch's sequence number in a job of ``num_minibatches`` per train batch (the first is 1)."""
        if not 0 <= self.minibatch_index < num_minibatches:
            raise InvalidArgument(f"mini-batch {self.minibatch_index} of {num_minibatches}", field="minibatch_index")
        return self.train_batch_index * num_minibatches + self.minibatch_index + 1


class RestorePoint(StrEnum):
    """A restored state that holds no :class:`StepId`."""

    # The job restarted without a checkpoint, from its initial weights: it needs every mini-batch again from the
    # job's first, including those an earlier process of it took but never checkpointed.
    BEFORE_FIRST_STEP = "before_first_step"


BEFORE_FIRST_STEP = RestorePoint.BEFORE_FIRST_STEP
