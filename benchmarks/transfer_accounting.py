"""What counts in a step of :mod:`transfer_workload` (its docstring defines the terms): the bytes uniquely needed,
the simulated compute, one arm's measured steps and its JSON report."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from transfer_placement import MicroBatch, assign_dp, plan_micro_batches, zigzag_token_ranges
from transfer_workload import Workload, WorkloadConfig, WorkloadError


@dataclass(frozen=True, kw_only=True)
class NeededBytes:
    """What a step uniquely needs (see "Bytes uniquely needed" in :mod:`transfer_workload`)."""

    token_field_bytes: int  # look-ahead included
    look_ahead_bytes: int  # the part of token_field_bytes that is look-ahead
    image_bytes: int
    distinct_images: int

    @property
    def total(self) -> int:
        return self.token_field_bytes + self.image_bytes

    def to_dict(self) -> dict[str, int]:
        return {**dataclasses.asdict(self), "total": self.total}


def bytes_uniquely_needed(workload: Workload) -> NeededBytes:
    config = workload.config
    with_look_ahead = 0
    without = 0
    for length in workload.lengths:
        for cp_rank in range(config.cp):
            for spec in config.token_fields:
                plain = zigzag_token_ranges(length, config.cp, cp_rank, look_ahead=False)
                needed = zigzag_token_ranges(length, config.cp, cp_rank, look_ahead=spec.label_source)
                without += sum(end - start for start, end in plain) * spec.bytes_per_token
                with_look_ahead += sum(end - start for start, end in needed) * spec.bytes_per_token
    prompts = {workload.prompt_of(i) for i in range(workload.num_trajectories)}
    distinct_images = len(prompts) * config.images_per_prompt
    return NeededBytes(
        token_field_bytes=with_look_ahead,
        look_ahead_bytes=with_look_ahead - without,
        image_bytes=distinct_images * config.image_bytes,
        distinct_images=distinct_images,
    )


def compute_seconds(config: WorkloadConfig, micro_batch: MicroBatch) -> float:
    return config.seconds_per_token * micro_batch.tokens


def simulate_compute(config: WorkloadConfig, micro_batch: MicroBatch) -> float:
    """Sleep for the micro-batch's simulated compute; returns the seconds actually slept."""
    started = time.perf_counter()
    time.sleep(compute_seconds(config, micro_batch))
    return time.perf_counter() - started


@dataclass(frozen=True, kw_only=True)
class StepMeasurement:
    """One measured step of one arm. Per-DP-group tuples are indexed by DP rank."""

    step_s: float  # wall time from step start until the last DP group finished its last micro-batch
    data_wait_s: tuple[float, ...]  # per DP group: blocked waiting for data, summed over its micro-batches
    compute_s: tuple[float, ...]  # per DP group: seconds actually slept in simulated compute
    bytes_moved_from_storage: int
    redistribution_bytes: int = 0  # bytes copied rank-to-rank after reading (sample-level baselines)
    redistribution_s: tuple[float, ...] = ()  # per DP group: wall time of its redistribution

    def __post_init__(self) -> None:
        if len(self.data_wait_s) != len(self.compute_s):
            raise WorkloadError("needs one entry per DP group, like compute_s", field="data_wait_s")

    @property
    def exposed_transfer_s(self) -> float:
        return max(self.data_wait_s)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step_s": self.step_s,
            "exposed_transfer_s": self.exposed_transfer_s,
            "data_wait_s_per_dp_group": list(self.data_wait_s),
            "compute_s_per_dp_group": list(self.compute_s),
            "bytes_moved_from_storage": self.bytes_moved_from_storage,
            "redistribution_bytes": self.redistribution_bytes,
            "redistribution_s_per_dp_group": list(self.redistribution_s),
        }


def one_clock_exposed(*, start: float, ready: Sequence[float], compute_end: Sequence[float]) -> float:
    """A DP group's exposed transfer in one step, on the one clock both systems share.

    ``start`` is when the step's data could first be asked for: the later of the moment its last trajectory was
    written and reported (put into TransferQueue; stored and reported to the admission service) and the moment
    the group's training loop asked for it (it finished the previous step). ``ready[i]`` is when every rank of
    the group held micro-batch i (with eager delivery: micro-batch 0 means the whole mini-batch) and
    ``compute_end[i]`` when its compute ended. Everything the loop spends outside compute counts: the wait for
    micro-batch 0, and before every later micro-batch both the wait for data and the loop's own take/release
    work. All times are ``time.time()`` of one machine (one system-wide clock across processes).
    """
    if not ready or len(ready) != len(compute_end):
        raise WorkloadError("needs one compute end per ready micro-batch, and at least one", field="ready")
    exposed = max(0.0, ready[0] - start)
    for previous_end, now_ready in zip(compute_end[:-1], ready[1:], strict=True):
        exposed += max(0.0, now_ready - previous_end)
    return exposed


def arm_report(
    *,
    arm: str,
    workload: Workload,
    steps: Sequence[StepMeasurement],
    details: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON record of one arm; means are over the measured (post-warm-up) steps."""
    if not steps:
        raise WorkloadError("needs at least one measured step", field="steps")
    needed = bytes_uniquely_needed(workload)
    moved = [step.bytes_moved_from_storage for step in steps]
    redistributed = [step.redistribution_bytes for step in steps]
    requested_compute = max(
        sum(compute_seconds(workload.config, mb) for mb in rank_batches)
        for rank_batches in plan_micro_batches(workload, assign_dp(workload))
    )
    return {
        "arm": arm,
        "bytes_moved_from_storage": int(np.mean(moved)),
        "bytes_uniquely_needed": needed.total,
        "amplification": float(np.mean(moved)) / needed.total,
        "redistribution_bytes": int(np.mean(redistributed)),
        "amplification_with_redistribution": (float(np.mean(moved)) + float(np.mean(redistributed))) / needed.total,
        "redistribution_s_per_step": float(np.mean([max(step.redistribution_s, default=0.0) for step in steps])),
        "exposed_transfer_s_per_step": float(np.mean([step.exposed_transfer_s for step in steps])),
        "step_s": float(np.mean([step.step_s for step in steps])),
        "simulated_compute_s_per_step": requested_compute,
        "steps": [step.to_dict() for step in steps],
        **dict(details or {}),
    }


def describe(workload: Workload) -> dict[str, Any]:
    """A JSON summary of the workload, for the benchmark output."""
    lengths = np.asarray(workload.lengths)
    assignment = assign_dp(workload)
    micro_batches = plan_micro_batches(workload, assignment)
    return {
        "config": workload.config.to_dict(),
        "trajectories": workload.num_trajectories,
        "tokens_total": int(lengths.sum()),
        "tokens_mean": float(lengths.mean()),
        "tokens_max": int(lengths.max()),
        "tokens_min": int(lengths.min()),
        "token_field_bytes_stored": sum(workload.trajectory_token_bytes(i) for i in range(workload.num_trajectories)),
        "distinct_image_bytes": workload.config.num_prompts * workload.prompt_image_bytes(),
        "bytes_uniquely_needed": bytes_uniquely_needed(workload).to_dict(),
        "tokens_per_dp_group": [sum(workload.lengths[i] for i in group) for group in assignment.groups],
        "micro_batches_per_dp_group": len(micro_batches[0]),
    }
