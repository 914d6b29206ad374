"""Translation between topology messages and the typed domain objects of :mod:`knittrans.types`."""

from __future__ import annotations

from functools import partial

from knittrans.errors import within
from knittrans.types import BackboneTopology, ConsumerId, CostModel, EncoderTopology, Topology, TrainerRole
from knittrans.v1 import topology_pb2


def _backbone_to_proto(backbone: BackboneTopology) -> topology_pb2.BackboneTopology:
    return topology_pb2.BackboneTopology(
            dp=backbone.dp,
            cp=backbone.cp,
            tp=backbone.tp,
            max_tokens_per_microbatch=backbone.max_tokens_per_microbatch,
            cost=topology_pb2.CostModel(linear=backbone.cost.linear, quadratic=backbone.cost.quadratic),
            microbatch_multiple=backbone.microbatch_multiple,
            sequence_parallel=backbone.sequence_parallel,
            pad_multiple=backbone.pad_multiple,
    )


def topology_to_proto(topology: Topology) -> topology_pb2.Topology:
    return topology_pb2.Topology(
        backbone=_backbone_to_proto(topology.backbone),
        encoders=[
            topology_pb2.EncoderTopology(
                name=e.name, dp=e.dp, tp=e.tp, max_cost_per_microbatch=e.max_cost_per_microbatch
            )
            for e in topology.encoders
        ],
        roles=[topology_pb2.TrainerRole(name=r.name, backbone=_backbone_to_proto(r.backbone), produces=r.produces,
                                        consumes=r.consumes) for r in topology.roles],
        consumes=topology.consumes,
    )


def topology_from_proto(message: topology_pb2.Topology) -> Topology:
    """Zero-valued optional knobs (cp, tp, microbatch_multiple, an empty cost model) mean "the default"."""
    backbone = within("backbone", lambda: _backbone_from_proto(message.backbone))
    encoders = tuple(
        within(
            f"encoders[{i}]",
            partial(
                EncoderTopology, name=e.name, dp=e.dp, tp=e.tp or 1, max_cost_per_microbatch=e.max_cost_per_microbatch
            ),
        )
        for i, e in enumerate(message.encoders)
    )
    roles = tuple(
        within(f"roles[{i}]", partial(_role_from_proto, r)) for i, r in enumerate(message.roles)
    )
    return Topology(backbone=backbone, encoders=encoders, roles=roles, consumes=tuple(message.consumes))


def _role_from_proto(message: topology_pb2.TrainerRole) -> TrainerRole:
    backbone = within("backbone", lambda: _backbone_from_proto(message.backbone))
    return TrainerRole(name=message.name, backbone=backbone, produces=tuple(message.produces),
                       consumes=tuple(message.consumes))


def _backbone_from_proto(b: topology_pb2.BackboneTopology) -> BackboneTopology:
    cost = CostModel() if not b.HasField("cost") or (b.cost.linear == 0 and b.cost.quadratic == 0) else None
    return BackboneTopology(
        dp=b.dp,
        cp=b.cp or 1,
        tp=b.tp or 1,
        max_tokens_per_microbatch=b.max_tokens_per_microbatch,
        cost=cost or within("cost", lambda: CostModel(linear=b.cost.linear, quadratic=b.cost.quadratic)),
        microbatch_multiple=b.microbatch_multiple or 1,
        sequence_parallel=b.sequence_parallel,
        pad_multiple=b.pad_multiple,
    )


def consumer_to_proto(consumer: ConsumerId) -> topology_pb2.ConsumerId:
    return topology_pb2.ConsumerId(role=consumer.role, dp_rank=consumer.dp_rank, cp_rank=consumer.cp_rank)


def consumer_from_proto(message: topology_pb2.ConsumerId) -> ConsumerId:
    return ConsumerId(role=message.role, dp_rank=message.dp_rank, cp_rank=message.cp_rank)
