"""Config sections shared by every KnitTrans server (loaded through :mod:`knittrans.config`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from knittrans.addresses import is_wildcard
from knittrans.errors import InvalidArgument

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class TlsSettings:
    """Server TLS. Setting ``client_ca_file`` turns on mTLS: clients must present a certificate."""

    cert_file: str = ""
    key_file: str = ""
    client_ca_file: str = ""

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise InvalidArgument("cert_file and key_file must be set together", field="cert_file")
        if self.client_ca_file and not self.cert_file:
            raise InvalidArgument("mTLS needs the server's own cert_file and key_file", field="client_ca_file")

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file)


@dataclass(frozen=True, kw_only=True)
class AuthSettings:
    """An optional bearer token required on every RPC except the standard health service."""

    token: str = ""
    token_file: str = ""

    def __post_init__(self) -> None:
        if self.token and self.token_file:
            raise InvalidArgument("set token or token_file, not both", field="token_file")


@dataclass(frozen=True, kw_only=True)
class MetricsSettings:
    host: str = "127.0.0.1"
    port: int = 0  # 0 picks a free port; -1 disables the /metrics endpoint

    def __post_init__(self) -> None:
        if not -1 <= self.port <= 65535:
            raise InvalidArgument("must be a port number, 0 for any, or -1 to disable", field="port")


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """Where and how a gRPC server listens. ``unix_socket`` replaces host:port when set.

    ``host`` is the bind address; ``advertise_host`` the address written into ready files and metrics URLs
    (default: ``host``, or this machine's resolved address when ``host`` is a wildcard; see
    :mod:`knittrans.addresses`). It also stands for a wildcard ``metrics.host``.
    """

    host: str = "127.0.0.1"
    advertise_host: str = ""
    port: int = 0
    unix_socket: str = ""
    # A plaintext port serving only grpc.health.v1, for kubelet probes when the main port uses TLS; -1: none.
    health_port: int = -1
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    grace_seconds: float = 5.0
    tls: TlsSettings = field(default_factory=TlsSettings)
    auth: AuthSettings = field(default_factory=AuthSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise InvalidArgument("must be a port number or 0", field="port")
        if not -1 <= self.health_port <= 65535:
            raise InvalidArgument("must be a port number, 0 for any, or -1 for none", field="health_port")
        if self.max_message_bytes < 1024:
            raise InvalidArgument("must be at least 1024", field="max_message_bytes")
        if self.grace_seconds < 0:
            raise InvalidArgument("must not be negative", field="grace_seconds")
        if self.advertise_host and is_wildcard(self.advertise_host):
            raise InvalidArgument("must be an address others can dial, not a wildcard", field="advertise_host")
