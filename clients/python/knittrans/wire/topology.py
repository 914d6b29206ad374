"""Translation between topology messages and the typed domain objects of :mod:`knittrans.types`."""

from __future__ import annotations

from functools import partial

from knittrans.errors import within
from knittrans.types import BackboneTopology, ConsumerId, CostModel, EncoderTopology, Topology
from knittrans.v1 import topology_pb2


def topology_to_proto(topology: Topology) -> topology_pb2.Topology:
    backbone = topology.backbone
    return topology_pb2.Topology(
        backbone=topology_pb2.BackboneTopology(
            dp=backbone.dp,
            cp=backbone.cp,
            tp=backbone.tp,
            max_tokens_per_microbatch=backbone.max_tokens_per_microbatch,
            cost=topology_pb2.CostModel(linear=backbone.cost.linear, quadratic=backbone.cost.quadratic),
            microbatch_multiple=backbone.microbatch_multiple,
            sequence_parallel=backbone.sequence_parallel,
            pad_multiple=backbone.pad_multiple,
        ),
        encoders=[
            topology_pb2.EncoderTopology(
                name=e.name, dp=e.dp, tp=e.tp, max_cost_per_microbatch=e.max_cost_per_microbatch
            )
            for e in topology.encoders
        ],
    )


def topology_from_proto(message: topology_pb2.Topology) -> Topology:
    """Zero-valued optional knobs (cp, tp, microbatch_multiple, an empty cost model) mean "the default"."""
    b = message.backbone
    cost = CostModel() if not b.HasField("cost") or (b.cost.linear == 0 and b.cost.quadratic == 0) else None
    backbone = within(
        "backbone",
        lambda: BackboneTopology(
            dp=b.dp,
            cp=b.cp or 1,
            tp=b.tp or 1,
            max_tokens_per_microbatch=b.max_tokens_per_microbatch,
            cost=cost or within("cost", lambda: CostModel(linear=b.cost.linear, quadratic=b.cost.quadratic)),
            microbatch_multiple=b.microbatch_multiple or 1,
            sequence_parallel=b.sequence_parallel,
            pad_multiple=b.pad_multiple,
        ),
    )
    encoders = tuple(
        within(
            f"encoders[{i}]",
            partial(
                EncoderTopology, name=e.name, dp=e.dp, tp=e.tp or 1, max_cost_per_microbatch=e.max_cost_per_microbatch
            ),
        )
        for i, e in enumerate(message.encoders)
    )
    return Topology(backbone=backbone, encoders=encoders)


def consumer_to_proto(consumer: ConsumerId) -> topology_pb2.ConsumerId:
    return topology_pb2.ConsumerId(role=consumer.role, dp_rank=consumer.dp_rank, cp_rank=consumer.cp_rank)


def consumer_from_proto(message: topology_pb2.ConsumerId) -> ConsumerId:
    return ConsumerId(role=message.role, dp_rank=message.dp_rank, cp_rank=message.cp_rank)
