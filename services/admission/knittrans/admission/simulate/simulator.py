"""The discrete-event pipeline simulation: one policy in one mode, driving the service's admission engine.

Time runs on the rollout clock. In disaggregated execution it is the wall clock; in colocated execution
it stands still while a train batch trains, and ``offset`` (wall − rollout clock) grows by the training
and sync time instead. A trajectory's version segments are then read off ``version_times`` on the rollout
clock in both modes, which is what makes paused-and-resumed trajectories (partial rollout) come out right.

The engine is driven exactly as the service drives it: ``add_scheduled`` at each launch, ``add`` with the
oldest version of each finished trajectory, ``decide``/``apply`` until a wait after every event, the
policy version as the trainer's. Staleness-bound drops therefore happen as in the service.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from knittrans.admission.engine import (
    AdmissionPolicy,
    AdmissionState,
    Admit,
    Drop,
    DropReason,
    PoolEntry,
    Wait,
    decisions_until_wait,
)
from knittrans.admission.replay.progress import ProgressBar
from knittrans.admission.simulate.config import SimConfig
from knittrans.admission.simulate.events import COMPLETE, SLOTS, VERSION, WAKE, EventQueue
from knittrans.admission.simulate.modes import MODES, Mode, ModeRules
from knittrans.admission.simulate.results import ModeResult, PolicySimulation, StepResult
from knittrans.admission.simulate.rollout import RolloutScript
from knittrans.admission.simulate.segments import version_token_sum
from knittrans.errors import StarvationError
from knittrans.types import AdmissionUnit


class _StepAccumulator:
    """What the simulation learns about the train batch being admitted."""

    __slots__ = ("admit_times", "composition", "max_staleness", "relaxed", "token_staleness", "tokens",
                 "train_seconds", "trajectories", "trajectory_staleness")

    def __init__(self, num_sources: int) -> None:
        self.admit_times: list[float] = []
        self.composition = [0] * num_sources  # in admission units
        self.trajectories = 0
        self.tokens = 0
        self.token_staleness = 0.0
        self.trajectory_staleness = 0
        self.max_staleness = 0
        self.train_seconds = 0.0
        self.relaxed = False


class _Run:
    """The mutable state of one run; :func:`simulate_mode` builds one and calls :meth:`run`."""

    def __init__(
        self, config: SimConfig, policy: AdmissionPolicy, mode: Mode, script: RolloutScript,
        progress: ProgressBar | None,
    ) -> None:
        self.config = config
        self.policy = policy
        self.rules = rules = ModeRules.of(mode, config)
        engine_config = dataclasses.replace(config, policy=policy, max_batches_ahead=rules.max_batches_ahead)
        self.state = AdmissionState(engine_config, version=0)
        self.targets = self.state.targets
        self.script = script
        self.progress = progress
        self.queue = EventQueue()
        self.now = 0.0  # rollout clock
        self.offset = 0.0  # wall − rollout clock
        self.version = 0
        self.version_times = [0.0]  # rollout-clock instant each version became current
        self.free_slots = 0
        self.next_prompt = 0
        self.in_flight: set[int] = set()
        self.finished_per_step: list[int] = []  # trajectories finished (or discarded) per rollout step
        self.step_barrier = config.step_barrier
        self.starts: list[float] = []  # per launched trajectory, on the rollout clock
        self.oldest: list[int] = []
        self.version_sums: list[float] = []
        self.trainer_free_at = 0.0  # wall clock (disaggregated)
        self.trained = 0
        self.steps: list[StepResult] = []
        self.step = _StepAccumulator(len(self.targets.sources))
        self.staleness_counts: Counter[int] = Counter()
        self.dropped_stale = 0
        self.discarded = 0
        self.completed = 0
        self.admitted = 0
        self.failed: str | None = None
        self.last_wait: Wait | None = None
        self.wakes: set[float] = set()
        self._release_slots()

    def _release_slots(self) -> None:
        """All slots free at t = 0, or one prompt's worth per lane spread over ``stagger_seconds``."""
        config = self.config
        group_size = self.script.group_size
        lanes, spare = divmod(config.rollout_slots, group_size)
        stagger = config.stagger_seconds
        if stagger <= 0:
            self.free_slots = config.rollout_slots
            return
        self.free_slots = spare
        for lane in range(lanes):
            self.queue.push(stagger * lane / lanes, SLOTS, group_size)

    # -- the loop ----------------------------------------------------------------------------------------

    def run(self) -> ModeResult:
        queue = self.queue
        target = self.config.train_batches
        self._settle()
        while self.trained < target and self.failed is None:
            if not queue:
                self.failed = self._stall_message()
                break
            self.now, due = queue.pop_next_instant()
            for kind, argument in due:
                if kind == COMPLETE:
                    if argument in self.in_flight:  # else discarded at the end of a colocated phase
                        self._complete(argument)
                elif kind == VERSION:
                    self._advance_version()
                elif kind == SLOTS:
                    self.free_slots += argument
                # WAKE: nothing to do but decide again
            self._settle()
        if self.progress is not None:
            self.progress.close()
        return self._result()

    def _settle(self) -> None:
        """Launch what may launch and decide until the engine waits; again after a train batch is collected."""
        while self.failed is None and self.trained < self.config.train_batches:
            before = (self.version, len(self.steps))
            self._launch()
            self._decide()
            if (self.version, len(self.steps)) == before:
                return

    def _launch(self) -> None:
        script = self.script
        group_size = script.group_size
        if self.free_slots < group_size:
            return
        step_prompts = script.step_prompts
        ahead = self.config.rollout_ahead
        barrier = self.step_barrier
        finished = self.finished_per_step
        queue, in_flight, starts, now = self.queue, self.in_flight, self.starts, self.now
        while self.free_slots >= group_size:
            prompt = self.next_prompt
            step = prompt // step_prompts
            if step - ahead > self.version or (step and finished[step - 1] < barrier):
                return
            if prompt % step_prompts == 0:
                finished.append(0)
            if prompt >= len(script.sources):
                script.ensure(prompt + 1)
            first = prompt * group_size
            durations = script.durations
            for trajectory in range(first, first + group_size):
                queue.push(now + durations[trajectory], COMPLETE, trajectory)
                in_flight.add(trajectory)
                starts.append(now)
            self.oldest.extend([0] * group_size)
            self.version_sums.extend([0.0] * group_size)
            self.free_slots -= group_size
            self.state.add_scheduled(step, group_size)
            self.next_prompt = prompt + 1

    def _complete(self, trajectory: int) -> None:
        self.in_flight.discard(trajectory)
        self.free_slots += 1
        self.completed += 1
        script = self.script
        self.finished_per_step[trajectory // script.group_size // script.step_prompts] += 1
        tokens = script.tokens[trajectory]
        start = self.starts[trajectory]
        version_times = self.version_times
        if version_times[-1] <= start:  # no version change since it started: one segment
            oldest, version_sum = self.version, float(tokens * self.version)
        else:
            oldest, version_sum = version_token_sum(version_times, start, self.now, tokens)
        self.oldest[trajectory] = oldest
        self.version_sums[trajectory] = version_sum
        self._report(trajectory, oldest_version=oldest, num_tokens=tokens, accepted=True)

    def _report(self, trajectory: int, *, oldest_version: int, num_tokens: int, accepted: bool) -> None:
        script = self.script
        prompt = trajectory // script.group_size
        self.state.add(
            PoolEntry(
                trajectory_id=f"t{trajectory}",
                sample_id=f"p{prompt}",
                source=self.targets.sources[script.sources[prompt]],
                ready_at=self.now + self.offset,
                oldest_version=oldest_version,
                rollout_step=prompt // script.step_prompts,
                num_tokens=num_tokens,
                accepted=accepted,
            )
        )

    def _advance_version(self) -> None:
        self.version += 1
        self.version_times.append(self.now)
        self.trained += 1

    def _decide(self) -> None:
        """Decide until the engine waits, or until the run has all its train batches."""
        if len(self.steps) >= self.config.train_batches:
            return
        state = self.state
        decisions = decisions_until_wait(state, self.now + self.offset, self.version)
        try:
            decision = next(decisions)
            while True:
                state.apply(decision)
                kind = type(decision)
                if kind is Wait:
                    assert isinstance(decision, Wait)
                    self.last_wait = decision
                    wake = decision.wake_at
                    if wake is not None and wake not in self.wakes:
                        self.wakes.add(wake)
                        self.queue.push(max(self.now, wake - self.offset), WAKE)
                    return
                if kind is Drop:
                    assert isinstance(decision, Drop)
                    if decision.reason is DropReason.STALE:
                        self.dropped_stale += len(decision.trajectory_ids)
                else:
                    assert isinstance(decision, Admit)
                    self._admit(decision, decision.admitted_at)
                    if len(self.steps) >= self.config.train_batches:
                        return
                # Colocated training, after the last mini-batch of a train batch, moves the clock and the version.
                decision = decisions.send((self.now + self.offset, self.version))
        except StarvationError as exc:
            self.failed = str(exc)

    def _admit(self, admit: Admit, wall: float) -> None:
        step = self.step
        script = self.script
        tokens_of, sources_of, group_size = script.tokens, script.sources, script.group_size
        oldest, version_sums, counts = self.oldest, self.version_sums, self.staleness_counts
        train_version = admit.train_version
        per_unit = self.config.trajectories_per_unit
        tokens = 0
        version_sum = 0.0
        last_prompt = -1
        for trajectory_id in admit.trajectory_ids:
            trajectory = int(trajectory_id[1:])
            tokens += tokens_of[trajectory]
            version_sum += version_sums[trajectory]
            staleness = train_version - oldest[trajectory]
            counts[staleness] += 1
            step.trajectory_staleness += staleness
            if staleness > step.max_staleness:
                step.max_staleness = staleness
            prompt = trajectory // group_size
            if per_unit == 1 or prompt != last_prompt:  # a group's ids come together: count the unit once
                step.composition[sources_of[prompt]] += 1
                last_prompt = prompt
        count = len(admit.trajectory_ids)
        step.trajectories += count
        step.tokens += tokens
        step.token_staleness += tokens * train_version - version_sum
        step.admit_times.append(wall)
        step.relaxed = step.relaxed or admit.relaxed
        config = self.config
        seconds = (
            config.train_seconds_per_minibatch
            if config.train_seconds_per_minibatch is not None
            else tokens * (config.train_seconds_per_token or 0.0)
        )
        step.train_seconds += seconds
        self.admitted += count
        if self.progress is not None:
            self.progress.update(self.admitted)
        if self.rules.shares_pool:
            if admit.completes_train_batch:
                self._train_colocated(admit)
        else:
            self.trainer_free_at = max(wall, self.trainer_free_at) + seconds
            if admit.completes_train_batch:
                self.trainer_free_at += config.sync_seconds
                self.queue.push(self.trainer_free_at, VERSION)
                self._finish_step(admit, self.trainer_free_at)

    def _train_colocated(self, admit: Admit) -> None:
        """The rollout phase ends: the whole train batch trains and syncs while rollout stands still."""
        self.offset += self.step.train_seconds + self.config.sync_seconds
        self._finish_step(admit, self.now + self.offset)
        self._advance_version()
        if self.rules.discards_unfinished and self.in_flight:
            self._discard_unfinished()

    def _discard_unfinished(self) -> None:
        """Throw away the trajectories still generating; their events are skipped when they come up."""
        unfinished = sorted(self.in_flight)
        self.in_flight.clear()
        self.discarded += len(unfinished)
        self.free_slots += len(unfinished)
        per_step = self.script.group_size * self.script.step_prompts
        for trajectory in unfinished:
            self.finished_per_step[trajectory // per_step] += 1
        if self.targets.admission_unit is AdmissionUnit.GROUP:
            # A group enters the pool once all its members are reported: report the discarded ones as
            # filtered, so that the group's finished members are admitted together (or the group dropped).
            for trajectory in unfinished:
                self._report(trajectory, oldest_version=self.version, num_tokens=0, accepted=False)

    def _finish_step(self, admit: Admit, trained_at: float) -> None:
        step = self.step
        targets = self.targets
        composition = dict(zip(targets.sources, step.composition, strict=True))
        self.steps.append(
            StepResult(
                index=admit.train_batch_index,
                train_version=admit.train_version,
                admit_times=tuple(step.admit_times),
                composition=composition,
                quotas=dict(zip(targets.sources, targets.quotas, strict=True)),
                trajectories=step.trajectories,
                tokens=step.tokens,
                token_staleness=step.token_staleness / max(step.tokens, 1),
                trajectory_staleness=step.trajectory_staleness / max(step.trajectories, 1),
                max_trajectory_staleness=step.max_staleness,
                trained_at=trained_at,
                relaxed=step.relaxed,
            )
        )
        self.step = _StepAccumulator(len(targets.sources))

    def _stall_message(self) -> str:
        wait = self.last_wait
        why = f"{wait.reason.value}: {wait.detail}" if wait is not None else "no admission possible"
        return (
            f"stalled after {len(self.steps)} train batches: nothing left to simulate while admission waits "
            f"({why})"
        )

    def _result(self) -> ModeResult:
        return ModeResult(
            mode=self.rules.mode,
            policy=self.policy,
            warmup=self.config.warmup,
            steps=tuple(self.steps),
            dropped_stale=self.dropped_stale,
            discarded=self.discarded,
            launched=len(self.starts),
            completed=self.completed,
            left_in_pool=self.state.pool_size,
            trajectory_staleness_counts=dict(sorted(self.staleness_counts.items())),
            simulated_seconds=self.now + self.offset,
            failed=self.failed,
        )


def simulate_mode(
    config: SimConfig,
    policy: AdmissionPolicy,
    mode: Mode,
    script: RolloutScript,
    *,
    progress: ProgressBar | None = None,
) -> ModeResult:
    """Simulate ``config.train_batches`` train batches of ``policy`` in ``mode``; deterministic."""
    return _Run(config, policy, mode, script, progress).run()


def simulate_policy(
    config: SimConfig,
    policy: AdmissionPolicy,
    script: RolloutScript,
    *,
    progress: dict[Mode, ProgressBar] | None = None,
) -> PolicySimulation:
    """Both modes of ``policy`` on the same rollout script."""
    results = {
        mode: simulate_mode(config, policy, mode, script, progress=(progress or {}).get(mode)) for mode in MODES
    }
    return PolicySimulation(
        policy=policy, disaggregated=results[Mode.DISAGGREGATED], colocated=results[Mode.COLOCATED]
    )
