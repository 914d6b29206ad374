"""The trainer side of the data plane (``knittrans.trainer``): :class:`TrainerClient` yields mini-batches of
packed micro-batches that a node-local reorg sidecar publishes in shared memory (DESIGN.md §6).

Not to be confused with :mod:`knittrans.train`, the training-side helpers that run inside a training step
(multimodal encoding reuse); this package delivers the data those steps consume.

Importing this package needs no torch; iterating micro-batches does (tensors are torch tensors). The packed
layout it reads is :mod:`knittrans.packed`, shared with the sidecar's packer.
"""

from knittrans.packed.tensors import PackedEncodingUse, TensorSpec
from knittrans.steps import BEFORE_FIRST_STEP, RestorePoint, StepId
from knittrans.trainer.client import (
    DeliveryMode,
    MicroBatch,
    MiniBatch,
    MiniBatchContext,
    TrainerClient,
    TrainerSettings,
    TrainerStats,
)
from knittrans.trainer.descriptor import MicroBatchDescriptor
from knittrans.trainer.metadata import NonTensorBatch
from knittrans.trainer.progress import AdmissionProgressReporter, ProgressReporter

__all__ = [
    "BEFORE_FIRST_STEP",
    "AdmissionProgressReporter",
    "DeliveryMode",
    "MicroBatch",
    "MicroBatchDescriptor",
    "MiniBatch",
    "MiniBatchContext",
    "NonTensorBatch",
    "PackedEncodingUse",
    "ProgressReporter",
    "RestorePoint",
    "StepId",
    "TensorSpec",
    "TrainerClient",
    "TrainerSettings",
    "TrainerStats",
]
