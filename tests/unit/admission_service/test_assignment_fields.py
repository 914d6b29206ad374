"""The service builds each consumer's assignment straight from the plan's arrays: an encoder consumer's must equal
``assignment_to_proto(plan_minibatch(...).for_consumer(c))``, and what each backbone CP rank cuts from its DP rank's
part must equal ``plan.for_consumer(c)``, whichever form the trajectories were reported in."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.admission.planning import plan_minibatch
from knittrans.admission.service.assignments import MiniBatchDispatch, gather_rows
from knittrans.admission.service.trajectory_columns import TrajectoryColumns
from knittrans.plan.proto import assignment_to_proto
from knittrans.plan.rank_proto import consumer_assignment_from_rank_proto
from knittrans.types import (
    BackboneTopology,
    ConsumerId,
    DType,
    EncoderTopology,
    FieldAlignment,
    MultimodalRef,
    TokenSpan,
    Topology,
    TrajectoryMeta,
    UnitHeader,
    UnitKind,
    UnitRef,
    VersionSegment,
)
from knittrans.v1 import plan_pb2
from knittrans.wire import trajectory_to_proto
from knittrans.wire.columns import batch_from_metas
from tests.builders import digest, token_unit


def meta(index: int, tokens: int, images: int, group: int) -> TrajectoryMeta:
    trajectory_id, sample_id = f"t{index}", f"s{index // group}"
    multimodal = tuple(
        MultimodalRef(
            key=f"{sample_id}/img{k}", encoder="vision" if k % 2 == 0 else "audio", cost=16.0 + k,
            placeholder=TokenSpan(start=1 + 5 * k, end=5 + 5 * k),
            kind=UnitKind.IMAGE if k % 3 else UnitKind.VIDEO,
            header=UnitHeader(dtype=DType.UINT8, shape=(2, 2), byte_length=4, content_hash=digest(f"{sample_id}{k}"))
            if k % 2 else None,
        )
        for k in range(min(images, (tokens - 1) // 5))
    )
    return TrajectoryMeta(
        trajectory_id=trajectory_id, sample_id=sample_id, source="AB"[index % 2], rollout_step=index,
        num_tokens=tokens, num_loss_tokens=tokens // 2, segments=(VersionSegment(version=0, num_tokens=tokens // 2),),
        units=(
            token_unit(trajectory_id, "input_ids", tokens, DType.INT32),
            # Token-aligned on some trajectories: read with one token of look-ahead there.
            replace(token_unit(trajectory_id, "logprobs", tokens, DType.FLOAT32),
                    alignment=(None, FieldAlignment.TOKEN, FieldAlignment.LABEL)[index % 3]),
            token_unit(trajectory_id, "routing", tokens, DType.UINT8, width=8),
            UnitRef(key=f"{trajectory_id}/stats", field_name="stats", kind=UnitKind.FIELD,
                    header=UnitHeader(dtype=DType.FLOAT64, shape=(3,), byte_length=24,
                                      content_hash=digest(trajectory_id))),
        ),
        multimodal=multimodal, scalars=(("reward", float(index)),), finished_at=float(index),
    )


TOPOLOGIES = {
    "dp2-cp2": Topology(backbone=BackboneTopology(dp=2, cp=2, max_tokens_per_microbatch=256),
                        encoders=(EncoderTopology(name="vision", dp=2, max_cost_per_microbatch=40),
                                  EncoderTopology(name="audio", dp=1, max_cost_per_microbatch=64))),
    "dp3-cp1-tp2": Topology(backbone=BackboneTopology(dp=3, cp=1, tp=2, max_tokens_per_microbatch=300),
                            encoders=(EncoderTopology(name="vision", dp=1, tp=2, max_cost_per_microbatch=1000),
                                      EncoderTopology(name="audio", dp=2, max_cost_per_microbatch=17))),
    "dp1-cp4-sp": Topology(backbone=BackboneTopology(dp=1, cp=4, tp=2, sequence_parallel=True,
                                                     max_tokens_per_microbatch=512),
                           encoders=(EncoderTopology(name="vision", dp=1, max_cost_per_microbatch=50),
                                     EncoderTopology(name="audio", dp=1, max_cost_per_microbatch=50))),
}


def dispatches(metas: list[TrajectoryMeta], topology: Topology, labels: tuple[str, ...]) -> list[MiniBatchDispatch]:
    """The dispatch of the same trajectories reported as messages, as one batch, and split over two reports."""
    from_messages = TrajectoryColumns.from_messages([trajectory_to_proto(m) for m in metas])
    from_batch = TrajectoryColumns.from_proto(batch_from_metas(metas))
    half = len(metas) // 2
    first, second = (TrajectoryColumns.from_proto(batch_from_metas(part)) for part in (metas[:half], metas[half:]))
    located = [
        [(from_messages, i) for i in range(len(metas))],
        [(from_batch, i) for i in range(len(metas))],
        [(first, i) for i in range(half)] + [(second, i) for i in range(len(metas) - half)],
    ]
    return [MiniBatchDispatch(gather_rows(rows), topology, labels) for rows in located]


def built_part(dispatch: MiniBatchDispatch, consumer: ConsumerId) -> plan_pb2.ConsumerAssignment:
    """What ``consumer``'s sidecar holds: an encoder's own part, or a backbone CP rank's cut of its DP rank's part
    (after a round trip through the wire, as the stream carries it)."""
    if consumer.encoder_name is not None:
        return dispatch.assignment(consumer)
    rank = plan_pb2.RankAssignment(**dispatch.rank_fields(consumer.dp_rank))
    rank = plan_pb2.RankAssignment.FromString(rank.SerializeToString())
    return assignment_to_proto(consumer_assignment_from_rank_proto(rank, consumer))


def check_equal(metas: list[TrajectoryMeta], topology: Topology, labels: tuple[str, ...]) -> None:
    plan = plan_minibatch(metas, topology, label_fields=labels)
    for dispatch in dispatches(metas, topology, labels):
        assert dispatch.minibatch_loss_tokens == plan.backbone.minibatch_loss_tokens
        for consumer in plan.consumers():
            expected = assignment_to_proto(plan.for_consumer(consumer))
            built = built_part(dispatch, consumer)
            assert built == expected, consumer
            assert built.SerializeToString(deterministic=True) == expected.SerializeToString(deterministic=True)


@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
@pytest.mark.parametrize("labels", [("input_ids",), ("input_ids", "routing")])
def test_built_assignments_equal_the_plan_s(topology: str, labels: tuple[str, ...]) -> None:
    metas = [meta(i, 20 + 13 * i, images=i % 4, group=3) for i in range(10)]
    check_equal(metas, TOPOLOGIES[topology], labels)


@given(lengths=st.lists(st.integers(min_value=2, max_value=400), min_size=1, max_size=24),
       images=st.integers(min_value=0, max_value=4), group=st.integers(min_value=1, max_value=4),
       topology=st.sampled_from(sorted(TOPOLOGIES)))
@settings(max_examples=40, deadline=None)
def test_built_assignments_equal_the_plan_s_for_any_lengths(lengths, images, group, topology) -> None:
    metas = [meta(i, length, images, group) for i, length in enumerate(lengths)]
    check_equal(metas, TOPOLOGIES[topology], ("input_ids",))


@given(lengths=st.lists(st.integers(min_value=2, max_value=300), min_size=1, max_size=16),
       images=st.integers(min_value=0, max_value=4), topology=st.sampled_from(sorted(TOPOLOGIES)),
       data=st.data())
@settings(max_examples=30, deadline=None)
def test_shared_views_give_each_consumer_what_an_independent_build_gives(lengths, images, topology, data) -> None:
    """One dispatch per mini-batch serves every consumer from views built once (and dropped once every planned
    consumer had its part): in any consumer order, with repeats (a reconnecting stream) and two mini-batches
    interleaved, each part equals a build from a fresh dispatch of its own and the plan's ``for_consumer``."""
    topo = TOPOLOGIES[topology]
    minibatches = [[meta(i, length, images, group=2) for i, length in enumerate(lengths)],
                   [meta(100 + i, length + 7, images, group=3) for i, length in enumerate(reversed(lengths))]]
    plans = [plan_minibatch(metas, topo, label_fields=("input_ids",)) for metas in minibatches]
    consumers = list(plans[0].consumers())
    shared = [MiniBatchDispatch(gather_rows([(TrajectoryColumns.from_proto(batch_from_metas(metas)), i)
                                             for i in range(len(metas))]), topo, ("input_ids",))
              for metas in minibatches]
    # Every consumer of each mini-batch once, in a shuffled interleaving, then some again.
    order = data.draw(st.permutations([(b, c) for b in range(2) for c in range(len(consumers))]))
    order += data.draw(st.lists(st.tuples(st.integers(0, 1), st.integers(0, len(consumers) - 1)), max_size=6))
    for b, c in order:
        consumer = consumers[c]
        built = built_part(shared[b], consumer)
        metas = minibatches[b]
        columns = TrajectoryColumns.from_messages([trajectory_to_proto(m) for m in metas])
        alone = MiniBatchDispatch(gather_rows([(columns, i) for i in range(len(metas))]), topo, ("input_ids",))
        assert built == built_part(alone, consumer), (b, consumer)
        assert built == assignment_to_proto(plans[b].for_consumer(consumer)), (b, consumer)
