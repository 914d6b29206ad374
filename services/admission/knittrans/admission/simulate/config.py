"""The simulator's config: the admission engine's keys plus the rollout and trainer model.

Load it with ``knittrans.config.load_config(SimConfig, path=...)``; every error names its key. Checks that
need the whole config (can a train batch ever be filled?) run here too, so a bad config fails before any
simulated second is spent on it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from knittrans.admission.engine.config import EngineConfig
from knittrans.admission.engine.quotas import largest_remainder, source_quotas
from knittrans.errors import InvalidArgument
from knittrans.types import AdmissionUnit, SourceName

DEFAULT_WARMUP_STEPS = 2  # without a staleness bound: step 0 is fresh in both modes, step 1 may be transitional


def _check_number(value: object, field_name: str, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidArgument(f"must be a finite number, got {value!r}", field=field_name)
    if value < 0 or (positive and value == 0):
        raise InvalidArgument(f"must be {'positive' if positive else 'non-negative'}, got {value!r}", field=field_name)
    return float(value)


def _check_count(value: object, field_name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgument(f"must be an integer of at least {minimum}, got {value!r}", field=field_name)
    return value


@dataclass(frozen=True, kw_only=True)
class SourceRollout:
    """One data source's rollout: a lognormal duration (mean and std in seconds) and its share of prompts.

    ``std_seconds: 0`` makes durations deterministic. ``mean_seconds`` may be left out when ``--trace``
    supplies the durations. ``mix`` is the source's share of launched prompts; leave it out on every source
    to mix in proportion to the minimum shares in ``sources`` (equally when those are all 0).
    """

    mean_seconds: float | None = None
    std_seconds: float = 0.0
    mix: float | None = None

    def __post_init__(self) -> None:
        if self.mean_seconds is not None:
            object.__setattr__(self, "mean_seconds", _check_number(self.mean_seconds, "mean_seconds", positive=True))
        object.__setattr__(self, "std_seconds", _check_number(self.std_seconds, "std_seconds", positive=False))
        if self.mix is not None:
            object.__setattr__(self, "mix", _check_number(self.mix, "mix", positive=False))


@dataclass(frozen=True, kw_only=True)
class SimConfig(EngineConfig):
    """An :class:`EngineConfig` (``policy`` is the default for ``--policy``) plus the pipeline model.

    Rollout: ``rollout_slots`` trajectories generate at once; a prompt launches when ``group_size`` slots
    are free and yields ``group_size`` trajectories (GRPO). Prompts are launched in rollout steps of
    ``prompts_per_step`` (default: just enough for one train batch), each step split among the sources by
    ``rollout.<source>.mix`` (largest remainder, launch order shuffled). Rollout step r may launch once the
    policy version is at least r − ``rollout_ahead`` (staleness control: at most that many steps ahead of
    training, in both modes), and once ``next_step_after`` of step r − 1's trajectories have finished:
    1 (the default) runs one step at a time, as slime's loop and the paper's Figure 2(a) do; 0.8 starts the
    next step while the slowest fifth of the previous one is still generating; 0 launches steps back to back
    (continuous rollout).
    ``stagger_seconds`` spreads the first launches so that continuous rollout does not finish in waves.
    A trajectory generates ``tokens_per_second`` tokens per second (or its trace's ``num_tokens``).

    Training: a mini-batch takes ``train_seconds_per_minibatch``, or ``train_seconds_per_token`` times its
    tokens (exactly one of the two); a train batch ends with a parameter sync of ``sync_seconds``.
    ``partial_rollout`` pauses unfinished trajectories during colocated training instead of discarding them.

    Run: ``train_batches`` train batches per mode; architectural staleness averages the steps after the
    first ``warmup_steps`` (default: ``staleness_bound``, as in the paper, else 2). ``seed`` fixes the draws.
    """

    rollout_slots: int
    rollout: Mapping[SourceName, SourceRollout] = field(default_factory=dict)
    tokens_per_second: float = 100.0
    train_seconds_per_minibatch: float | None = None
    train_seconds_per_token: float | None = None
    sync_seconds: float = 0.0
    partial_rollout: bool = False
    train_batches: int = 50
    warmup_steps: int | None = None
    prompts_per_step: int | None = None
    rollout_ahead: int = 1
    next_step_after: float = 1.0
    stagger_seconds: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.group_size is None:  # the engine needs it for group units; the rollout always does
            object.__setattr__(self, "group_size", 1)
        _check_count(self.rollout_slots, "rollout_slots", 1)
        if self.rollout_slots < self.group_size:
            raise InvalidArgument(
                f"{self.rollout_slots} slots cannot run one prompt's group of {self.group_size} trajectories "
                "(group_size)",
                field="rollout_slots",
            )
        self._check_rollout()
        object.__setattr__(
            self, "tokens_per_second", _check_number(self.tokens_per_second, "tokens_per_second", positive=True)
        )
        self._check_trainer()
        if not isinstance(self.partial_rollout, bool):
            raise InvalidArgument(f"must be true or false, got {self.partial_rollout!r}", field="partial_rollout")
        _check_count(self.train_batches, "train_batches", 1)
        if self.warmup_steps is not None:
            _check_count(self.warmup_steps, "warmup_steps", 0)
        if self.warmup >= self.train_batches:
            name = "warmup_steps" if self.warmup_steps is not None else "staleness_bound"
            raise InvalidArgument(
                f"a warm-up of {self.warmup} steps leaves none of the {self.train_batches} train batches "
                "(train_batches) to measure",
                field=name,
            )
        _check_count(self.rollout_ahead, "rollout_ahead", 0)
        next_step_after = _check_number(self.next_step_after, "next_step_after", positive=False)
        if next_step_after > 1:
            raise InvalidArgument(f"must be a fraction in [0, 1], got {next_step_after!r}", field="next_step_after")
        object.__setattr__(self, "next_step_after", next_step_after)
        object.__setattr__(
            self, "stagger_seconds", _check_number(self.stagger_seconds, "stagger_seconds", positive=False)
        )
        _check_count(self.seed, "seed", 0)
        if self.prompts_per_step is not None:
            _check_count(self.prompts_per_step, "prompts_per_step", 1)
        self._check_fillable()

    def _check_rollout(self) -> None:
        if isinstance(self.rollout, (str, bytes)) or not isinstance(self.rollout, Mapping):
            raise InvalidArgument("must map source names to their rollout settings", field="rollout")
        for name, settings in self.rollout.items():
            if name not in self.sources:
                raise InvalidArgument(
                    f"is not one of the configured sources ({', '.join(self.sources)})", field=f"rollout.{name}"
                )
            if not isinstance(settings, SourceRollout):
                raise InvalidArgument(f"expected a mapping, got {settings!r}", field=f"rollout.{name}")
        with_mix = [name for name, settings in self.rollout.items() if settings.mix is not None]
        if with_mix and len(with_mix) != len(self.sources):
            missing = next(name for name in self.sources if name not in with_mix)
            raise InvalidArgument("give a mix for every source or for none", field=f"rollout.{missing}.mix")
        if with_mix and not any(self.rollout[name].mix for name in self.sources):
            raise InvalidArgument("at least one source needs a positive mix", field=f"rollout.{with_mix[0]}.mix")
        object.__setattr__(self, "rollout", MappingProxyType(dict(self.rollout)))

    def _check_trainer(self) -> None:
        per_minibatch, per_token = self.train_seconds_per_minibatch, self.train_seconds_per_token
        if (per_minibatch is None) == (per_token is None):
            raise InvalidArgument(
                "set exactly one of train_seconds_per_minibatch and train_seconds_per_token",
                field="train_seconds_per_minibatch" if per_minibatch is not None else "train_seconds_per_token",
            )
        if per_minibatch is not None:
            object.__setattr__(
                self,
                "train_seconds_per_minibatch",
                _check_number(per_minibatch, "train_seconds_per_minibatch", positive=True),
            )
        else:
            object.__setattr__(
                self, "train_seconds_per_token", _check_number(per_token, "train_seconds_per_token", positive=True)
            )
        object.__setattr__(self, "sync_seconds", _check_number(self.sync_seconds, "sync_seconds", positive=False))

    def _check_fillable(self) -> None:
        """Every rollout step must supply a whole train batch, and every source its quota, or training stalls."""
        per_prompt = 1 if self.admission_unit is AdmissionUnit.GROUP else self.group_size
        supply = self.step_prompts * per_prompt
        if supply < self.train_batch_size:
            raise InvalidArgument(
                f"{self.step_prompts} prompts per rollout step yield {supply} admission units, fewer than one train "
                f"batch of {self.train_batch_size} (train_batch_size)",
                field="prompts_per_step",
            )
        quotas = source_quotas(tuple(self.sources.values()), self.train_batch_size)
        for name, quota, prompts in zip(self.sources, quotas, self.prompts_per_source_step, strict=True):
            if prompts * per_prompt < quota:
                where = f"rollout.{name}.mix" if self.rollout.get(name, SourceRollout()).mix is not None else (
                    f"sources.{name}"
                )
                raise InvalidArgument(
                    f"source {name} needs {quota} admission units per train batch, but a rollout step launches "
                    f"only {prompts} of its prompts ({prompts * per_prompt} units): its quota can never be met",
                    field=where,
                )

    # -- derived values ----------------------------------------------------------------------------------

    @property
    def warmup(self) -> int:
        """Train batches left out of the staleness means."""
        if self.warmup_steps is not None:
            return self.warmup_steps
        return self.staleness_bound if self.staleness_bound is not None else DEFAULT_WARMUP_STEPS

    @property
    def step_barrier(self) -> int:
        """How many of a rollout step's trajectories must finish before the next step may launch."""
        assert self.group_size is not None
        return math.ceil(self.next_step_after * self.step_prompts * self.group_size - 1e-9)

    @property
    def trajectories_per_unit(self) -> int:
        assert self.group_size is not None
        return self.group_size if self.admission_unit is AdmissionUnit.GROUP else 1

    @property
    def step_prompts(self) -> int:
        """Prompts per rollout step: the configured count, or just enough for one train batch."""
        if self.prompts_per_step is not None:
            return self.prompts_per_step
        if self.admission_unit is AdmissionUnit.GROUP:
            return self.train_batch_size
        assert self.group_size is not None
        return -(-self.train_batch_size // self.group_size)

    @property
    def source_mix(self) -> tuple[float, ...]:
        """Each source's share of launched prompts, in config order, summing to 1."""
        names = self.source_names
        if any(settings.mix is not None for settings in self.rollout.values()):  # then every source has one
            weights = [self.rollout[n].mix or 0.0 for n in names]
        else:
            weights = [self.sources[n] for n in names]
        total = math.fsum(weights)
        if total <= 0:
            return tuple(1.0 / len(names) for _ in names)
        return tuple(w / total for w in weights)

    @property
    def prompts_per_source_step(self) -> tuple[int, ...]:
        """How many of a rollout step's prompts each source gets: the largest-remainder split of the mix."""
        return largest_remainder(self.source_mix, self.step_prompts)
