"""The trainer side of the data plane: :class:`TrainerClient` yields mini-batches of packed micro-batches that
a node-local reorg sidecar publishes in shared memory (DESIGN.md §6).

Importing this package needs no torch; iterating micro-batches does (tensors are torch tensors).
"""

from knittrans.trainer.client import (
    DeliveryMode,
    MicroBatch,
    MiniBatch,
    MiniBatchContext,
    TrainerClient,
    TrainerSettings,
    TrainerStats,
)
from knittrans.trainer.descriptor import MicroBatchDescriptor, PackedEncodingUse, TensorSpec
from knittrans.trainer.progress import AdmissionProgressReporter, ProgressReporter

__all__ = [
    "AdmissionProgressReporter",
    "DeliveryMode",
    "MicroBatch",
    "MicroBatchDescriptor",
    "MiniBatch",
    "MiniBatchContext",
    "PackedEncodingUse",
    "ProgressReporter",
    "TensorSpec",
    "TrainerClient",
    "TrainerSettings",
    "TrainerStats",
]
