"""What a TRL job tells KnitTrans: the dataset column that names each prompt's source, the per-source quotas,
the staleness bound and ``max_batches_ahead``, and how that becomes the admission service's ``engine`` and
``schema`` config (pure: no TRL import, no I/O)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from knittrans.errors import InvalidArgument
from knittrans.store.keys import check_simple_name

# The fields every trajectory stores (docs/integrations/trl.md, "What travels"): TRL keeps its per-token RL
# quantities over the completion only, token-aligned (row j is completion token j itself), as verl does.
TOKENS_FIELD = "input_ids"
LOSS_MASK_FIELD = "loss_mask"
OLD_LOGPROBS_FIELD = "old_logprobs"
ADVANTAGE_SCALAR = "advantage"
SOURCE_METADATA = "data_source"
SOURCE_METADATA_MAX_BYTES = 128


@dataclass(frozen=True, kw_only=True)
class KnitTransGRPOSettings:
    """How :class:`~knittrans.integrations.trl.KnitTransGRPOTrainer` talks to KnitTrans.

    ``sources`` maps each data source (a value of the dataset's ``source_column``) to the minimum share of every
    train batch it must fill (the admission service's per-source quotas); a dataset without that column is one
    source, ``default_source``. ``staleness_bound`` (policy versions) and ``max_batches_ahead`` (train batches
    admitted ahead of the policy version) are the admission engine's. ``namespace`` prefixes the store keys and
    trajectory ids of this run: two runs sharing a store need different ones."""

    sources: Mapping[str, float] = field(default_factory=lambda: {"default": 1.0})
    source_column: str = "source"
    default_source: str = "default"
    staleness_bound: int | None = None
    max_batches_ahead: int | None = 1
    namespace: str = "trl"

    def __post_init__(self) -> None:
        if not isinstance(self.sources, Mapping) or not self.sources:
            raise InvalidArgument("must map at least one source to its minimum share", field="sources")
        for name, share in self.sources.items():
            check_simple_name(name, f"sources.{name}")
            if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
                raise InvalidArgument(f"must be a share in [0, 1], got {share!r}", field=f"sources.{name}")
        if sum(self.sources.values()) > 1 + 1e-9:
            raise InvalidArgument("the minimum shares add up to more than 1", field="sources")
        if not self.source_column:
            raise InvalidArgument("must name a dataset column", field="source_column")
        check_simple_name(self.default_source, "default_source")
        for name in ("staleness_bound", "max_batches_ahead"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise InvalidArgument(f"must be a non-negative integer or None, got {value!r}", field=name)
        check_simple_name(self.namespace, "namespace")


@dataclass(frozen=True, kw_only=True)
class TrainBatchShape:
    """TRL's batch sizes in KnitTrans's terms: a train batch is one TRL generation batch (over all trainer
    ranks), and each optimizer step one mini-batch of it. Counts are trajectories; ``group_size`` is TRL's
    ``num_generations``, and KnitTrans admits whole groups, so that the group-relative advantages TRL computed
    train together."""

    trajectories: int
    num_minibatches: int
    group_size: int

    def __post_init__(self) -> None:
        for name in ("trajectories", "num_minibatches", "group_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgument(f"must be a positive integer, got {value!r}", field=name)
        if self.trajectories % self.group_size:
            raise InvalidArgument(f"{self.trajectories} trajectories are not whole groups of {self.group_size}",
                                  field="trajectories")
        groups = self.trajectories // self.group_size
        if groups % self.num_minibatches:
            raise InvalidArgument(f"{groups} groups do not split into {self.num_minibatches} equal mini-batches",
                                  field="num_minibatches")

    @classmethod
    def of(cls, *, per_device_train_batch_size: int, gradient_accumulation_steps: int, steps_per_generation: int,
           num_generations: int, world_size: int) -> TrainBatchShape:
        """From a ``GRPOConfig``'s fields and the number of trainer ranks (data-parallel processes)."""
        if steps_per_generation % gradient_accumulation_steps:
            raise InvalidArgument(
                f"must be a multiple of gradient_accumulation_steps ({gradient_accumulation_steps}): each optimizer "
                "step trains one whole mini-batch", field="steps_per_generation")
        return cls(trajectories=per_device_train_batch_size * steps_per_generation * world_size,
                   num_minibatches=steps_per_generation // gradient_accumulation_steps, group_size=num_generations)

    @property
    def groups(self) -> int:
        return self.trajectories // self.group_size


def engine_config(settings: KnitTransGRPOSettings, shape: TrainBatchShape) -> dict[str, Any]:
    """The admission service's ``engine`` section for this job (counts in groups: the admission unit)."""
    return {
        "train_batch_size": shape.groups,
        "num_minibatches": shape.num_minibatches,
        "sources": dict(settings.sources),
        "admission_unit": "group",
        "group_size": shape.group_size,
        "staleness_bound": settings.staleness_bound,
        "max_batches_ahead": settings.max_batches_ahead,
    }


def trajectory_schema(*, old_logprobs: bool) -> dict[str, Any]:
    """The admission service's ``schema`` section: what every trajectory stores. ``old_logprobs``: TRL computes
    the old policy's log-probs (it does when a generation batch trains more than one optimizer step, or with
    ``num_iterations > 1``); otherwise the loss takes the current ones, detached, as TRL does."""
    token_fields: dict[str, Any] = {
        TOKENS_FIELD: {"dtype": "int64"},
        LOSS_MASK_FIELD: {"dtype": "uint8", "coverage": "response"},
    }
    if old_logprobs:
        token_fields[OLD_LOGPROBS_FIELD] = {"dtype": "float32", "coverage": "response"}
    return {
        "token_fields": token_fields,
        "scalars": {ADVANTAGE_SCALAR: {"kind": "float"}},
        "metadata": {SOURCE_METADATA: {"kind": "str", "max_bytes": SOURCE_METADATA_MAX_BYTES}},
    }
