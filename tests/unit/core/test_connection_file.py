"""The connection file of `knittrans up`: typed and versioned, found through the config loader, read by from_env."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from knittrans.config import connection_file_path, load_config
from knittrans.connect import load_connection
from knittrans.connection_file import SidecarEndpoint, StackConnection, read_connection_file, write_connection_file
from knittrans.errors import ConfigError, NotFound
from knittrans.rollout import RolloutClient
from knittrans.stack.up import consumer_ranks
from knittrans.types import BackboneTopology, ConsumerId, EncoderTopology, Topology


def connection() -> StackConnection:
    sidecars = tuple(SidecarEndpoint(role="backbone", dp_rank=d, socket=f"unix:/tmp/{d}.sock", global_ranks=(d,))
                     for d in (0, 1))
    return StackConnection(job="j", pid=1, admission="127.0.0.1:1", store="file:///dev/shm/knittrans-j/units",
                           world_size=2, sidecars=sidecars)


def test_a_written_file_reads_back_equal(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "c.json"
    write_connection_file(path, connection())
    assert read_connection_file(path) == connection()
    assert path.stat().st_mode & 0o077 == 0
    assert [p.name for p in path.parent.iterdir()] == ["c.json"]  # no temporary file left


@pytest.mark.parametrize(("change", "field"), [
    ({"bogus": 1}, "bogus"),
    ({"version": 2}, "version"),
    ({"kind": "something.else"}, "kind"),
    ({"admission": ""}, "admission"),
])
def test_a_foreign_or_newer_file_is_refused_naming_the_key(tmp_path: Path, change: dict, field: str) -> None:
    data = {**json.loads(connection().to_json()), **change}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as error:
        read_connection_file(path)
    assert error.value.field == field


def test_an_unknown_sidecar_key_is_named(tmp_path: Path) -> None:
    data = json.loads(connection().to_json())
    data["sidecars"][1]["port"] = 3
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as error:
        read_connection_file(path)
    assert error.value.field == "sidecars[1].port"


def test_the_path_is_the_argument_then_the_variable_then_the_default() -> None:
    env = {"KNITTRANS_CONNECTION_FILE": "/x/from-env.json"}
    assert connection_file_path("given.json", env=env) == Path("given.json")
    assert connection_file_path(env=env) == Path("/x/from-env.json")
    assert connection_file_path(env={}) == Path("knittrans-connection.json")


def test_the_variable_is_no_config_key_of_other_commands() -> None:
    """With KNITTRANS_CONNECTION_FILE exported, every other command still loads its config."""
    from knittrans.launch.cli import MooncakeMasterSettings

    settings = load_config(MooncakeMasterSettings, env={"KNITTRANS_CONNECTION_FILE": "/x.json"})
    assert settings == MooncakeMasterSettings()


def test_a_rank_finds_its_sidecar_and_tp_rank() -> None:
    both = StackConnection(job="j", admission="h:1", store="file://", world_size=4, sidecars=(
        SidecarEndpoint(role="backbone", dp_rank=0, socket="unix:/a", global_ranks=(0, 1)),
        SidecarEndpoint(role="backbone", dp_rank=1, socket="unix:/b", global_ranks=(2, 3)),
        SidecarEndpoint(role="encoder:vision", dp_rank=0, socket="unix:/e", global_ranks=(0,)),
    ))
    assert both.sidecar_for(3) == (both.sidecars[1], 1)
    assert both.sidecar_for(0, "encoder:vision") == (both.sidecars[2], 0)
    with pytest.raises(NotFound, match="no encoder:vision sidecar serves global rank 1"):
        both.sidecar_for(1, "encoder:vision")


def test_from_env_waits_for_the_file_and_then_fails_naming_knittrans_up(tmp_path: Path) -> None:
    path = tmp_path / "late.json"
    timer = threading.Timer(0.3, write_connection_file, args=(path, connection()))
    timer.start()
    try:
        assert load_connection(path, wait_seconds=30) == connection()
    finally:
        timer.cancel()
    started = time.monotonic()
    with pytest.raises(NotFound, match="knittrans up"):
        RolloutClient.from_env(connection_file=tmp_path / "never.json", wait_seconds=0.2)
    assert time.monotonic() - started < 30


@given(dp=st.integers(1, 4), cp=st.integers(1, 3), tp=st.integers(1, 3), encoder_dp=st.integers(1, 4),
       encoder_tp=st.integers(1, 2))
def test_ranks_follow_megatron_order(dp: int, cp: int, tp: int, encoder_dp: int, encoder_tp: int) -> None:
    """Global rank r is TP rank r % tp of backbone (dp, cp) = (r // (cp·tp), (r // tp) % cp): an oracle from
    the rank's side, against the mapping built from the consumers' side."""
    encoders = (EncoderTopology(name="v", dp=encoder_dp, tp=encoder_tp, max_cost_per_microbatch=4),)
    topology = Topology(backbone=BackboneTopology(dp=dp, cp=cp, tp=tp, max_tokens_per_microbatch=64),
                        encoders=encoders)
    consumers = tuple(ConsumerId(role="backbone", dp_rank=d, cp_rank=c) for d in range(dp) for c in range(cp)) + \
        tuple(ConsumerId(role="encoder:v", dp_rank=d) for d in range(encoder_dp))
    ranks = consumer_ranks(topology, consumers)
    for rank in range(dp * cp * tp):
        owner = ConsumerId(role="backbone", dp_rank=rank // (cp * tp), cp_rank=(rank // tp) % cp)
        assert ranks[owner][rank % tp] == rank
    backbone_ranks = sorted(r for c, rs in ranks.items() if c.role == "backbone" for r in rs)
    assert backbone_ranks == list(range(dp * cp * tp))
    encoder_ranks = sorted(r for c, rs in ranks.items() if c.role == "encoder:v" for r in rs)
    assert encoder_ranks == list(range(encoder_dp * encoder_tp))
