"""Training-side helpers (``knittrans.train``): multimodal encoding reuse across a mini-batch, run inside a
training step (docs/encoder-dedup.md).

Not to be confused with :mod:`knittrans.trainer`, the data plane's trainer client that delivers packed
mini-batches from the reorg sidecar; this package works on what a training step already holds.

This package exports the pure parts: the schedule types (:mod:`knittrans.train.schedule`) and the plan adapter,
which the trainer client uses without torch. The parts that run torch are imported from their modules, so that
importing them without the ``train`` extra fails at that import: :mod:`knittrans.train.reuse` (the training
step), :mod:`knittrans.train.transport` (how ranks exchange encodings), :mod:`knittrans.train.encoder_checks`.
"""

from knittrans.train.plan_adapter import local_token_position, megatron_backbone_rank, schedule_from_plan
from knittrans.train.schedule import (
    BackboneMicroBatch,
    EncoderMicroBatch,
    EncodingRoute,
    EncodingSchedule,
    EncodingUse,
    RankSchedule,
    WireKind,
    WireLayout,
    schedule_from_ranks,
)

__all__ = [
    "BackboneMicroBatch",
    "EncoderMicroBatch",
    "EncodingRoute",
    "EncodingSchedule",
    "EncodingUse",
    "RankSchedule",
    "WireKind",
    "WireLayout",
    "local_token_position",
    "megatron_backbone_rank",
    "schedule_from_plan",
    "schedule_from_ranks",
]
