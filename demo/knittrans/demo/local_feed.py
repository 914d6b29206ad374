"""Mini-batches built in one process, without sidecars: what the reorg sidecar and ``TrainerClient`` deliver,
made from a unit store and a plan with the same pure packer (:mod:`knittrans.reorg.packing`).

Used by the demo's tests and handy for debugging a training step: store generated trajectories with
:func:`store_samples`, plan a mini-batch with the planner, then take one rank's packed micro-batches with
:func:`packed_micro_batches` and the images with :func:`plan_images`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from knittrans.demo.rollout_worker import submit_trajectory
from knittrans.demo.workload import GeneratedSample, WorkloadSpec
from knittrans.errors import FailedPrecondition
from knittrans.packed.dtypes import numpy_dtype
from knittrans.plan import Plan
from knittrans.reorg.packing import PackSettings, backbone_layout, pack_backbone, tensor_view
from knittrans.rollout import RolloutClient
from knittrans.store.protocol import UnitStore
from knittrans.types import BACKBONE_ROLE, ConsumerId, TrajectoryMeta, UnitKey


def store_samples(
    store: UnitStore,
    samples: Sequence[GeneratedSample],
    *,
    workload: WorkloadSpec,
    version: int = 0,
    namespace: str = "demo",
) -> list[TrajectoryMeta]:
    """Write every trajectory of the samples; their metadata in sample order (nothing is reported)."""
    rollout = RolloutClient(store, namespace=namespace)
    return [
        submit_trajectory(rollout, sample, trajectory, version=version, workload=workload, finished_at=0.0)
        for sample in samples
        for trajectory in sample.trajectories
    ]


def _read(store: UnitStore, key: UnitKey, length: int, ranges) -> np.ndarray:
    buffer = np.zeros(length, dtype=np.uint8)
    written = store.get_into(key, buffer, ranges)
    if written != length:
        raise FailedPrecondition(f"read {written} bytes of {key}, expected {length}", field="key")
    return buffer


def packed_micro_batches(
    plan: Plan,
    store: UnitStore,
    *,
    dp_rank: int,
    cp_rank: int,
    settings: PackSettings | None = None,
) -> list[dict[str, torch.Tensor]]:
    """Backbone consumer (dp_rank, cp_rank)'s micro-batches of ``plan``, packed as the reorg sidecar packs them."""
    settings = settings or PackSettings()
    cp = plan.topology.backbone.cp
    assignment = plan.for_consumer(ConsumerId(role=BACKBONE_ROLE, dp_rank=dp_rank, cp_rank=cp_rank))
    micro_batches = []
    for mb in assignment.microbatches:
        layout = backbone_layout(mb, cp=cp, settings=settings)
        reads = [_read(store, p.key, p.byte_length, p.ranges) for p in layout.reads]
        layout, slot = pack_backbone(mb, reads, cp=cp, settings=settings)
        micro_batches.append({spec.name: torch.from_numpy(tensor_view(slot, spec).copy()) for spec in layout.tensors})
    return micro_batches


def plan_images(plan: Plan, store: UnitStore, *, encoder: str = "vision") -> dict[UnitKey, torch.Tensor]:
    """Every unique image of the plan's mini-batch for ``encoder``, as stored (uint8 tensors by key)."""
    images: dict[UnitKey, torch.Tensor] = {}
    for encoding_id in range(len(plan.encodings)):
        encoding = plan.encoding(encoding_id)
        if encoding.encoder != encoder:
            continue
        header = encoding.header
        if header is None:
            raise FailedPrecondition(f"encoding {encoding.key} has no stored header", field="header")
        raw = _read(store, encoding.key, header.byte_length, None)
        images[encoding.key] = torch.from_numpy(raw.view(numpy_dtype(header.dtype)).reshape(header.shape).copy())
    return images
