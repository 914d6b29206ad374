"""Which consumers a sidecar process hosts (``consumers`` / ``--consumers``): parsed from role:dp:cp, each once,
each with settings of its own."""

from __future__ import annotations

import pytest

from knittrans.errors import InvalidArgument
from knittrans.reorg.node_host import hosted_settings
from knittrans.reorg.settings import ReorgSettings, parse_consumer
from knittrans.serving.settings import MetricsSettings, ServerSettings
from knittrans.types import ConsumerId


@pytest.mark.parametrize(("text", "expected"), [
    ("backbone:0:1", ConsumerId(role="backbone", dp_rank=0, cp_rank=1)),
    ("encoder:vision:3:0", ConsumerId(role="encoder:vision", dp_rank=3, cp_rank=0)),
    ("role:critic:12:7", ConsumerId(role="role:critic", dp_rank=12, cp_rank=7)),
])
def test_a_consumer_is_read_from_role_dp_cp(text: str, expected: ConsumerId) -> None:
    assert parse_consumer(text) == expected


@pytest.mark.parametrize("text", ["backbone", "backbone:0", "backbone:x:0", ":0:0", "backbone:-1:0", "nope:0:0"])
def test_a_malformed_consumer_names_the_field(text: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        ReorgSettings(store="file:///dev/shm/x", consumers=("backbone:0:0", text))
    assert raised.value.field == "consumers[1]"


def test_hosted_consumers_keep_their_order_and_each_gets_its_own_settings() -> None:
    settings = ReorgSettings(store="file:///dev/shm/x", job="j", consumers=("backbone:1:1", "encoder:vision:1:0"),
                             server=ServerSettings(metrics=MetricsSettings(port=9402), health_port=9403))
    first, second = settings.hosted_consumers
    assert (first, second) == (ConsumerId(role="backbone", dp_rank=1, cp_rank=1),
                               ConsumerId(role="encoder:vision", dp_rank=1))
    own = [hosted_settings(settings, c, i == 0) for i, c in enumerate(settings.hosted_consumers)]
    assert [s.consumer for s in own] == [first, second]
    assert own[0].socket_path != own[1].socket_path and own[0].segment_prefix != own[1].segment_prefix
    # One process, one probe port and one configured metrics port; the others' metrics on free ports.
    assert (own[0].server.metrics.port, own[0].server.health_port) == (9402, 9403)
    assert (own[1].server.metrics.port, own[1].server.health_port) == (0, -1)
    assert ReorgSettings(store="file:///dev/shm/x").hosted_consumers == (ConsumerId(role="backbone", dp_rank=0),)


@pytest.mark.parametrize(("consumers", "server", "field"), [
    (("backbone:0:0", "backbone:0:0"), ServerSettings(), "consumers"),
    (("backbone:0:0", "backbone:0:1"), ServerSettings(unix_socket="/tmp/one.sock"), "server.unix_socket"),
])
def test_hosting_refuses_what_cannot_work(consumers: tuple[str, ...], server: ServerSettings, field: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        ReorgSettings(store="file:///dev/shm/x", consumers=consumers, server=server)
    assert raised.value.field == field
