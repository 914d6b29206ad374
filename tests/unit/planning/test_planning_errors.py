"""Bad input is refused with InvalidArgument (a ValueError) naming the field; validate() catches broken plans."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from planning_data import image, topology, trajectory

from knittrans.admission.planning import plan_minibatch
from knittrans.errors import InvalidArgument
from knittrans.plan import Plan, RouteMap
from knittrans.plan.json import plan_from_json, plan_to_json, trajectory_from_json_dict
from knittrans.plan.proto import plan_from_proto, plan_to_proto
from knittrans.types import BackboneTopology, EncoderTopology, TokenSpan, Topology

VISION = (EncoderTopology(name="vision", dp=2, max_cost_per_microbatch=1000.0),)


def corrupt(obj: object, **fields: object) -> object:
    """A copy of a frozen object with fields set past its own validation: input the planner must still refuse."""
    copy = dataclasses.replace(obj)
    for name, value in fields.items():
        object.__setattr__(copy, name, value)
    return copy


def test_invalid_argument_is_a_value_error() -> None:
    assert issubclass(InvalidArgument, ValueError)


@pytest.mark.parametrize("tokens", [0, -5])
def test_non_positive_lengths(tokens: int) -> None:
    with pytest.raises(InvalidArgument) as info:
        trajectory("t", tokens, fields=False)
    assert info.value.field == "num_tokens"
    bad = corrupt(trajectory("t", 10, fields=False), num_tokens=tokens)
    with pytest.raises(InvalidArgument) as info:
        plan_minibatch([trajectory("ok", 10), bad], topology())
    assert info.value.field == "trajectories[1].num_tokens"


def test_non_positive_length_in_a_batch_line_names_the_line() -> None:
    with pytest.raises(InvalidArgument) as info:
        trajectory_from_json_dict({"trajectory_id": "t", "num_tokens": 0}, "batch.jsonl:3")
    assert info.value.field == "batch.jsonl:3.num_tokens"


@pytest.mark.parametrize("name", ["dp", "cp", "max_tokens_per_microbatch"])
@pytest.mark.parametrize("value", [0, -1])
def test_topology_numbers_below_one(name: str, value: int) -> None:
    arguments = {"dp": 2, "cp": 2, "max_tokens_per_microbatch": 100, name: value}
    with pytest.raises(InvalidArgument) as info:
        BackboneTopology(**arguments)
    assert info.value.field == name
    topo = topology()
    broken = Topology(backbone=corrupt(topo.backbone, **{name: value}))
    with pytest.raises(InvalidArgument) as info:
        plan_minibatch([trajectory("t", 10)], broken)
    assert info.value.field == f"topology.backbone.{name}"


def test_encoder_budget_below_one() -> None:
    with pytest.raises(InvalidArgument) as info:
        EncoderTopology(name="vision", dp=1, max_cost_per_microbatch=0.5)
    assert info.value.field == "max_cost_per_microbatch"


@pytest.mark.parametrize("span", [(5, 12), (10, 11), (3, 3)])
def test_placeholder_outside_the_sequence_or_empty(span: tuple[int, int]) -> None:
    ref = image("s/img", 0, 2)
    ref = corrupt(ref, placeholder=TokenSpan(start=span[0], end=span[1]))
    bad = corrupt(trajectory("t", 10, fields=False), multimodal=(ref,))
    with pytest.raises(InvalidArgument) as info:
        plan_minibatch([bad], topology(encoders=VISION))
    assert info.value.field == "trajectories[0].multimodal[0].placeholder"


def test_placeholder_past_the_end_is_refused_by_the_trajectory_too() -> None:
    with pytest.raises(InvalidArgument) as info:
        trajectory("t", 10, multimodal=(image("s/img", 5, 6),))
    assert info.value.field == "multimodal[0].placeholder"


def test_reference_to_an_unknown_encoder() -> None:
    meta = trajectory("t", 100, multimodal=(image("s/img", 0, 4, encoder="audio"),))
    with pytest.raises(InvalidArgument, match="unknown encoder 'audio'") as info:
        plan_minibatch([meta], topology(encoders=VISION))
    assert info.value.field == "trajectories[0].multimodal[0].encoder"
    with pytest.raises(InvalidArgument) as info:
        plan_minibatch([meta], topology())
    assert info.value.field == "trajectories[0].multimodal[0].encoder"


@pytest.mark.parametrize(
    ("second", "field"),
    [
        (image("s/img", 0, 4, cost=99.0), "cost"),
        (image("s/img", 0, 5, cost=16.0), "placeholder"),
    ],
)
def test_references_to_one_unit_that_disagree(second: object, field: str) -> None:
    first = trajectory("a", 100, sample="s", multimodal=(image("s/img", 0, 4),))
    other = trajectory("b", 100, sample="s", multimodal=(second,))
    with pytest.raises(InvalidArgument) as info:
        plan_minibatch([first, other], topology(encoders=VISION))
    assert info.value.field == f"trajectories[1].multimodal[0].{field}"


def test_duplicate_trajectories_and_empty_batches() -> None:
    with pytest.raises(InvalidArgument) as info:
        plan_minibatch([trajectory("t", 10), trajectory("t", 20)], topology())
    assert info.value.field == "trajectories[1].trajectory_id"
    with pytest.raises(InvalidArgument) as info:
        plan_minibatch([], topology())
    assert info.value.field == "trajectories"
    with pytest.raises(InvalidArgument) as info:
        plan_minibatch([trajectory("t", 10)], topology(), balance_target=0.5)
    assert info.value.field == "balance_target"
    with pytest.raises(InvalidArgument) as info:
        plan_minibatch([trajectory("t", 10)], topology(), label_fields=("bad field",))
    assert info.value.field == "label_fields[0]"


# ---- validate() refuses plans that break an invariant ------------------------------------------------------------


@pytest.fixture
def plan() -> Plan:
    trajectories = []
    for s in range(3):
        images = (image(f"s{s}/a", 1, 6), image(f"s{s}/b", 9, 3))
        trajectories += [trajectory(f"s{s}t{g}", 30 + 7 * g, sample=f"s{s}", multimodal=images) for g in range(3)]
    result = plan_minibatch(trajectories, topology(dp=2, cp=2, tp=2, budget=80, encoders=VISION))
    result.validate()
    return result


def with_backbone(plan: Plan, **fields: object) -> Plan:
    return dataclasses.replace(plan, backbone=dataclasses.replace(plan.backbone, **fields))


def test_validate_refuses_a_trajectory_placed_twice(plan: Plan) -> None:
    items = plan.backbone.microbatch_items.copy()
    items[1] = items[0]
    with pytest.raises(InvalidArgument, match="exactly once") as info:
        with_backbone(plan, microbatch_items=items).validate()
    assert info.value.field == "backbone.microbatch_items"


def test_validate_refuses_unequal_microbatch_counts(plan: Plan) -> None:
    offsets = plan.backbone.microbatch_offsets
    shorter = with_backbone(
        plan,
        microbatch_offsets=offsets[:-1],
        microbatch_loss_tokens=plan.backbone.microbatch_loss_tokens[:-1],
    )
    with pytest.raises(InvalidArgument) as info:
        shorter.validate()
    assert info.value.field == "backbone.microbatch_offsets"


def test_validate_refuses_cp_ranges_with_a_gap_or_overlap(plan: Plan) -> None:
    spans = plan.backbone.cp_spans.copy()
    spans[0, 0, 0, 1] -= 1  # rank 0's first chunk ends one token early: a gap
    with pytest.raises(InvalidArgument, match="tile") as info:
        with_backbone(plan, cp_spans=spans).validate()
    assert info.value.field == "backbone.cp_spans[0]"
    spans = plan.backbone.cp_spans.copy()
    spans[0, 1, 0] = spans[0, 0, 0]  # rank 1 holds rank 0's chunk too: an overlap
    with pytest.raises(InvalidArgument):
        with_backbone(plan, cp_spans=spans).validate()


def test_validate_refuses_a_budget_overrun(plan: Plan) -> None:
    tight = dataclasses.replace(plan.topology.backbone, max_tokens_per_microbatch=40)
    with pytest.raises(InvalidArgument, match="over the budget"):
        dataclasses.replace(plan, topology=dataclasses.replace(plan.topology, backbone=tight)).validate()


def test_validate_refuses_wrong_loss_counts(plan: Plan) -> None:
    with pytest.raises(InvalidArgument) as info:
        with_backbone(plan, minibatch_loss_tokens=plan.backbone.minibatch_loss_tokens + 1).validate()
    assert info.value.field == "backbone.minibatch_loss_tokens"


def test_validate_refuses_an_encoding_with_two_owners_or_none(plan: Plan) -> None:
    vision = plan.encoders[0]
    doubled = dataclasses.replace(
        vision,
        microbatch_encodings=np.concatenate([vision.microbatch_encodings[:1], vision.microbatch_encodings[:-1]]),
    )
    with pytest.raises(InvalidArgument, match="owners") as info:
        dataclasses.replace(plan, encoders=(doubled,)).validate()
    assert info.value.field == "encoders"


def test_validate_refuses_a_route_that_misses_a_reference(plan: Plan) -> None:
    route = plan.route
    keep = np.ones(len(route), dtype=bool)
    keep[3] = False
    partial = RouteMap(
        **{
            name: getattr(route, name)[keep]
            for name in (
                "encodings",
                "references",
                "dp_ranks",
                "cp_ranks",
                "tp_ranks",
                "microbatches",
                "starts",
                "ends",
            )
        }
    )
    with pytest.raises(InvalidArgument, match="not covered") as info:
        dataclasses.replace(plan, route=partial).validate()
    assert info.value.field == "route"


def test_validate_refuses_a_route_to_the_wrong_rank(plan: Plan) -> None:
    route = plan.route
    dp_ranks = route.dp_ranks.copy()
    dp_ranks[0] = 1 - dp_ranks[0]
    with pytest.raises(InvalidArgument, match="rank and micro-batch"):
        dataclasses.replace(plan, route=dataclasses.replace(route, dp_ranks=dp_ranks)).validate()


def test_validate_refuses_a_reference_to_an_unknown_encoding(plan: Plan) -> None:
    ids = plan.encodings.reference_encodings.copy()
    ids[0] = len(plan.encodings) + 5
    with pytest.raises(InvalidArgument, match="unknown encoding") as info:
        dataclasses.replace(plan, encodings=dataclasses.replace(plan.encodings, reference_encodings=ids)).validate()
    assert info.value.field == "reference_encodings"


def test_from_json_refuses_an_encoder_microbatch_naming_an_unknown_encoding(plan: Plan) -> None:
    data = json.loads(plan_to_json(plan))
    data["encoders"][0]["ranks"][0]["microbatches"][0].append(999)
    with pytest.raises(InvalidArgument, match="unknown encoding"):
        plan_from_json(json.dumps(data))


def test_from_json_names_unknown_keys_and_bad_types(plan: Plan) -> None:
    data = json.loads(plan_to_json(plan))
    data["backbone"]["extra"] = 1
    with pytest.raises(InvalidArgument) as info:
        plan_from_json(json.dumps(data))
    assert info.value.field == "backbone.extra"
    data = json.loads(plan_to_json(plan))
    data["trajectories"][2]["num_tokens"] = "many"
    with pytest.raises(InvalidArgument) as info:
        plan_from_json(json.dumps(data))
    assert info.value.field == "trajectories[2].num_tokens"


def test_from_proto_refuses_a_broken_plan(plan: Plan) -> None:
    message = plan_to_proto(plan)
    del message.route.starts[-1]
    with pytest.raises(InvalidArgument):
        plan_from_proto(message)
    message = plan_to_proto(plan)
    message.backbone.microbatch_items[0] = message.backbone.microbatch_items[1]
    with pytest.raises(InvalidArgument, match="exactly once"):
        plan_from_proto(message)
