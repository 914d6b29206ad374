"""The trainer side of the data plane (``knittrans.trainer``): :class:`TrainerClient` yields mini-batches of
packed micro-batches that a node-local reorg sidecar publishes in shared memory (DESIGN.md §6).

Not to be confused with :mod:`knittrans.train`, the training-side helpers that run inside a training step
(multimodal encoding reuse); this package delivers the data those steps consume.

Importing this package needs no torch; iterating micro-batches does (tensors are torch tensors).
"""

from typing import TYPE_CHECKING, Any

from knittrans.trainer.tensors import PackedEncodingUse, TensorSpec

if TYPE_CHECKING:
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
    from knittrans.trainer.progress import AdmissionProgressReporter, ProgressReporter

# Lazy: the client and the progress reporter import grpc, the descriptor imports protobuf, and the sidecar's
# pure packer shares this package's layout and tensor modules (importing a submodule runs this file first).
_LAZY = {
    "MicroBatchDescriptor": "knittrans.trainer.descriptor",
    "DeliveryMode": "knittrans.trainer.client",
    "MicroBatch": "knittrans.trainer.client",
    "MiniBatch": "knittrans.trainer.client",
    "MiniBatchContext": "knittrans.trainer.client",
    "TrainerClient": "knittrans.trainer.client",
    "TrainerSettings": "knittrans.trainer.client",
    "TrainerStats": "knittrans.trainer.client",
    "AdmissionProgressReporter": "knittrans.trainer.progress",
    "ProgressReporter": "knittrans.trainer.progress",
}
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


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'knittrans.trainer' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(_LAZY[name]), name)
