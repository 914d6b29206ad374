"""Property tests: every plan of random mini-batches and topologies satisfies Plan.validate() and reads exactly
what each consumer needs."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from planning_data import batches, topologies

from knittrans.admission.planning import plan_minibatch
from knittrans.plan import Plan
from knittrans.plan.json import plan_from_json, plan_to_json
from knittrans.plan.proto import assignment_from_proto, assignment_to_proto, plan_from_proto, plan_to_proto
from knittrans.types import ConsumerId, UnitKind

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    topology = draw(topologies())
    return plan_minibatch(draw(batches(topology)), topology)


@SETTINGS
@given(plans())
def test_every_plan_validates(plan: Plan) -> None:
    plan.validate()
    backbone = plan.topology.backbone
    per_rank = plan.microbatches_per_rank
    assert per_rank % backbone.microbatch_multiple == 0
    assert [len(plan.microbatches(d)) for d in range(backbone.dp)] == [per_rank] * backbone.dp
    placed = sorted(int(t) for d in range(backbone.dp) for mb in plan.microbatches(d) for t in mb)
    assert placed == list(range(plan.num_trajectories))
    assert plan.backbone.minibatch_loss_tokens == sum(t.num_loss_tokens for t in plan.trajectories)
    assert plan.quality.dedup_factor >= 1.0


@SETTINGS
@given(plans())
def test_empty_microbatches_only_when_nothing_can_split(plan: Plan) -> None:
    for d in range(plan.topology.backbone.dp):
        microbatches = plan.microbatches(d)
        if any(len(mb) == 0 for mb in microbatches):
            assert all(len(mb) <= 1 for mb in microbatches), "an empty micro-batch was added though one could split"
    assert plan.quality.empty_microbatches == sum(
        len(mb) == 0 for d in range(plan.topology.backbone.dp) for mb in plan.microbatches(d)
    )


@SETTINGS
@given(plans())
def test_consumers_read_each_token_once_plus_label_look_ahead(plan: Plan) -> None:
    """Over the CP ranks of its DP group, every per-token field is read exactly once, plus one token after
    each chunk for label fields; non-sequence fields are read whole by every CP rank."""
    backbone = plan.topology.backbone
    for d in range(backbone.dp):
        assignments = [plan.for_consumer(ConsumerId(role="backbone", dp_rank=d, cp_rank=c)) for c in range(backbone.cp)]
        for j in range(plan.microbatches_per_rank):
            items = [a.microbatches[j].items for a in assignments]
            assert len({tuple(i.trajectory_index for i in group) for group in items}) == 1
            for position, item in enumerate(items[0]):
                meta = item.trajectory
                for field_index, unit in enumerate(meta.units):
                    reads = [group[position].reads[field_index] for group in items]
                    if unit.kind is UnitKind.FIELD:
                        assert all(r.needed_bytes == unit.header.byte_length for r in reads)
                        continue
                    covered = np.zeros(meta.num_tokens, dtype=np.int64)
                    for r in reads:
                        for span in r.spans:
                            covered[span.start : span.end] += 1
                    if unit.field_name in plan.label_fields:
                        assert all(r.look_ahead for r in reads)
                        expected = np.ones(meta.num_tokens, dtype=np.int64)
                        for c in range(backbone.cp):
                            own = [s for s in plan.cp_token_spans(item.trajectory_index, c) if s.length]
                            for span in own:
                                after = span.end
                                if after < meta.num_tokens and not any(o.start <= after < o.end for o in own):
                                    expected[after] += 1
                        assert covered.tolist() == expected.tolist()
                    else:
                        assert covered.tolist() == [1] * meta.num_tokens
                        total = sum(r.needed_bytes for r in reads)
                        assert total == unit.header.byte_length


@SETTINGS
@given(plans())
def test_every_reference_reaches_every_tp_rank_of_its_consumer(plan: Plan) -> None:
    backbone = plan.topology.backbone
    refs = [(t, m) for t, meta in enumerate(plan.trajectories) for m in meta.multimodal]
    filled = {
        (r, tp): np.zeros(m.placeholder.length, dtype=np.int64)
        for r, (_, m) in enumerate(refs)
        for tp in range(backbone.tp)
    }
    for e in range(len(plan.encodings)):
        owner = plan.encoding_owner(e)
        assert plan.encoding(e).encoder == owner.encoder
        for route in plan.routes(e):
            t, ref = refs[route.reference]
            assert route.trajectory_index == t and ref.key == plan.encoding(e).key
            assert route.consumer.dp_rank == plan.trajectory_dp_ranks[t]
            rows = slice(route.row_start, route.row_start + route.positions.length)
            filled[route.reference, route.tp_rank][rows] += 1
    assert all(counts.tolist() == [1] * len(counts) for counts in filled.values())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans())
def test_json_and_proto_round_trips(plan: Plan) -> None:
    assert plan_from_json(plan_to_json(plan)) == plan
    assert plan_from_proto(plan_to_proto(plan)) == plan
    assert plan_to_json(plan_from_json(plan_to_json(plan))) == plan_to_json(plan)
    for consumer in plan.consumers():
        assignment = plan.for_consumer(consumer)
        message = assignment_to_proto(assignment)
        assert assignment_from_proto(type(message).FromString(message.SerializeToString())) == assignment
