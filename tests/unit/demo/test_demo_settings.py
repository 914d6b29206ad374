"""`knittrans demo --nodes`: one machine or the three-node layout, whose nodes share a mooncake store."""

from __future__ import annotations

import pytest

from knittrans.config import load_config
from knittrans.demo.stack.settings import DemoSettings, StoreKind
from knittrans.errors import ConfigError, InvalidArgument


@pytest.mark.parametrize("nodes", [0, 2, 4])
def test_only_one_machine_or_the_three_node_layout(nodes: int) -> None:
    with pytest.raises(ConfigError) as failure:
        load_config(DemoSettings, env={}, flags={"nodes": nodes, "store": "mooncake"})
    assert failure.value.field == "nodes"


def test_several_nodes_refuse_a_node_local_file_store() -> None:
    with pytest.raises(ConfigError) as failure:
        load_config(DemoSettings, env={}, flags={"nodes": 3, "store": "file"})
    assert failure.value.field == "store"


def test_the_three_node_layout_with_mooncake() -> None:
    settings = load_config(DemoSettings, env={}, flags={"nodes": 3, "store": "mooncake"})
    assert settings.nodes == 3 and settings.store is StoreKind.MOONCAKE


@pytest.mark.parametrize("roles", [["actor"], ["reference", "actor"], ["actor", "reference"]])
def test_the_roles_are_the_actor_alone_or_with_the_reference(roles: list[str]) -> None:
    settings = load_config(DemoSettings, env={}, flags={"roles": roles})
    assert [str(role) for role in settings.roles] == [r for r in ("reference", "actor") if r in roles]
    assert settings.with_reference == ("reference" in roles)


def test_the_default_is_todays_demo_the_actor_alone() -> None:
    settings = load_config(DemoSettings, env={})
    assert [str(role) for role in settings.roles] == ["actor"] and not settings.with_reference


@pytest.mark.parametrize("roles", [["reference"], ["critic", "actor"], ["actor", "actor"], [],
                                   ["reference", "actor", "reference"], "reference,actor"])
def test_other_roles_are_refused_naming_roles(roles: object) -> None:
    with pytest.raises(InvalidArgument) as failure:
        load_config(DemoSettings, env={}, flags={"roles": roles})
    assert failure.value.field == "roles"


def test_the_roles_come_from_the_config_file_too(tmp_path) -> None:
    path = tmp_path / "demo.yaml"
    path.write_text("roles: [reference, actor]\nreference_dp: 2\n")
    settings = load_config(DemoSettings, path=path, env={})
    assert settings.with_reference and settings.reference_dp == 2


def test_the_chaos_run_has_no_reference() -> None:
    with pytest.raises(InvalidArgument) as failure:
        load_config(DemoSettings, env={}, flags={"roles": ["reference", "actor"], "chaos.seed": 3,
                                                 "state": "redis", "store": "mooncake"})
    assert failure.value.field == "roles"
