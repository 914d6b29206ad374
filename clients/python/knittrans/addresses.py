"""Where a server listens ("bind") and the address others dial to reach it ("advertise"): one rule for every server.

* ``bind_host`` is the local interface a server listens on: ``127.0.0.1`` (the default: this machine only), an
  interface address such as ``10.0.0.5``, or a wildcard (``0.0.0.0``, ``::``) for every interface.
* ``advertise_host`` is what goes into ready files, store URLs and metrics URLs. Given, it is used as it is (it
  must not be a wildcard). Not given, it is ``bind_host``, unless that is a wildcard: a wildcard is not an address
  anyone can dial, so the advertised host is then resolved from this machine's host name (its first address that
  is not loopback, else loopback), and a host name that resolves to nothing is an error naming
  ``advertise_host``. Where the host name maps to loopback only (a laptop), set ``advertise_host`` before other
  machines are to reach the server.

So no ready file, store URL or metrics URL ever says ``0.0.0.0``.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable

from knittrans.errors import InvalidArgument

WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]", "*"})


def is_wildcard(host: str) -> bool:
    return host.strip() in WILDCARD_HOSTS


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def advertised_host(bind_host: str, advertise_host: str = "", *, resolve: Callable[[], str] | None = None) -> str:
    """The host others dial for a server bound to ``bind_host`` (see the module docstring for the rule).

    ``resolve`` returns this machine's routable address; it is called only when ``bind_host`` is a wildcard and
    no ``advertise_host`` is given (default: :func:`resolve_host_address`).
    """
    if advertise_host:
        if is_wildcard(advertise_host):
            raise InvalidArgument(f"{advertise_host!r} is not an address anyone can dial", field="advertise_host")
        return advertise_host
    if not is_wildcard(bind_host):
        return bind_host
    resolved = (resolve or resolve_host_address)()
    if not resolved or is_wildcard(resolved):
        raise InvalidArgument(
            f"the server binds {bind_host or 'every interface'!r} and this machine's address could not be resolved; "
            "give the address other machines dial",
            field="advertise_host",
        )
    return resolved


def resolve_host_address() -> str:
    """This machine's address by its host name (Kubernetes maps the pod name to the pod IP): the first one that is
    not loopback, else the first one, or "" when the name resolves to nothing."""
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, family=socket.AF_INET, type=socket.SOCK_STREAM)
    except OSError:
        return ""
    hosts = [str(address[0]) for *_, address in infos]
    return next((h for h in hosts if not is_loopback(h)), hosts[0] if hosts else "")


def host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 literal in brackets."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"
