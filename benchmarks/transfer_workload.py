"""The one RL-step workload and accounting that every arm of ``benchmarks/transfer.py`` uses.

Every arm (TransferQueue (a) and (b), KnitTrans eager and iter) must see the same trajectories, the same
DP assignment, the same micro-batches, the same simulated compute and the same definition of "bytes
uniquely needed" and "exposed transfer", so all of that lives here and nowhere else.

The module needs numpy and the SDK's :mod:`knittrans.plan.geometry` (the plan's zigzag arithmetic, numpy only):
it is imported both from the main venv and from the separate TransferQueue venv (``bench-out/tq-venv``, whose
arm ``benchmarks/transfer_tq.py`` starts with ``clients/python`` on ``PYTHONPATH``), and by the arms when they
run as scripts (``python benchmarks/...py``, which puts ``benchmarks/`` on ``sys.path``).

Definitions
-----------
- **Step**: one train batch, all ``num_prompts * rollouts_per_prompt`` trajectories, consumed by the
  ``dp * tp * cp`` ranks as equal numbers of micro-batches per DP group.
- **Bytes uniquely needed**: for every consumer (DP rank, CP rank) — TP replicas collapse into one —
  the union of the token ranges it needs of every per-token field, counted once; label fields carry one
  token of look-ahead at each zigzag chunk end (so a look-ahead token needed by two CP consumers counts for
  each). Plus every distinct image of the step, once. Padding is not stored data and never counts.
- **Exposed transfer seconds** of a step: the longest time any DP group's ranks sat blocked waiting for
  data (summed over its micro-batches), i.e. waiting not hidden behind compute. A DP group computes in
  lockstep (TP/CP collectives), so a group's wait before a micro-batch is that of its slowest rank.
- **Reader concurrency** (``reader_concurrency``, default 8 = dp*cp): how many storage reads may be in flight
  at once over all readers of a step, each reader having one outstanding read. The TransferQueue arms run
  that many reader processes (each its own client) for the 16 ranks' reads; KnitTrans iter must use the same
  number of concurrent outstanding reads (8 = one per (DP, CP) sidecar).
- **Simulated compute** of a micro-batch: ``sleep(seconds_per_token * tokens)``, where ``tokens`` are the
  real tokens of the micro-batch (all its sequences, before the CP split); every rank of the DP group sleeps
  the same time. Sleeping leaves the CPU to the data path and makes overlap measurable.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from knittrans.plan.geometry import cp_read_spans, padded_lengths, zigzag_spans

# Vocabulary size of the token ids (Qwen-sized); only the value range of the generated ids depends on it.
VOCAB_SIZE = 151_936

# Stream ids of the seed sequences, so trajectory content, image content and lengths never share a stream.
_LENGTH_STREAM = 0
_TRAJECTORY_STREAM = 1
_IMAGE_STREAM = 2


class WorkloadError(ValueError):
    """An invalid workload parameter; ``field`` names it."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def _require_positive(value: int | float, field: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise WorkloadError(f"must be positive, got {value!r}", field=field)


def _require_positive_int(value: int, field: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise WorkloadError(f"must be a positive integer, got {value!r}", field=field)


# --------------------------------------------------------------------------------------------- shapes


@dataclass(frozen=True, kw_only=True)
class TokenFieldSpec:
    """A per-token field: an array of shape ``[L, *per_token_shape]``."""

    name: str
    dtype: str
    per_token_shape: tuple[int, ...]
    label_source: bool  # next-token labels come from it, so CP reads need one token of look-ahead

    def __post_init__(self) -> None:
        if not self.name:
            raise WorkloadError("must be non-empty", field="name")
        try:
            np.dtype(self.dtype)
        except TypeError:
            raise WorkloadError(f"unknown dtype {self.dtype!r}", field="dtype") from None
        for size in self.per_token_shape:
            _require_positive_int(size, "per_token_shape")

    @property
    def bytes_per_token(self) -> int:
        return np.dtype(self.dtype).itemsize * math.prod(self.per_token_shape)

    def shape(self, length: int) -> tuple[int, ...]:
        return (length, *self.per_token_shape)


@dataclass(frozen=True, kw_only=True, order=True)
class RankCoord:
    """A training rank. Global rank order is Megatron's: TP fastest, then CP, then DP."""

    dp: int
    cp: int
    tp: int

    @property
    def reads_non_sequence_data(self) -> bool:
        """The TP-rank-0/CP-rank-0 rank, the one sample-level baselines let read multimodal data."""
        return self.tp == 0 and self.cp == 0


@dataclass(frozen=True, kw_only=True)
class Topology:
    dp: int
    tp: int
    cp: int

    def __post_init__(self) -> None:
        _require_positive_int(self.dp, "dp")
        _require_positive_int(self.tp, "tp")
        _require_positive_int(self.cp, "cp")

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.cp

    def ranks(self) -> tuple[RankCoord, ...]:
        return tuple(
            RankCoord(dp=d, cp=c, tp=t) for d in range(self.dp) for c in range(self.cp) for t in range(self.tp)
        )

    def ranks_of_dp_group(self, dp_rank: int) -> tuple[RankCoord, ...]:
        return tuple(rank for rank in self.ranks() if rank.dp == dp_rank)

    def global_rank(self, rank: RankCoord) -> int:
        return (rank.dp * self.cp + rank.cp) * self.tp + rank.tp


# --------------------------------------------------------------------------------------------- config


@dataclass(frozen=True, kw_only=True)
class WorkloadConfig:
    """All knobs of the workload. Defaults are the issue's full-size step; :data:`SMOKE` is a fast one."""

    num_prompts: int = 16
    rollouts_per_prompt: int = 16
    mean_tokens: int = 8192
    max_tokens: int = 32768
    min_tokens: int = 256
    length_sigma: float = 1.0  # sigma of the underlying normal of the lognormal length distribution
    routing_width: int = 64
    images_per_prompt: int = 4
    image_height: int = 448
    image_width: int = 448
    image_channels: int = 3
    dp: int = 4
    tp: int = 2
    cp: int = 2
    max_tokens_per_micro_batch: int = 32768  # per DP group (its CP group together), before the CP split
    seconds_per_token: float = 5e-6
    reader_concurrency: int = 8  # storage reads in flight at once, over all readers of the step (see above)
    seed: int = 0

    def __post_init__(self) -> None:
        for name in (
            "num_prompts",
            "rollouts_per_prompt",
            "mean_tokens",
            "max_tokens",
            "min_tokens",
            "routing_width",
            "image_height",
            "image_width",
            "image_channels",
            "max_tokens_per_micro_batch",
            "reader_concurrency",
        ):
            _require_positive_int(getattr(self, name), name)
        if isinstance(self.images_per_prompt, bool) or not isinstance(self.images_per_prompt, int):
            raise WorkloadError("must be an integer", field="images_per_prompt")
        if self.images_per_prompt < 0:
            raise WorkloadError("must be non-negative", field="images_per_prompt")
        _require_positive(self.length_sigma, "length_sigma")
        if isinstance(self.seconds_per_token, bool) or not self.seconds_per_token >= 0:
            raise WorkloadError("must be non-negative", field="seconds_per_token")
        if not self.min_tokens <= self.mean_tokens <= self.max_tokens:
            raise WorkloadError("needs min_tokens <= mean_tokens <= max_tokens", field="mean_tokens")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise WorkloadError("must be a non-negative integer", field="seed")
        topology = self.topology  # validates dp, tp, cp
        if self.num_trajectories < topology.dp:
            raise WorkloadError(f"fewer trajectories than dp={topology.dp}", field="num_prompts")

    @property
    def topology(self) -> Topology:
        return Topology(dp=self.dp, tp=self.tp, cp=self.cp)

    @property
    def num_trajectories(self) -> int:
        return self.num_prompts * self.rollouts_per_prompt

    @property
    def token_fields(self) -> tuple[TokenFieldSpec, ...]:
        return (
            TokenFieldSpec(name="input_ids", dtype="int32", per_token_shape=(), label_source=True),
            TokenFieldSpec(name="routing", dtype="uint8", per_token_shape=(self.routing_width,), label_source=False),
        )

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (self.image_height, self.image_width, self.image_channels)

    @property
    def image_bytes(self) -> int:
        return math.prod(self.image_shape)

    @property
    def pad_multiple(self) -> int:
        return 2 * self.cp

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WorkloadConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise WorkloadError(f"unknown keys {unknown}", field="workload")
        return cls(**dict(data))


SMOKE = WorkloadConfig(
    num_prompts=4,
    rollouts_per_prompt=4,
    mean_tokens=1024,
    max_tokens=4096,
    min_tokens=64,
    image_height=64,
    image_width=64,
    max_tokens_per_micro_batch=4096,
    seconds_per_token=1e-5,
)

_FLAG_TYPES: dict[str, type] = {
    f.name: type(getattr(WorkloadConfig(), f.name)) for f in dataclasses.fields(WorkloadConfig)
}


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--smoke`` and one ``--<knob>`` flag per :class:`WorkloadConfig` field (dashes for underscores)."""
    group = parser.add_argument_group("workload")
    group.add_argument("--smoke", action="store_true", help="start from the small smoke workload instead of full size")
    for name, kind in _FLAG_TYPES.items():
        group.add_argument(
            f"--{name.replace('_', '-')}",
            dest=f"workload_{name}",
            type=kind,
            default=None,
            help=f"(full size: {getattr(WorkloadConfig(), name)}; smoke: {getattr(SMOKE, name)})",
        )


def config_from_arguments(arguments: argparse.Namespace) -> WorkloadConfig:
    base = SMOKE if arguments.smoke else WorkloadConfig()
    overrides = {
        name: getattr(arguments, f"workload_{name}")
        for name in _FLAG_TYPES
        if getattr(arguments, f"workload_{name}") is not None
    }
    return dataclasses.replace(base, **overrides)


# --------------------------------------------------------------------------------------------- workload


@dataclass(frozen=True, kw_only=True)
class Workload:
    """The deterministic step: trajectory ``i`` belongs to prompt ``i // rollouts_per_prompt``."""

    config: WorkloadConfig
    lengths: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.lengths) != self.config.num_trajectories:
            raise WorkloadError(f"expected {self.config.num_trajectories} lengths", field="lengths")

    @property
    def num_trajectories(self) -> int:
        return len(self.lengths)

    def prompt_of(self, trajectory: int) -> int:
        return trajectory // self.config.rollouts_per_prompt

    def trajectories_of_prompt(self, prompt: int) -> range:
        first = prompt * self.config.rollouts_per_prompt
        return range(first, first + self.config.rollouts_per_prompt)

    def trajectory_token_bytes(self, trajectory: int) -> int:
        """Bytes of all per-token fields of one trajectory, as stored."""
        return self.lengths[trajectory] * sum(spec.bytes_per_token for spec in self.config.token_fields)

    def prompt_image_bytes(self) -> int:
        return self.config.images_per_prompt * self.config.image_bytes


def sample_lengths(config: WorkloadConfig) -> tuple[int, ...]:
    """Lognormal lengths (shape ``length_sigma``), scaled so that after rounding and clipping to
    ``[min_tokens, max_tokens]`` the sample mean is ``mean_tokens`` (to within a token)."""
    rng = np.random.default_rng(np.random.SeedSequence([config.seed, _LENGTH_STREAM]))
    shape = rng.lognormal(mean=0.0, sigma=config.length_sigma, size=config.num_trajectories)

    def scaled(scale: float) -> np.ndarray:
        return np.clip(np.rint(shape * scale), config.min_tokens, config.max_tokens)

    low, high = 0.0, float(config.max_tokens) / float(shape.min())
    for _ in range(200):  # the clipped mean is monotone in the scale: bisect
        middle = (low + high) / 2
        if scaled(middle).mean() < config.mean_tokens:
            low = middle
        else:
            high = middle
    return tuple(int(length) for length in scaled(high))


def build_workload(config: WorkloadConfig) -> Workload:
    return Workload(config=config, lengths=sample_lengths(config))


def trajectory_fields(workload: Workload, trajectory: int) -> dict[str, np.ndarray]:
    """The per-token fields of one trajectory; any arm regenerates the same bytes from the seed."""
    config = workload.config
    length = workload.lengths[trajectory]
    rng = np.random.default_rng(np.random.SeedSequence([config.seed, _TRAJECTORY_STREAM, trajectory]))
    fields: dict[str, np.ndarray] = {}
    for spec in config.token_fields:
        high = VOCAB_SIZE if spec.name == "input_ids" else np.iinfo(np.dtype(spec.dtype)).max + 1
        fields[spec.name] = rng.integers(0, high, size=spec.shape(length), dtype=np.dtype(spec.dtype))
    return fields


def prompt_images(workload: Workload, prompt: int) -> np.ndarray:
    """All images of one prompt, uint8 ``[images_per_prompt, H, W, C]``; shared by the prompt's rollouts."""
    config = workload.config
    rng = np.random.default_rng(np.random.SeedSequence([config.seed, _IMAGE_STREAM, prompt]))
    return rng.integers(0, 256, size=(config.images_per_prompt, *config.image_shape), dtype=np.uint8)


def fingerprint(array: np.ndarray) -> int:
    """CRC-32 of an array's bytes, for cheap end-to-end integrity checks."""
    return zlib.crc32(memoryview(np.ascontiguousarray(array)).cast("B"))


# --------------------------------------------------------------------------------------------- placement


@dataclass(frozen=True, kw_only=True)
class DpAssignment:
    """Trajectory indices per DP rank (equal counts, or counts differing by one)."""

    groups: tuple[tuple[int, ...], ...]

    def dp_rank_of(self, trajectory: int) -> int:
        for dp_rank, group in enumerate(self.groups):
            if trajectory in group:
                return dp_rank
        raise WorkloadError(f"trajectory {trajectory} is not assigned", field="trajectory")


def assign_dp(workload: Workload) -> DpAssignment:
    """Equal-count longest-processing-time balancing on length (compute is linear in tokens here).

    Longest first, each to the least-loaded DP rank that still has room; ties go to the lower rank, so the
    assignment is deterministic. Prompts are ignored, as sequence-length balancers in verl and slime do.
    """
    dp = workload.config.dp
    count = workload.num_trajectories
    capacity = [count // dp + (1 if rank < count % dp else 0) for rank in range(dp)]
    loads = [0] * dp
    groups: list[list[int]] = [[] for _ in range(dp)]
    for trajectory in sorted(range(count), key=lambda i: (-workload.lengths[i], i)):
        open_ranks = [rank for rank in range(dp) if len(groups[rank]) < capacity[rank]]
        rank = min(open_ranks, key=lambda r: (loads[r], r))
        groups[rank].append(trajectory)
        loads[rank] += workload.lengths[trajectory]
    return DpAssignment(groups=tuple(tuple(sorted(group)) for group in groups))


@dataclass(frozen=True, kw_only=True)
class MicroBatch:
    dp_rank: int
    index: int  # consumption order within the DP rank
    trajectories: tuple[int, ...]
    tokens: int


def plan_micro_batches(workload: Workload, assignment: DpAssignment) -> tuple[tuple[MicroBatch, ...], ...]:
    """Micro-batches per DP rank, in consumption order, with equal counts on every DP rank.

    First-fit-decreasing under ``max_tokens_per_micro_batch`` (an oversize sequence is a micro-batch of its
    own); then the heaviest splittable micro-batches are split in two until every DP rank has as many as the
    one with the most, because synchronous gradient accumulation hangs on unequal counts.
    """
    budget = workload.config.max_tokens_per_micro_batch
    bins_per_rank: list[list[list[int]]] = []
    for group in assignment.groups:
        bins: list[list[int]] = []
        loads: list[int] = []
        for trajectory in sorted(group, key=lambda i: (-workload.lengths[i], i)):
            length = workload.lengths[trajectory]
            for position, load in enumerate(loads):
                if load + length <= budget:
                    bins[position].append(trajectory)
                    loads[position] += length
                    break
            else:
                bins.append([trajectory])
                loads.append(length)
        bins_per_rank.append(bins)

    target = max(len(bins) for bins in bins_per_rank)
    for dp_rank, bins in enumerate(bins_per_rank):
        while len(bins) < target:
            splittable = [b for b in bins if len(b) > 1]
            if not splittable:
                raise WorkloadError(
                    f"DP rank {dp_rank} cannot reach {target} micro-batches; lower dp or raise the budget",
                    field="max_tokens_per_micro_batch",
                )
            heaviest = max(splittable, key=lambda b: (sum(workload.lengths[i] for i in b), -bins.index(b)))
            first, second = _halve(heaviest, workload.lengths)
            position = bins.index(heaviest)
            bins[position : position + 1] = [first, second]

    return tuple(
        tuple(
            MicroBatch(
                dp_rank=dp_rank,
                index=index,
                trajectories=tuple(members),
                tokens=sum(workload.lengths[i] for i in members),
            )
            for index, members in enumerate(bins)
        )
        for dp_rank, bins in enumerate(bins_per_rank)
    )


def _halve(members: list[int], lengths: Sequence[int]) -> tuple[list[int], list[int]]:
    first: list[int] = []
    second: list[int] = []
    for trajectory in sorted(members, key=lambda i: (-lengths[i], i)):
        target = first if sum(lengths[i] for i in first) <= sum(lengths[i] for i in second) else second
        target.append(trajectory)
    return first, second


# --------------------------------------------------------------------------------------------- CP split


def zigzag_token_ranges(length: int, cp: int, cp_rank: int, *, look_ahead: bool) -> tuple[tuple[int, int], ...]:
    """Half-open token ranges ``[start, end)`` of a sequence that CP rank ``cp_rank`` needs.

    The sequence is padded to a multiple of ``2*cp`` and cut into ``2*cp`` equal chunks; rank ``r`` gets
    chunks ``r`` and ``2*cp-1-r``. With ``look_ahead`` (label fields), each chunk also needs the token after
    its end, when that token exists. Ranges are clipped to the real tokens and adjacent ones merged.
    """
    if length < 0:
        raise WorkloadError("must be non-negative", field="length")
    _require_positive_int(cp, "cp")
    if not 0 <= cp_rank < cp:
        raise WorkloadError(f"must be in [0, {cp})", field="cp_rank")
    padded = padded_lengths(np.array([length]), 2 * cp)
    spans = zigzag_spans(np.array([length]), padded, cp)[0, cp_rank].tolist()
    return tuple(cp_read_spans(spans, length, look_ahead))


# --------------------------------------------------------------------------------------------- accounting


@dataclass(frozen=True, kw_only=True)
class NeededBytes:
    """What a step uniquely needs (see the module docstring)."""

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
