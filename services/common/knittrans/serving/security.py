"""Server credentials and the bearer-token check."""

from __future__ import annotations

import hmac
from pathlib import Path

import grpc

from knittrans.errors import ConfigError
from knittrans.serving.settings import AuthSettings, TlsSettings

HEALTH_SERVICE_PREFIX = "/grpc.health.v1.Health/"
AUTHORIZATION_HEADER = "authorization"


def _read(path: str, field: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}", field=field) from exc


def server_credentials(tls: TlsSettings) -> grpc.ServerCredentials | None:
    if not tls.enabled:
        return None
    key = _read(tls.key_file, "tls.key_file")
    cert = _read(tls.cert_file, "tls.cert_file")
    if tls.client_ca_file:
        return grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=_read(tls.client_ca_file, "tls.client_ca_file"),
            require_client_auth=True,
        )
    return grpc.ssl_server_credentials([(key, cert)])


def expected_token(auth: AuthSettings) -> str:
    if auth.token_file:
        return _read(auth.token_file, "auth.token_file").decode().strip()
    return auth.token


def token_matches(metadata: tuple[tuple[str, str | bytes], ...] | None, token: str) -> bool:
    """Constant-time comparison of ``authorization: Bearer <token>``."""
    for key, value in metadata or ():
        if key == AUTHORIZATION_HEADER:
            presented = value.decode() if isinstance(value, bytes) else value
            return hmac.compare_digest(presented.encode(), f"Bearer {token}".encode())
    return False
