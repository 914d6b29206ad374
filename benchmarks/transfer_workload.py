"""The one RL-step workload (and, beside it, its placement and accounting) that every arm of
``benchmarks/transfer.py`` uses.

Every arm (TransferQueue (a) and (b), KnitTrans eager and iter) must see the same trajectories, the same
DP assignment, the same micro-batches, the same simulated compute and the same definition of "bytes
uniquely needed" and "exposed transfer", so all of that lives here and nowhere else: the step's content in this
module, who consumes what in :mod:`transfer_placement`, and what counts in :mod:`transfer_accounting`.

The three modules need numpy and, for the CP split, the SDK's :mod:`knittrans.plan.geometry` (the plan's zigzag
arithmetic, numpy only): they are imported both from the main venv and from the separate TransferQueue venv
(``bench-out/tq-venv``, whose arm ``benchmarks/transfer_tq.py`` starts with ``clients/python`` on
``PYTHONPATH``), and by the arms when they run as scripts (``python benchmarks/...py``, which puts
``benchmarks/`` on ``sys.path``).

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
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

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


def require_positive_int(value: int, field: str) -> None:
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
            require_positive_int(size, "per_token_shape")

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
        require_positive_int(self.dp, "dp")
        require_positive_int(self.tp, "tp")
        require_positive_int(self.cp, "cp")

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
            require_positive_int(getattr(self, name), name)
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
