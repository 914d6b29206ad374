"""The trainer side of the data plane: :class:`TrainerClient` yields mini-batches of packed micro-batches that
a node-local reorg sidecar publishes in shared memory (DESIGN.md §6).

Importing this package needs no torch; iterating micro-batches does (tensors are torch tensors). Names are
loaded on first use, so the sidecar's pure packer can share the layout and descriptor modules without grpc.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "DeliveryMode": "knittrans.trainer.client",
    "MicroBatch": "knittrans.trainer.client",
    "MiniBatch": "knittrans.trainer.client",
    "MiniBatchContext": "knittrans.trainer.client",
    "TrainerClient": "knittrans.trainer.client",
    "TrainerSettings": "knittrans.trainer.client",
    "TrainerStats": "knittrans.trainer.client",
    "MicroBatchDescriptor": "knittrans.trainer.descriptor",
    "PackedEncodingUse": "knittrans.trainer.descriptor",
    "TensorSpec": "knittrans.trainer.descriptor",
    "AdmissionProgressReporter": "knittrans.trainer.progress",
    "ProgressReporter": "knittrans.trainer.progress",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'knittrans.trainer' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
