"""Training-side helpers; multimodal encoding reuse across a mini-batch (docs/encoder-dedup.md).

Needs torch (the ``train`` extra) for everything except :mod:`knittrans.train.schedule`, which is pure;
names are imported lazily so the schedule types stay usable without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BackboneMicroBatch": "knittrans.train.schedule",
    "EncoderMicroBatch": "knittrans.train.schedule",
    "EncodingRoute": "knittrans.train.schedule",
    "EncodingSchedule": "knittrans.train.schedule",
    "EncodingUse": "knittrans.train.schedule",
    "RankSchedule": "knittrans.train.schedule",
    "WireKind": "knittrans.train.schedule",
    "WireLayout": "knittrans.train.schedule",
    "schedule_from_ranks": "knittrans.train.schedule",
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
    "local_token_position": "knittrans.train.plan_adapter",
    "megatron_backbone_rank": "knittrans.train.plan_adapter",
    "schedule_from_plan": "knittrans.train.plan_adapter",
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
    module = _EXPORTS.get(name)
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
