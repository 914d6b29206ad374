"""Training-side helpers (``knittrans.train``): multimodal encoding reuse across a mini-batch, run inside a
training step (docs/encoder-dedup.md).

Not to be confused with :mod:`knittrans.trainer`, the data plane's trainer client that delivers packed
mini-batches from the reorg sidecar; this package works on what a training step already holds.

Needs torch (the ``train`` extra) for everything except the schedule types (:mod:`knittrans.train.schedule`)
and the plan adapter, which are pure and imported plainly.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from knittrans.train.encoder_checks import check_encoder_supported, cross_sample_state_problems
    from knittrans.train.reuse import (
        BackboneStep,
        EncoderInputs,
        EncodingReuseReport,
        GatheredEncodings,
        MinibatchEncodingReuse,
        Phase,
        train_minibatch,
    )
    from knittrans.train.transport import LocalTransport, ProcessGroupTransport, Transport

# Lazy: these import torch, an optional dependency (the ``train`` extra); the schedule types above are used
# without it (the trainer client derives encoding schedules with them).
_TORCH_EXPORTS = {
    "check_encoder_supported": "knittrans.train.encoder_checks",
    "cross_sample_state_problems": "knittrans.train.encoder_checks",
    "BackboneStep": "knittrans.train.reuse",
    "EncoderInputs": "knittrans.train.reuse",
    "EncodingReuseReport": "knittrans.train.reuse",
    "GatheredEncodings": "knittrans.train.reuse",
    "MinibatchEncodingReuse": "knittrans.train.reuse",
    "Phase": "knittrans.train.reuse",
    "train_minibatch": "knittrans.train.reuse",
    "LocalTransport": "knittrans.train.transport",
    "ProcessGroupTransport": "knittrans.train.transport",
    "Transport": "knittrans.train.transport",
}

__all__ = [
    "BackboneMicroBatch",
    "BackboneStep",
    "EncoderInputs",
    "EncoderMicroBatch",
    "EncodingReuseReport",
    "EncodingRoute",
    "EncodingSchedule",
    "EncodingUse",
    "GatheredEncodings",
    "LocalTransport",
    "MinibatchEncodingReuse",
    "Phase",
    "ProcessGroupTransport",
    "RankSchedule",
    "Transport",
    "WireKind",
    "WireLayout",
    "check_encoder_supported",
    "cross_sample_state_problems",
    "local_token_position",
    "megatron_backbone_rank",
    "schedule_from_plan",
    "schedule_from_ranks",
    "train_minibatch",
]


def __getattr__(name: str) -> Any:
    module = _TORCH_EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'knittrans.train' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as exc:
        if exc.name == "torch":
            raise ModuleNotFoundError(
                f"knittrans.train.{name} needs torch: install the 'train' extra (pip install torch==2.13.0 first)",
                name="torch",
            ) from exc
        raise
    globals()[name] = value
    return value
