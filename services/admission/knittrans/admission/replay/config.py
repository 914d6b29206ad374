"""The replay's config: the engine's keys plus the trainer model of the replay."""

from __future__ import annotations

import math
from dataclasses import dataclass

from knittrans.admission.engine.config import EngineConfig
from knittrans.errors import InvalidArgument


@dataclass(frozen=True, kw_only=True)
class ReplayConfig(EngineConfig):
    """An :class:`EngineConfig` plus ``train_seconds_per_minibatch``, the trainer's time per mini-batch."""

    train_seconds_per_minibatch: float

    def __post_init__(self) -> None:
        super().__post_init__()
        seconds = self.train_seconds_per_minibatch
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
            raise InvalidArgument(f"must be a number of seconds, got {seconds!r}", field="train_seconds_per_minibatch")
        if seconds <= 0:
            raise InvalidArgument(f"must be positive, got {seconds!r}", field="train_seconds_per_minibatch")
        object.__setattr__(self, "train_seconds_per_minibatch", float(seconds))
