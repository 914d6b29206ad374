"""The encoding schedule rejects every plan that could leave a reference without an encoding or a gradient."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from knittrans.errors import InvalidArgument
from knittrans.train.schedule import (
    BackboneMicroBatch,
    EncoderMicroBatch,
    EncodingRoute,
    EncodingSchedule,
    EncodingUse,
    RankSchedule,
    WireKind,
    schedule_from_ranks,
)
from knittrans.types import UnitKey


def use(key: str, position: int, rows: int = 4, first_row: int = 0) -> EncodingUse:
    return EncodingUse(key=UnitKey(key), position=position, num_rows=rows, first_row=first_row)


def two_rank_schedule(**overrides: object) -> EncodingSchedule:
    """Rank 0 encodes a, rank 1 encodes b; rank 0 uses a twice and b, rank 1 uses a."""
    ranks = (
        RankSchedule(
            rank=0,
            dp_rank=0,
            encoder_micro_batches=(EncoderMicroBatch(keys=(UnitKey("a"),)),),
            backbone_micro_batches=(
                BackboneMicroBatch(uses=(use("a", 0), use("a", 10))),
                BackboneMicroBatch(uses=(use("b", 2),)),
            ),
        ),
        RankSchedule(
            rank=1,
            dp_rank=1,
            encoder_micro_batches=(EncoderMicroBatch(keys=(UnitKey("b"),)),),
            backbone_micro_batches=(BackboneMicroBatch(uses=(use("a", 3),)),),
        ),
    )
    routes = (
        EncodingRoute(key=UnitKey("a"), num_rows=4, owner=0, consumers=(1, 0)),
        EncodingRoute(key=UnitKey("b"), num_rows=4, owner=1, consumers=(0,)),
    )
    fields = {"ranks": ranks, "routes": routes, **overrides}
    return EncodingSchedule(**fields)  # type: ignore[arg-type]


def test_valid_schedule_derives_the_same_lists_on_both_sides() -> None:
    schedule = two_rank_schedule()
    assert schedule.route(UnitKey("a")).consumers == (0, 1)
    assert schedule.consumed_keys(0) == ("a", "b")
    assert schedule.consumed_keys(1) == ("a",)
    assert schedule.keys_between(0, 1) == ("a",)
    assert schedule.keys_between(1, 0) == ("b",)
    assert schedule.keys_between(0, 0) == ("a",)
    assert schedule.num_uses == 4
    assert schedule.fingerprint() == two_rank_schedule().fingerprint()


def test_fingerprint_changes_with_any_field() -> None:
    changed = two_rank_schedule(
        routes=(
            EncodingRoute(key=UnitKey("a"), num_rows=5, owner=0, consumers=(0, 1)),
            EncodingRoute(key=UnitKey("b"), num_rows=4, owner=1, consumers=(0,)),
        )
    )
    assert changed.fingerprint() != two_rank_schedule().fingerprint()


def test_reference_to_an_encoding_nobody_computes_is_refused() -> None:
    base = two_rank_schedule()
    rank1 = dataclasses.replace(
        base.ranks[1], backbone_micro_batches=(BackboneMicroBatch(uses=(use("a", 3), use("zzz", 9))),)
    )
    with pytest.raises(InvalidArgument, match="'zzz', which no rank encodes") as info:
        two_rank_schedule(ranks=(base.ranks[0], rank1))
    assert info.value.field == "ranks[1].backbone_micro_batches[0].uses[1].key"


def test_route_that_does_not_cover_a_reference_is_refused() -> None:
    routes = (
        EncodingRoute(key=UnitKey("a"), num_rows=4, owner=0, consumers=(0,)),
        EncodingRoute(key=UnitKey("b"), num_rows=4, owner=1, consumers=(0,)),
    )
    with pytest.raises(InvalidArgument, match="does not deliver it to rank 1"):
        two_rank_schedule(routes=routes)


def test_route_to_a_rank_that_never_uses_the_encoding_is_refused() -> None:
    routes = (
        EncodingRoute(key=UnitKey("a"), num_rows=4, owner=0, consumers=(0, 1)),
        EncodingRoute(key=UnitKey("b"), num_rows=4, owner=1, consumers=(0, 1)),
    )
    with pytest.raises(InvalidArgument, match="to rank 1, which never uses it"):
        two_rank_schedule(routes=routes)


def test_two_owners_and_wrong_owner_are_refused() -> None:
    base = two_rank_schedule()
    both = dataclasses.replace(base.ranks[1], encoder_micro_batches=(EncoderMicroBatch(keys=("b", "a")),))
    with pytest.raises(InvalidArgument, match="exactly one owner"):
        two_rank_schedule(ranks=(base.ranks[0], both))
    routes = (
        EncodingRoute(key=UnitKey("a"), num_rows=4, owner=1, consumers=(0, 1)),
        EncodingRoute(key=UnitKey("b"), num_rows=4, owner=1, consumers=(0,)),
    )
    with pytest.raises(InvalidArgument, match="route names owner 1"):
        two_rank_schedule(routes=routes)


def test_route_without_encoder_micro_batch_is_refused() -> None:
    base = two_rank_schedule()
    rank1 = dataclasses.replace(base.ranks[1], encoder_micro_batches=())
    with pytest.raises(InvalidArgument, match="in no encoder micro-batch"):
        two_rank_schedule(ranks=(base.ranks[0], rank1))


def test_rows_beyond_the_encoding_are_refused() -> None:
    base = two_rank_schedule()
    rank1 = dataclasses.replace(
        base.ranks[1], backbone_micro_batches=(BackboneMicroBatch(uses=(use("a", 3, rows=2, first_row=3),)),)
    )
    with pytest.raises(InvalidArgument, match=r"rows \[3, 5\) lie outside the 4 rows"):
        two_rank_schedule(ranks=(base.ranks[0], rank1))


def test_overlapping_placeholders_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="overlap") as info:
        BackboneMicroBatch(uses=(use("a", 10), use("b", 0), use("c", 3)))
    assert info.value.field == "uses[2].position"


def test_unknown_consumer_rank_is_refused() -> None:
    routes = (
        EncodingRoute(key=UnitKey("a"), num_rows=4, owner=0, consumers=(0, 1, 7)),
        EncodingRoute(key=UnitKey("b"), num_rows=4, owner=1, consumers=(0,)),
    )
    with pytest.raises(InvalidArgument, match="rank 7 does not exist"):
        two_rank_schedule(routes=routes)


def test_incomplete_tp_group_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="has tp ranks"):
        two_rank_schedule(tp_size=2)


def test_tp_replicas_must_run_the_same_micro_batches() -> None:
    base = two_rank_schedule()
    replica = dataclasses.replace(base.ranks[1], dp_rank=0, tp_rank=1)
    with pytest.raises(InvalidArgument, match="TP replicas must run the same backbone micro-batches"):
        two_rank_schedule(ranks=(base.ranks[0], replica), tp_size=2)


def test_ranks_must_be_listed_in_order() -> None:
    base = two_rank_schedule()
    with pytest.raises(InvalidArgument, match="listed in order"):
        two_rank_schedule(ranks=(base.ranks[1], base.ranks[0]))


def test_single_process_builder_needs_row_counts() -> None:
    with pytest.raises(InvalidArgument, match="no row count"):
        EncodingSchedule.single_process(
            encoder_micro_batches=[("a",)], backbone_micro_batches=[[use("a", 0)]], num_rows={}
        )


@st.composite
def distributed_schedules(draw: st.DrawFn) -> EncodingSchedule:
    """Random (dp, cp, tp) layouts with random owners and random references, routes derived from them."""
    dp = draw(st.integers(1, 3))
    cp = draw(st.integers(1, 2))
    tp = draw(st.integers(1, 3))
    world = dp * cp * tp
    keys = [UnitKey(f"k{i}") for i in range(draw(st.integers(1, 8)))]
    rows = {key: draw(st.integers(1, 9)) for key in keys}
    owners = {key: draw(st.integers(0, world - 1)) for key in keys}
    group_micro_batches: dict[tuple[int, int], tuple[BackboneMicroBatch, ...]] = {}
    for d in range(dp):
        for c in range(cp):
            micro_batches = []
            for _ in range(draw(st.integers(1, 3))):
                chosen = draw(st.lists(st.sampled_from(keys), max_size=4))
                position, uses = 0, []
                for key in chosen:
                    first = draw(st.integers(0, rows[key] - 1))
                    count = draw(st.integers(1, rows[key] - first))
                    uses.append(EncodingUse(key=key, position=position, num_rows=count, first_row=first))
                    position += count + draw(st.integers(0, 3))
                micro_batches.append(BackboneMicroBatch(uses=tuple(uses)))
            group_micro_batches[(d, c)] = tuple(micro_batches)
    ranks = []
    for rank in range(world):
        d, c, t = rank // (cp * tp), (rank // tp) % cp, rank % tp
        owned = tuple(key for key in keys if owners[key] == rank)
        ranks.append(
            RankSchedule(
                rank=rank,
                dp_rank=d,
                cp_rank=c,
                tp_rank=t,
                encoder_micro_batches=tuple(EncoderMicroBatch(keys=owned[i : i + 2]) for i in range(0, len(owned), 2)),
                backbone_micro_batches=group_micro_batches[(d, c)],
            )
        )
    consumers_of = {key: tuple(r.rank for r in ranks if key in r.referenced_keys()) for key in keys}
    # A key nobody references would be refused, so the planner never encodes it.
    used = [(key, consumers) for key, consumers in consumers_of.items() if consumers]
    assume(used)
    used_keys = {key for key, _ in used}
    ranks = [
        dataclasses.replace(
            r,
            encoder_micro_batches=tuple(
                EncoderMicroBatch(keys=tuple(k for k in m.keys if k in used_keys))
                for m in r.encoder_micro_batches
                if any(k in used_keys for k in m.keys)
            ),
        )
        for r in ranks
    ]
    return EncodingSchedule(
        ranks=tuple(ranks),
        routes=tuple(
            EncodingRoute(key=key, num_rows=rows[key], owner=owners[key], consumers=consumers)
            for key, consumers in used
        ),
        tp_size=tp,
    )


@settings(max_examples=60, deadline=None)
@given(distributed_schedules())
def test_tp_ranks_together_return_every_row_exactly_once(schedule: EncodingSchedule) -> None:
    for route in schedule.routes:
        for rank in route.consumers:
            group = [r for r in schedule.ranks if r.tp_group == schedule.ranks[rank].tp_group]
            assert all(member.rank in route.consumers for member in group)
            assert sum(schedule.owned_row_count(member.rank, route.key) for member in group) == route.num_rows
        sent = [c for c in range(schedule.world_size) if route.key in schedule.keys_between(route.owner, c)]
        assert tuple(sent) == route.consumers


@settings(max_examples=60, deadline=None)
@given(distributed_schedules(), st.data())
def test_dropping_any_consumer_from_a_route_is_refused(schedule: EncodingSchedule, data: st.DataObject) -> None:
    index = data.draw(st.integers(0, len(schedule.routes) - 1))
    route = schedule.routes[index]
    dropped = data.draw(st.sampled_from(route.consumers))
    remaining = tuple(c for c in route.consumers if c != dropped)
    routes = list(schedule.routes)
    with pytest.raises(InvalidArgument):
        routes[index] = dataclasses.replace(route, consumers=remaining)
        EncodingSchedule(ranks=schedule.ranks, routes=tuple(routes), tp_size=schedule.tp_size)


@settings(max_examples=60, deadline=None)
@given(distributed_schedules(), st.randoms(use_true_random=False))
def test_listing_order_changes_neither_the_schedule_nor_any_wire_layout(
    schedule: EncodingSchedule, rng: random.Random
) -> None:
    """Routes and owned keys listed in any order give the same schedule and the same message layouts, and each
    layout names every key the message carries with the right row count (issue 13: gradients were read back in
    the owner's encoding order while consumers packed them in route order)."""
    routes = list(schedule.routes)
    rng.shuffle(routes)
    ranks = []
    for rank in schedule.ranks:
        keys = [key for micro in rank.encoder_micro_batches for key in micro.keys]
        rng.shuffle(keys)
        ranks.append(dataclasses.replace(rank, encoder_micro_batches=tuple(EncoderMicroBatch(keys=(k,)) for k in keys)))
    reordered = EncodingSchedule(ranks=tuple(ranks), routes=tuple(routes), tp_size=schedule.tp_size)
    assert reordered.routes == schedule.routes
    for owner in range(schedule.world_size):
        for consumer in range(schedule.world_size):
            for kind in WireKind:
                layout = reordered.wire(owner=owner, consumer=consumer, kind=kind)
                assert layout == schedule.wire(owner=owner, consumer=consumer, kind=kind)
                carried = {r.key for r in schedule.routes if r.owner == owner and consumer in r.consumers}
                assert set(layout.keys) == carried and len(layout.keys) == len(carried)
                start = 0
                for segment in layout.segments:
                    assert segment.start == start
                    want = (
                        schedule.route(segment.key).num_rows
                        if kind is WireKind.ENCODINGS
                        else schedule.owned_row_count(consumer, segment.key)
                    )
                    assert segment.num_rows == want and layout.segment(segment.key) == segment
                    start += segment.num_rows
                assert layout.num_rows == start


def test_schedule_from_ranks_derives_the_routes() -> None:
    built = schedule_from_ranks(ranks=two_rank_schedule().ranks, num_rows={"a": 4, "b": 4})
    assert built == two_rank_schedule()
    with pytest.raises(InvalidArgument, match="computed by ranks 0 and 1"):
        schedule_from_ranks(
            ranks=(
                RankSchedule(rank=0, encoder_micro_batches=(EncoderMicroBatch(keys=(UnitKey("a"),)),)),
                RankSchedule(rank=1, dp_rank=1, encoder_micro_batches=(EncoderMicroBatch(keys=(UnitKey("a"),)),)),
            ),
            num_rows={"a": 4},
        )
    with pytest.raises(InvalidArgument, match="no rank computes them"):
        schedule_from_ranks(
            ranks=(RankSchedule(rank=0, backbone_micro_batches=(BackboneMicroBatch(uses=(use("a", 0),)),)),),
            num_rows={"a": 4},
        )
