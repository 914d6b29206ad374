"""Trajectory metadata and service settings for admission-service tests (metadata only, no bytes)."""

from __future__ import annotations

import uuid

from knittrans.admission.engine import EngineConfig
from knittrans.admission.service.settings import AdmissionServiceSettings
from knittrans.serving.settings import AuthSettings, MetricsSettings, ServerSettings
from knittrans.types import (
    BackboneTopology,
    DType,
    EncoderTopology,
    MultimodalRef,
    TokenSpan,
    Topology,
    TrajectoryMeta,
    VersionSegment,
)
from tests.builders import token_unit

SOURCES = {"A": 0.25, "B": 0.25}
TOPOLOGY = Topology(
    backbone=BackboneTopology(dp=2, cp=2, max_tokens_per_microbatch=4096),
    encoders=(EncoderTopology(name="vision", dp=1, max_cost_per_microbatch=64),),
)


def make_meta(
    index: int, *, source: str = "A", sample: int | None = None, tokens: int = 100, version: int = 0,
    images: int = 0, step: int = 0, accepted: bool = True,
) -> TrajectoryMeta:
    trajectory_id = f"t{index}"
    sample_id = f"s{index if sample is None else sample}"
    multimodal = tuple(
        MultimodalRef(key=f"{sample_id}/img{k}", encoder="vision", cost=16.0,
                      placeholder=TokenSpan(start=2 + 8 * k, end=6 + 8 * k))
        for k in range(images)
    )
    return TrajectoryMeta(
        trajectory_id=trajectory_id, sample_id=sample_id, source=source, rollout_step=step, num_tokens=tokens,
        num_loss_tokens=tokens // 2, segments=(VersionSegment(version=version, num_tokens=tokens // 2),),
        units=(
            token_unit(trajectory_id, "input_ids", tokens),
            token_unit(trajectory_id, "loss_mask", tokens, DType.UINT8),
        ),
        multimodal=multimodal, accepted=accepted, finished_at=float(index),
    )


def service_settings(
    *, train_batch_size: int = 8, num_minibatches: int = 2, state: str = "memory", store: str = "",
    token: str = "", staleness_bound: int | None = None, topology: Topology = TOPOLOGY, job: str = "",
) -> AdmissionServiceSettings:
    return AdmissionServiceSettings(
        engine=EngineConfig(
            train_batch_size=train_batch_size, num_minibatches=num_minibatches, sources=SOURCES,
            staleness_bound=staleness_bound,
        ),
        topology=topology,
        job=job or f"test-{uuid.uuid4().hex[:8]}",  # a job is held by one service: each test its own
        state=state,
        store=store,
        server=ServerSettings(port=0, auth=AuthSettings(token=token), metrics=MetricsSettings(port=0)),
    )
