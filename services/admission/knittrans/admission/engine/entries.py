""":class:`PoolEntry`: what the engine needs to know about one finished trajectory; :class:`PoolEntries`: many."""

from __future__ import annotations

import math
from collections.abc import Sequence
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


@dataclass(frozen=True, kw_only=True)
class PoolEntries:
    """Many finished trajectories reported together, as columns: trajectory ``i`` is element ``i`` of each.

    The same fields and rules as :class:`PoolEntry`, checked a column at a time (a service ingests thousands
    of reports a second, and one check per column costs far less than one object per report). ``ready_at``
    is one time for the whole report. :meth:`AdmissionState.add_many` takes them.
    """

    trajectory_ids: Sequence[TrajectoryId]
    sample_ids: Sequence[SampleId]
    sources: Sequence[SourceName]
    ready_at: float
    oldest_versions: Sequence[int]
    rollout_steps: Sequence[int]
    num_tokens: Sequence[int]
    accepted: Sequence[bool]

    def __post_init__(self) -> None:
        count = len(self.trajectory_ids)
        for name in ("sample_ids", "sources", "oldest_versions", "rollout_steps", "num_tokens", "accepted"):
            if len(getattr(self, name)) != count:
                raise InvalidArgument(f"needs one value per trajectory ({count})", field=name)
        if not count:
            return
        for name in ("trajectory_ids", "sample_ids", "sources"):
            values = getattr(self, name)
            lengths = list(map(len, values)) if set(map(type, values)) == {str} else [0]
            if not (0 < min(lengths) and max(lengths) <= MAX_ID_LENGTH):
                raise InvalidArgument(
                    f"must be non-empty strings of at most {MAX_ID_LENGTH} characters", field=name
                )
        ready_at = self.ready_at
        if not isinstance(ready_at, (float, int)) or type(ready_at) is bool or not math.isfinite(ready_at):
            raise InvalidArgument(f"must be a finite number of seconds, got {ready_at!r}", field="ready_at")
        for name in ("oldest_versions", "rollout_steps", "num_tokens"):
            values = getattr(self, name)
            if set(map(type, values)) != {int} or min(values) < 0:
                raise InvalidArgument("must be non-negative integers", field=name)
        if set(map(type, self.accepted)) != {bool}:
            raise InvalidArgument("must be true or false", field="accepted")

    def __len__(self) -> int:
        return len(self.trajectory_ids)

    def entry(self, i: int) -> PoolEntry:
        return PoolEntry(
            trajectory_id=self.trajectory_ids[i],
            sample_id=self.sample_ids[i],
            source=self.sources[i],
            ready_at=self.ready_at,
            oldest_version=self.oldest_versions[i],
            rollout_step=self.rollout_steps[i],
            num_tokens=self.num_tokens[i],
            accepted=self.accepted[i],
        )
