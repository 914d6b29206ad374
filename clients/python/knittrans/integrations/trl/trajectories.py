"""One TRL generation batch as KnitTrans trajectories: TRL's padded tensors cut back to each trajectory's own
tokens (prompt without its left padding, completion without its right padding), with the completion's mask and
old log-probs as response-only, token-aligned fields and the advantage as a scalar."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from knittrans.errors import InvalidArgument
from knittrans.integrations.trl.settings import (
    ADVANTAGE_SCALAR,
    LOSS_MASK_FIELD,
    OLD_LOGPROBS_FIELD,
    SOURCE_METADATA,
    TOKENS_FIELD,
)
from knittrans.rollout import Trajectory
from knittrans.types import FieldAlignment, VersionSegment


@dataclass(frozen=True, kw_only=True)
class GenerationBatchIds:
    """Names one process's share of one generation batch. Rows are TRL's: a prompt's ``num_generations``
    completions are consecutive over the whole batch, and process p holds rows ``[p * rows, (p + 1) * rows)``, so
    a group split across processes keeps one sample id."""

    namespace: str
    # Names this start of the job's processes apart from earlier ones: a rollout process started again counts its
    # generation batches from 0 again, and the names its first start submitted are taken for good.
    start: str
    generation: int  # the how-manieth generation batch of this start
    process_index: int
    group_size: int

    def __post_init__(self) -> None:
        if not self.start.isalnum():
            raise InvalidArgument(f"must be letters and digits, not {self.start!r}", field="start")

    def row(self, index: int, rows: int) -> int:
        return self.process_index * rows + index

    def trajectory_id(self, index: int, rows: int) -> str:
        return f"{self.namespace}-{self.start}-g{self.generation}-t{self.row(index, rows)}"

    def sample_id(self, index: int, rows: int) -> str:
        return f"{self.namespace}-{self.start}-g{self.generation}-s{self.row(index, rows) // self.group_size}"


def _rows(tensor: Any, name: str) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor) or tensor.dim() != 2:
        raise InvalidArgument("must be a 2-D tensor (TRL's padded batch)", field=name)
    return tensor.detach().cpu()


def generation_trajectories(output: Mapping[str, Any], *, sources: Sequence[str], ids: GenerationBatchIds,
                            policy_version: int) -> list[Trajectory]:
    """The trajectories of ``output``, what ``GRPOTrainer._generate_and_score_completions`` returned for this
    process (``sources``: each row's data source)."""
    prompt_ids, prompt_mask = _rows(output["prompt_ids"], "prompt_ids"), _rows(output["prompt_mask"], "prompt_mask")
    completion_ids = _rows(output["completion_ids"], "completion_ids")
    completion_mask = _rows(output["completion_mask"], "completion_mask")
    advantages = output["advantages"].detach().cpu()
    if advantages.dim() != 1:
        raise InvalidArgument("must hold one advantage per completion", field="advantages")
    old = output.get("old_per_token_logps")
    old_logprobs = None if old is None else _rows(old, "old_per_token_logps").to(torch.float32)
    rows = prompt_ids.shape[0]
    if len(sources) != rows:
        raise InvalidArgument(f"has {len(sources)} entries for {rows} completions", field="sources")
    trajectories = []
    for i in range(rows):
        prompt = prompt_ids[i][prompt_mask[i].bool()]
        length = int(completion_mask[i].sum())
        if length < 1 or not bool(completion_mask[i, :length].all()):
            raise InvalidArgument(f"row {i} is not one run of completion tokens from the start",
                                  field="completion_mask")
        tokens = torch.cat([prompt, completion_ids[i, :length]]).to(torch.int64)
        fields: dict[str, Any] = {
            TOKENS_FIELD: tokens.numpy(),
            LOSS_MASK_FIELD: np.ones(length, np.uint8),
        }
        alignment = {LOSS_MASK_FIELD: FieldAlignment.TOKEN}
        if old_logprobs is not None:
            fields[OLD_LOGPROBS_FIELD] = old_logprobs[i, :length].numpy()
            alignment[OLD_LOGPROBS_FIELD] = FieldAlignment.TOKEN
        trajectories.append(Trajectory(
            trajectory_id=ids.trajectory_id(i, rows),
            sample_id=ids.sample_id(i, rows),
            source=sources[i],
            rollout_step=policy_version,
            segments=(VersionSegment(version=policy_version, num_tokens=length),),
            fields=fields,
            # float32 -> float64 -> float32 is exact: the trainer gets TRL's advantage bit for bit.
            scalars={ADVANTAGE_SCALAR: float(advantages[i])},
            metadata={SOURCE_METADATA: sources[i]},
            field_alignment=alignment,
            response_start=int(prompt.shape[0]),
            response_fields=tuple(alignment),
        ))
    return trajectories
