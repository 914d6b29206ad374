""":class:`PoolEntry`: what the engine needs to know about one finished trajectory."""

from __future__ import annotations

import math
from dataclasses import dataclass

from knittrans.errors import InvalidArgument
from knittrans.types import MAX_ID_LENGTH, SampleId, SourceName, TrajectoryId, TrajectoryMeta


@dataclass(frozen=True, kw_only=True, slots=True)
class PoolEntry:
    """One finished trajectory, as reported.

    ``oldest_version`` is the policy version of its oldest token: staleness is measured from it.
    ``ready_at`` is when it finished (the caller's clock); it orders the pool after the staleness deadline.
    ``accepted`` false means a rollout-side filter rejected it: it is dropped at once.
    """

    trajectory_id: TrajectoryId
    sample_id: SampleId
    source: SourceName
    ready_at: float
    oldest_version: int = 0
    rollout_step: int = 0
    num_tokens: int = 0
    accepted: bool = True

    def __post_init__(self) -> None:
        # Ids arrive validated (TrajectoryMeta, trace records); the engine only needs bounded non-empty
        # strings, and this runs once per report on the hot path, so the character check is left to them.
        trajectory_id, sample_id, source = self.trajectory_id, self.sample_id, self.source
        if (
            type(trajectory_id) is not str
            or type(sample_id) is not str
            or type(source) is not str  # the state also checks it against the configured sources
            or not (0 < len(trajectory_id) <= MAX_ID_LENGTH)
            or not (0 < len(sample_id) <= MAX_ID_LENGTH)
            or not (0 < len(source) <= MAX_ID_LENGTH)
        ):
            for name in ("trajectory_id", "sample_id", "source"):
                value = getattr(self, name)
                if type(value) is not str or not 0 < len(value) <= MAX_ID_LENGTH:
                    raise InvalidArgument(
                        f"must be a non-empty string of at most {MAX_ID_LENGTH} characters", field=name
                    )
        ready_at = self.ready_at
        if not isinstance(ready_at, (float, int)) or type(ready_at) is bool:  # numpy floats subclass float
            raise InvalidArgument(f"must be a number of seconds, got {ready_at!r}", field="ready_at")
        if not math.isfinite(ready_at):
            raise InvalidArgument(f"must be finite, got {ready_at!r}", field="ready_at")
        # Plain ints (type(), not isinstance(): bool is an int subclass and must not pass).
        if type(self.oldest_version) is not int or self.oldest_version < 0:
            raise InvalidArgument(
                f"must be a non-negative integer, got {self.oldest_version!r}", field="oldest_version"
            )
        if type(self.rollout_step) is not int or self.rollout_step < 0:
            raise InvalidArgument(f"must be a non-negative integer, got {self.rollout_step!r}", field="rollout_step")
        if type(self.num_tokens) is not int or self.num_tokens < 0:
            raise InvalidArgument(f"must be a non-negative integer, got {self.num_tokens!r}", field="num_tokens")
        if type(self.accepted) is not bool:
            raise InvalidArgument(f"must be true or false, got {self.accepted!r}", field="accepted")

    @classmethod
    def from_meta(cls, meta: TrajectoryMeta, *, ready_at: float) -> PoolEntry:
        """The entry for a reported trajectory; ``ready_at`` is when the service received the report."""
        return cls(
            trajectory_id=meta.trajectory_id,
            sample_id=meta.sample_id,
            source=meta.source,
            ready_at=ready_at,
            oldest_version=meta.oldest_version,
            rollout_step=meta.rollout_step,
            num_tokens=meta.num_tokens,
            accepted=meta.accepted,
        )
