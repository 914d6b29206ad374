"""Builders and hypothesis strategies for planner tests: trajectories with fields and images, topologies."""

from __future__ import annotations

from hypothesis import strategies as st

from knittrans.types import (
    BackboneTopology,
    CostModel,
    DType,
    EncoderTopology,
    MultimodalRef,
    TokenSpan,
    Topology,
    TrajectoryMeta,
    UnitHeader,
    UnitKind,
    UnitRef,
    VersionSegment,
)
from tests.builders import digest, token_unit


def scalar_unit(trajectory_id: str, field: str) -> UnitRef:
    return UnitRef(
        key=f"{trajectory_id}/{field}",
        field_name=field,
        kind=UnitKind.FIELD,
        header=UnitHeader(dtype=DType.FLOAT32, shape=(2,), byte_length=8, content_hash=digest(field)),
    )


def image(key: str, start: int, rows: int, *, cost: float | None = None, encoder: str = "vision") -> MultimodalRef:
    return MultimodalRef(
        key=key,
        encoder=encoder,
        cost=float(rows * rows) if cost is None else cost,
        placeholder=TokenSpan(start=start, end=start + rows),
        header=UnitHeader(dtype=DType.UINT8, shape=(rows, 4, 3), byte_length=rows * 12, content_hash=digest(key)),
    )


def trajectory(
    trajectory_id: str,
    tokens: int,
    *,
    sample: str | None = None,
    loss_tokens: int | None = None,
    fields: bool = True,
    multimodal: tuple[MultimodalRef, ...] = (),
) -> TrajectoryMeta:
    units = ()
    if fields:
        units = (
            token_unit(trajectory_id, "input_ids", tokens),
            token_unit(trajectory_id, "routing", tokens, DType.UINT8, 4),
            scalar_unit(trajectory_id, "advantage"),
        )
    return TrajectoryMeta(
        trajectory_id=trajectory_id,
        sample_id=sample or trajectory_id,
        source="test",
        rollout_step=0,
        num_tokens=tokens,
        num_loss_tokens=tokens // 2 if loss_tokens is None else loss_tokens,
        segments=(VersionSegment(version=0, num_tokens=tokens),),
        units=units,
        multimodal=multimodal,
    )


def topology(
    dp: int = 2,
    cp: int = 2,
    tp: int = 1,
    budget: int = 4096,
    *,
    encoders: tuple[EncoderTopology, ...] = (),
    quadratic: float = 0.0,
    **backbone: object,
) -> Topology:
    return Topology(
        backbone=BackboneTopology(
            dp=dp,
            cp=cp,
            tp=tp,
            max_tokens_per_microbatch=budget,
            cost=CostModel(linear=1.0, quadratic=quadratic),
            **backbone,
        ),
        encoders=encoders,
    )


@st.composite
def topologies(draw: st.DrawFn) -> Topology:
    cp = draw(st.integers(1, 4))
    tp = draw(st.integers(1, 3))
    sequence_parallel = draw(st.booleans())
    pad_multiple = draw(st.sampled_from([0, 2 * cp, 4 * cp]))
    encoders = tuple(
        EncoderTopology(
            name=name,
            dp=draw(st.integers(1, 4)),
            tp=draw(st.integers(1, 2)),
            max_cost_per_microbatch=float(draw(st.integers(1, 20000))),
        )
        for name in draw(st.sampled_from([(), ("vision",), ("vision", "audio")]))
    )
    return Topology(
        backbone=BackboneTopology(
            dp=draw(st.integers(1, 5)),
            cp=cp,
            tp=tp,
            max_tokens_per_microbatch=draw(st.integers(1, 6000)),
            cost=CostModel(linear=draw(st.sampled_from([0.5, 1.0])), quadratic=draw(st.sampled_from([0.0, 1e-3]))),
            microbatch_multiple=draw(st.integers(1, 3)),
            sequence_parallel=sequence_parallel,
            pad_multiple=pad_multiple,
        ),
        encoders=encoders,
    )


@st.composite
def batches(draw: st.DrawFn, topology: Topology) -> list[TrajectoryMeta]:
    """Samples of 1–4 trajectories; a sample's images sit in its shared prompt, some referenced twice."""
    encoder_names = [e.name for e in topology.encoders]
    trajectories: list[TrajectoryMeta] = []
    for s in range(draw(st.integers(1, 8))):
        images: list[MultimodalRef] = []
        position = draw(st.integers(0, 3))
        for k in range(draw(st.integers(0, 3)) if encoder_names else 0):
            rows = draw(st.integers(1, 40))
            ref = image(
                f"s{s}/img{k}",
                position,
                rows,
                cost=float(draw(st.integers(1, 5000))),
                encoder=draw(st.sampled_from(encoder_names)),
            )
            images.append(ref)
            position += rows + draw(st.integers(0, 5))
            if draw(st.integers(0, 5)) == 0:  # the same image again, later in the prompt
                images.append(image(ref.key, position, rows, cost=ref.cost, encoder=ref.encoder))
                position += rows
        prompt = position
        for g in range(draw(st.integers(1, 4))):
            tokens = prompt + draw(st.one_of(st.integers(1, 300), st.integers(1, 3000), st.integers(1, 12000)))
            trajectories.append(
                trajectory(
                    f"s{s}-t{g}",
                    tokens,
                    sample=f"s{s}",
                    loss_tokens=draw(st.integers(0, tokens)),
                    fields=draw(st.booleans()),
                    multimodal=tuple(images),
                )
            )
    return trajectories
