"""TRL's GRPO policy loss on one KnitTrans packed micro-batch.

The micro-batch is THD-packed (:mod:`knittrans.reorg.packing`): one row of several trajectories, ``position_ids``
restarting at 0 for each, ``labels`` already the next token (-100 where there is none) and every per-target field
label-aligned, so the log-prob at packed position t is that of ``labels[t]`` and ``old_logprobs[t]``,
``loss_mask[t]`` describe the same token. Transformers builds a block-diagonal causal mask from the restarting
positions, so no trajectory attends to another.

The loss is TRL's (``GRPOTrainer._compute_loss``) for the token-level losses that normalise by the number of loss
tokens of the whole optimizer step, ``dapo`` (TRL's default) and ``cispo``: the sum of the per-token losses over
the micro-batch, which the caller divides by the mini-batch's ``global_loss_tokens``. Summed over micro-batches
and ranks that is TRL's loss over the same trajectories."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import torch

from knittrans.errors import InvalidArgument
from knittrans.integrations.trl.settings import ADVANTAGE_SCALAR, LOSS_MASK_FIELD, OLD_LOGPROBS_FIELD

LABEL_IGNORE_INDEX = -100


class LossType(StrEnum):
    DAPO = "dapo"
    CISPO = "cispo"


@dataclass(frozen=True, kw_only=True)
class PolicyLossSettings:
    """The ``GRPOConfig`` fields the loss reads."""

    loss_type: LossType
    epsilon_low: float
    epsilon_high: float
    delta: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.loss_type, LossType):
            try:
                object.__setattr__(self, "loss_type", LossType(self.loss_type))
            except ValueError:
                supported = ", ".join(t.value for t in LossType)
                raise InvalidArgument(
                    f"{self.loss_type!r} is not supported through KnitTrans (supported: {supported}): the others "
                    "normalise per micro-batch or per sequence, which KnitTrans's micro-batches do not reproduce",
                    field="loss_type") from None


@dataclass(frozen=True, kw_only=True)
class MicroBatchLoss:
    """One micro-batch's summed policy loss (not yet normalised) and what TRL logs of it."""

    loss_sum: torch.Tensor
    loss_tokens: int
    entropy_sum: float


def item_of_position(cu_seqlens: torch.Tensor, length: int) -> torch.Tensor:
    """For each packed position, the index of its item (trailing padding counts as the last item; its labels are
    ignored, so it never reaches the loss)."""
    bounds = cu_seqlens.to(torch.int64)
    sizes = bounds[1:] - bounds[:-1]
    items = torch.repeat_interleave(torch.arange(sizes.numel(), device=bounds.device), sizes)
    if items.numel() < length:
        items = torch.cat([items, items.new_full((length - items.numel(),), max(sizes.numel() - 1, 0))])
    return items


def packed_log_probs(model: Any, micro: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per packed position, the log-prob of ``labels[t]`` (0 where ignored) and the entropy, from TRL's fused LM
    head (it applies TRL's temperature)."""
    input_ids = micro["input_ids"].to(torch.int64)[None]
    outputs = model(input_ids=input_ids, position_ids=micro["position_ids"].to(torch.int64)[None],
                    shift_labels=micro["labels"].to(torch.int64)[None], fused_lm_head=True)
    entropy = outputs.entropy[0] if outputs.entropy is not None else None
    return outputs.log_probs[0], entropy


def micro_batch_loss(model: Any, micro: Any, settings: PolicyLossSettings) -> MicroBatchLoss:
    log_probs, entropy = packed_log_probs(model, micro)
    labels = micro["labels"].to(log_probs.device)
    mask = ((labels != LABEL_IGNORE_INDEX) & (micro[LOSS_MASK_FIELD].to(log_probs.device) != 0)).to(log_probs.dtype)
    items = item_of_position(micro["cu_seqlens"].to(log_probs.device), log_probs.shape[0])
    advantages = micro[f"scalar.{ADVANTAGE_SCALAR}"].to(device=log_probs.device, dtype=torch.float32)[items]
    if OLD_LOGPROBS_FIELD in micro:
        old_log_probs = micro[OLD_LOGPROBS_FIELD].to(device=log_probs.device, dtype=log_probs.dtype)
    else:  # TRL skips them when the policy has not moved since generation: the ratio is 1
        old_log_probs = log_probs.detach()
    ratio = torch.exp(log_probs - old_log_probs)
    if settings.loss_type is LossType.CISPO:
        per_token_loss = -torch.clamp(ratio, max=settings.epsilon_high).detach() * advantages * log_probs
    else:
        clipped = torch.clamp(ratio, 1 - settings.epsilon_low, 1 + settings.epsilon_high)
        if settings.delta is not None:
            ratio = torch.clamp(ratio, max=settings.delta)
        per_token_loss = -torch.min(ratio * advantages, clipped * advantages)
    entropy_sum = float((entropy.detach() * mask).sum()) if entropy is not None else 0.0
    return MicroBatchLoss(loss_sum=(per_token_loss * mask).sum(), loss_tokens=int(mask.sum()),
                          entropy_sum=entropy_sum)
