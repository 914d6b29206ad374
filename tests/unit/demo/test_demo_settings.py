"""`knittrans demo --nodes`: one machine or the three-node layout, whose nodes share a mooncake store."""

from __future__ import annotations

import pytest

from knittrans.config import load_config
from knittrans.demo.stack.settings import DemoSettings, StoreKind
from knittrans.errors import ConfigError


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
