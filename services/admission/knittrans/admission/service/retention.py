"""Admitted mini-batches and when their units are released (DESIGN.md §2 step 7, §9 "Retention follows
checkpoints").

A mini-batch is *stepped* once every planned consumer (every backbone and encoder rank) reported its optimizer
step. Its units are then released at once by default. A job that restores checkpoints keeps them longer, so that
a job restored from a checkpoint gets the mini-batches after it again, byte for byte:

- ``retain_until_checkpoint``: a stepped mini-batch is released once a reported checkpoint covers its step
  (``ReportCheckpoint``: the checkpoint holds every step up to and including the one it names);
- otherwise ``retain_steps`` = k: it is released once k further mini-batches were stepped (0: at once).

:func:`due_for_release` is the rule, a pure function; the ledger applies it after every optimizer step and
every checkpoint, in journal order, so replay releases exactly what the live service released.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from knittrans.admission.service.assignments import MiniBatchDispatch
from knittrans.errors import InvalidArgument
from knittrans.types import ConsumerId, TrajectoryId
from knittrans.v1 import admission_pb2

StepKey = tuple[int, int]  # (train batch index, mini-batch index): steps order by it


class Verdict(StrEnum):
    """Whether an admitted mini-batch may be delivered: decided once, by whichever comes first in the journal,
    every planned consumer's VERIFIED (OK) or a consumer's failure (FAILED), and never changed afterwards."""

    PENDING = "pending"
    OK = "ok"
    FAILED = "failed"


@dataclass
class AdmittedMiniBatch:
    """An admitted mini-batch, kept until every planned consumer reported its optimizer step and retention let
    its units go (and every consumer acknowledged it)."""

    sequence: int
    admission: admission_pb2.MiniBatchAdmission
    trajectory_ids: tuple[TrajectoryId, ...]
    owed_steps: set[ConsumerId]
    dispatch: MiniBatchDispatch | None = None  # its plan, derived from the metadata on demand; never journaled
    verified: set[ConsumerId] = field(default_factory=set)  # consumers that verified it, while PENDING
    verdict: Verdict = Verdict.PENDING  # the backbone's (and its encoders')
    released: bool = False  # its units were released
    role_verdicts: dict[str, Verdict] = field(default_factory=dict)  # "role:<name>" -> that trainer role's verdict
    role_dispatches: dict[str, MiniBatchDispatch] = field(default_factory=dict)  # trainer roles' plans, on demand
    first_step_at: float | None = None  # when the first consumer reported its optimizer step (journal time)

    def verdict_of(self, group: str) -> Verdict:
        """The verdict of a verdict group (:mod:`.roles`): "" is the backbone's."""
        return self.role_verdicts.get(group, Verdict.PENDING) if group else self.verdict

    def keep_dispatch(self, group: str, dispatch: MiniBatchDispatch) -> None:
        if group:
            self.role_dispatches[group] = dispatch
        else:
            self.dispatch = dispatch

    def decide(self, group: str, verdict: Verdict) -> None:
        if group:
            self.role_verdicts[group] = verdict
        else:
            self.verdict = verdict

    @property
    def stepped(self) -> bool:
        """Every planned consumer reported its optimizer step."""
        return not self.owed_steps

    @property
    def step(self) -> StepKey:
        return (self.admission.train_batch_index, self.admission.minibatch_index)


@dataclass(frozen=True, kw_only=True)
class RetentionPolicy:
    """How long stepped mini-batches keep their units (see the module docstring)."""

    retain_steps: int = 0
    retain_until_checkpoint: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.retain_steps, int) or isinstance(self.retain_steps, bool) or not (
                0 <= self.retain_steps <= 1_000_000):
            raise InvalidArgument(f"must be an integer in [0, 1000000], got {self.retain_steps!r}",
                                  field="retain_steps")
        if not isinstance(self.retain_until_checkpoint, bool):
            raise InvalidArgument("must be true or false", field="retain_until_checkpoint")


def due_for_release(held: Sequence[StepKey], checkpoint: StepKey | None, policy: RetentionPolicy) -> list[int]:
    """Which of ``held`` to release now: indices into it. ``held`` are the steps of the stepped mini-batches whose
    units are still held, in admission order; ``checkpoint`` is the latest reported checkpoint's step."""
    if policy.retain_until_checkpoint:
        return [i for i, step in enumerate(held) if checkpoint is not None and step <= checkpoint]
    return [i for i in range(len(held)) if len(held) - 1 - i >= policy.retain_steps]
