"""The one rule for "bind" and "advertise": what others dial is never a wildcard."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from knittrans.addresses import WILDCARD_HOSTS, advertised_host, host_port
from knittrans.errors import InvalidArgument
from knittrans.serving.settings import ServerSettings

WILDCARDS = sorted(WILDCARD_HOSTS)
concrete_hosts = st.one_of(
    st.ip_addresses(v=4).map(str).filter(lambda h: h != "0.0.0.0"),
    st.from_regex(r"[a-z][a-z0-9-]{0,20}(\.[a-z][a-z0-9-]{0,20}){0,3}", fullmatch=True),
)


def never_called() -> str:
    raise AssertionError("resolved although the advertised host was known")


@given(bind=st.one_of(concrete_hosts, st.sampled_from(WILDCARDS)), advertise=concrete_hosts)
def test_a_given_advertise_host_wins(bind: str, advertise: str) -> None:
    assert advertised_host(bind, advertise, resolve=never_called) == advertise


@given(bind=concrete_hosts)
def test_a_concrete_bind_host_is_advertised_as_it_is(bind: str) -> None:
    assert advertised_host(bind, "", resolve=never_called) == bind


@given(bind=st.sampled_from(WILDCARDS), resolved=concrete_hosts)
def test_a_wildcard_bind_advertises_the_resolved_address(bind: str, resolved: str) -> None:
    assert advertised_host(bind, "", resolve=lambda: resolved) == resolved


@pytest.mark.parametrize("bind", WILDCARDS)
@pytest.mark.parametrize("resolved", ["", "0.0.0.0", "::"])
def test_a_wildcard_bind_that_resolves_to_nothing_dialable_names_advertise_host(bind: str, resolved: str) -> None:
    with pytest.raises(InvalidArgument) as failure:
        advertised_host(bind, "", resolve=lambda: resolved)
    assert failure.value.field == "advertise_host"


@pytest.mark.parametrize("advertise", ["0.0.0.0", "::", "[::]", "*"])
def test_a_wildcard_cannot_be_advertised(advertise: str) -> None:
    with pytest.raises(InvalidArgument) as failure:
        advertised_host("10.0.0.5", advertise)
    assert failure.value.field == "advertise_host"
    with pytest.raises(InvalidArgument):
        ServerSettings(host="0.0.0.0", advertise_host=advertise)


@given(bind=st.one_of(concrete_hosts, st.sampled_from(WILDCARDS)), advertise=st.one_of(st.just(""), concrete_hosts),
       resolved=concrete_hosts)
def test_the_advertised_host_is_never_a_wildcard(bind: str, advertise: str, resolved: str) -> None:
    assert advertised_host(bind, advertise, resolve=lambda: resolved) not in WILDCARD_HOSTS


def test_the_default_resolution_gives_a_dialable_address() -> None:
    host = advertised_host("0.0.0.0")
    assert not ipaddress.ip_address(host).is_unspecified


@given(address=st.ip_addresses(), port=st.integers(1, 65535))
def test_host_port_round_trips_through_the_last_colon(address, port: int) -> None:
    text = host_port(str(address), port)
    host, _, parsed_port = text.rpartition(":")
    assert int(parsed_port) == port
    assert ipaddress.ip_address(host.strip("[]")) == address
