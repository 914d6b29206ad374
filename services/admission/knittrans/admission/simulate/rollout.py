"""The rollout side of the model: where durations come from, and the prompts in launch order.

A :class:`RolloutScript` fixes, prompt by prompt, the source and each trajectory's duration and token
count. Every mode and policy launches prompts in the same order, so they all see the same rollout: the
comparison between them is paired, as in the paper's replay ("the same source-local rollout durations").
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Protocol

from knittrans.admission.replay.trace import Trace
from knittrans.admission.simulate.config import SimConfig
from knittrans.errors import ConfigError, TraceFormatError


class DurationModel(Protocol):
    def draw(self, source: int, rng: random.Random) -> tuple[float, int]:
        """One trajectory of ``source`` (its index in the config): (duration in seconds, tokens)."""
        ...


def lognormal_parameters(mean: float, std: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal distribution with this mean and standard deviation."""
    sigma2 = math.log1p((std / mean) ** 2)
    return math.log(mean) - sigma2 / 2.0, math.sqrt(sigma2)


class LognormalDurations:
    """Per-source lognormal durations from ``rollout.<source>.mean_seconds``/``std_seconds``; std 0 is exact."""

    def __init__(self, config: SimConfig) -> None:
        self._tokens_per_second = config.tokens_per_second
        self._parameters: list[tuple[float, float, float] | None] = []
        for name, prompts in zip(config.source_names, config.prompts_per_source_step, strict=True):
            settings = config.rollout.get(name)
            if settings is None or settings.mean_seconds is None:
                if prompts:
                    raise ConfigError(
                        "is required without --trace: the source's mean rollout duration in seconds",
                        field=f"rollout.{name}.mean_seconds",
                    )
                self._parameters.append(None)  # never launched
                continue
            mu, sigma = lognormal_parameters(settings.mean_seconds, settings.std_seconds)
            self._parameters.append((settings.mean_seconds, mu, sigma))

    def draw(self, source: int, rng: random.Random) -> tuple[float, int]:
        parameters = self._parameters[source]
        assert parameters is not None
        mean, mu, sigma = parameters
        duration = rng.lognormvariate(mu, sigma) if sigma > 0 else mean
        return duration, max(1, round(duration * self._tokens_per_second))


class TraceDurations:
    """Durations (``end − start``) and token counts resampled from a trace's finished trajectories, per source.

    Unfinished lines (``end: null``) carry no duration and are skipped; ``accepted`` is not modelled.
    """

    def __init__(self, trace: Trace, config: SimConfig) -> None:
        trace.check_sources(config.source_names)
        index = {name: i for i, name in enumerate(config.source_names)}
        self._samples: list[list[tuple[float, int]]] = [[] for _ in config.source_names]
        for record in trace.records:
            if record.end is None:
                continue
            duration = record.end - record.start
            if duration <= 0:
                raise TraceFormatError(
                    f"the duration end - start must be positive, got {duration:g} s",
                    field=f"line {record.line}, field 'end'",
                )
            self._samples[index[record.source]].append((duration, record.num_tokens))
        for name, prompts, samples in zip(
            config.source_names, config.prompts_per_source_step, self._samples, strict=True
        ):
            if prompts and not samples:
                raise ConfigError(
                    f"the trace has no finished trajectory of source {name!r} to draw durations from",
                    field=f"rollout.{name}",
                )

    def draw(self, source: int, rng: random.Random) -> tuple[float, int]:
        samples = self._samples[source]
        return samples[rng.randrange(len(samples))]


class RolloutScript:
    """The prompts in launch order, drawn lazily one rollout step at a time and shared by every run.

    Prompt p has source ``sources[p]`` and rollout step p // ``step_prompts``; its trajectories are
    p·g … p·g + g − 1 (g = ``group_size``), with ``durations`` and ``tokens`` indexed by trajectory.
    """

    def __init__(self, config: SimConfig, durations: DurationModel) -> None:
        assert config.group_size is not None
        self.group_size = config.group_size
        self.step_prompts = config.step_prompts
        self._allotment: Sequence[int] = config.prompts_per_source_step
        self._durations = durations
        self._rng = random.Random(config.seed)
        self.sources: list[int] = []
        self.durations: list[float] = []
        self.tokens: list[int] = []

    def ensure(self, prompts: int) -> None:
        """Draw rollout steps until at least ``prompts`` prompts exist."""
        rng, draw, group_size = self._rng, self._durations.draw, self.group_size
        while len(self.sources) < prompts:
            order = [source for source, count in enumerate(self._allotment) for _ in range(count)]
            rng.shuffle(order)
            for source in order:
                for _ in range(group_size):
                    duration, tokens = draw(source, rng)
                    self.durations.append(duration)
                    self.tokens.append(tokens)
            self.sources.extend(order)
