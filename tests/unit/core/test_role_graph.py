"""The trainer roles' graph (docs/roles.md) against a naive reference: a topology is accepted exactly when role
names are unique, no role both produces and consumes a field, every produced field has one producer, every
consumed field has a producer, and no role depends on itself through the fields it consumes (transitive closure,
computed by repeated relaxation). A refusal names where it is (``roles...`` or ``consumes...``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.errors import InvalidArgument
from knittrans.types import BackboneTopology, ConsumerId, Topology, TrainerRole

FIELDS = ("f0", "f1", "f2", "f3")
NAMES = ("r0", "r1", "r2", "r3")
BACKBONE = BackboneTopology(dp=1, max_tokens_per_microbatch=64)

roles_strategy = st.lists(st.tuples(st.sampled_from(NAMES), st.sets(st.sampled_from(FIELDS), max_size=2),
                                    st.sets(st.sampled_from(FIELDS), max_size=2)), max_size=4)


def naive_valid(roles: list[tuple[str, set[str], set[str]]], backbone_consumes: set[str]) -> bool:
    names = [name for name, _, _ in roles]
    if len(set(names)) != len(names) or any(p & c for _, p, c in roles):
        return False
    producers = [field for _, produced, _ in roles for field in produced]
    if len(set(producers)) != len(producers):
        return False
    if any(field not in producers for _, _, consumed in roles for field in consumed) or \
            any(field not in producers for field in backbone_consumes):
        return False
    producer_of = {field: name for name, produced, _ in roles for field in produced}
    reaches = {name: {producer_of[f] for f in consumed} for name, _, consumed in roles}
    for _ in roles:  # relax until the closure is complete
        for name in reaches:
            reaches[name] = reaches[name] | {far for near in reaches[name] for far in reaches[near]}
    return not any(name in reached for name, reached in reaches.items())


@settings(max_examples=400, deadline=None)
@given(roles=roles_strategy, backbone_consumes=st.sets(st.sampled_from(FIELDS), max_size=2))
def test_the_role_graph_is_accepted_exactly_when_the_naive_reference_accepts_it(roles, backbone_consumes) -> None:
    expected = naive_valid(roles, backbone_consumes)
    try:
        topology = Topology(backbone=BACKBONE, consumes=tuple(sorted(backbone_consumes)), roles=tuple(
            TrainerRole(name=name, backbone=BACKBONE, produces=tuple(sorted(p)), consumes=tuple(sorted(c)))
            for name, p, c in roles))
    except InvalidArgument as error:
        assert not expected, error
        assert error.field.startswith(("roles", "consumes")), error
        return
    assert expected
    for name, _, consumed in roles:
        assert set(topology.consumed_by(f"role:{name}")) == consumed
        ConsumerId(role=f"role:{name}", dp_rank=0).check_within(topology)
    assert set(topology.consumed_by("backbone")) == backbone_consumes


@pytest.mark.parametrize("name", ["backbone", "encoder", "encoder-x", "", "a/b"])
def test_reserved_or_malformed_role_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidArgument) as error:
        TrainerRole(name=name, backbone=BACKBONE)
    assert error.value.field == "name"


def test_a_cycle_is_refused_naming_a_field_on_it() -> None:
    with pytest.raises(InvalidArgument) as error:
        Topology(backbone=BACKBONE, roles=(
            TrainerRole(name="a", backbone=BACKBONE, produces=("x",), consumes=("y",)),
            TrainerRole(name="b", backbone=BACKBONE, produces=("y",), consumes=("x",))))
    assert error.value.field in ("roles.a.consumes.y", "roles.b.consumes.x")
