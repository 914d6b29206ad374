"""Channels to KnitTrans services: TLS, bearer token, deadlines, and status codes mapped back to errors."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import grpc
from grpc import aio

from knittrans.errors import (
    FIELD_TRAILER,
    ConfigError,
    DeadlineExceeded,
    InvalidArgument,
    KnitTransError,
    Unavailable,
    error_class_for_status,
)
from knittrans.retry import RetryPolicy, retry_call

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
Response = TypeVar("Response")

_RETRYABLE = (Unavailable, DeadlineExceeded)


@dataclass(frozen=True, kw_only=True)
class ClientTlsSettings:
    ca_file: str = ""
    cert_file: str = ""  # with key_file: a client certificate for mTLS
    key_file: str = ""
    server_name: str = ""  # overrides the name checked against the server certificate

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise InvalidArgument("cert_file and key_file must be set together", field="cert_file")

    @property
    def enabled(self) -> bool:
        return bool(self.ca_file or self.cert_file)


@dataclass(frozen=True, kw_only=True)
class ConnectionSettings:
    """How a client reaches a service: ``host:port`` or ``unix:/path``."""

    target: str
    token: str = ""
    token_file: str = ""
    tls: ClientTlsSettings = field(default_factory=ClientTlsSettings)
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES

    def __post_init__(self) -> None:
        if not self.target:
            raise InvalidArgument("must name host:port or unix:/path", field="target")
        if self.token and self.token_file:
            raise InvalidArgument("set token or token_file, not both", field="token_file")

    def resolved_token(self) -> str:
        if self.token_file:
            try:
                return Path(self.token_file).read_text().strip()
            except OSError as exc:
                raise ConfigError(f"cannot read {self.token_file}: {exc.strerror}", field="token_file") from exc
        return self.token

    def call_metadata(self) -> tuple[tuple[str, str], ...]:
        token = self.resolved_token()
        return (("authorization", f"Bearer {token}"),) if token else ()


def _options(settings: ConnectionSettings) -> list[tuple[str, Any]]:
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", settings.max_message_bytes),
        ("grpc.max_send_message_length", settings.max_message_bytes),
        ("grpc.keepalive_time_ms", 20_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
    ]
    if settings.tls.server_name:
        options.append(("grpc.ssl_target_name_override", settings.tls.server_name))
    return options


def _credentials(tls: ClientTlsSettings) -> grpc.ChannelCredentials:
    def read(path: str, name: str) -> bytes | None:
        if not path:
            return None
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc.strerror}", field=f"tls.{name}") from exc

    return grpc.ssl_channel_credentials(
        root_certificates=read(tls.ca_file, "ca_file"),
        private_key=read(tls.key_file, "key_file"),
        certificate_chain=read(tls.cert_file, "cert_file"),
    )


def open_channel(settings: ConnectionSettings) -> grpc.Channel:
    if settings.tls.enabled:
        return grpc.secure_channel(settings.target, _credentials(settings.tls), options=_options(settings))
    return grpc.insecure_channel(settings.target, options=_options(settings))


def open_aio_channel(settings: ConnectionSettings) -> aio.Channel:
    if settings.tls.enabled:
        return aio.secure_channel(settings.target, _credentials(settings.tls), options=_options(settings))
    return aio.insecure_channel(settings.target, options=_options(settings))


def error_from_rpc(error: grpc.RpcError) -> KnitTransError:
    """Map a failed call back to the same :class:`KnitTransError` class the server raised."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    field_name = None
    trailers = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    for key, value in trailers or ():
        if key == FIELD_TRAILER:
            field_name = value.decode() if isinstance(value, bytes) else value
    message = details or code.name
    if field_name and message.startswith(f"{field_name}: "):
        message = message[len(field_name) + 2 :]
    return error_class_for_status(code.name)(message, field=field_name)


def call(
    rpc: Callable[..., Response], request: Any, *, deadline: timedelta, metadata: tuple[tuple[str, str], ...] = ()
) -> Response:
    """One unary call with a deadline; failures raise the matching :class:`KnitTransError`."""
    try:
        return rpc(request, timeout=deadline.total_seconds(), metadata=metadata)
    except grpc.RpcError as error:
        raise error_from_rpc(error) from None


# The SDK's one set of retry rules, for every client of a KnitTrans service (the sync and async admission
# clients, the reorg sidecar's assignment source, the trainer client's sidecar calls). A call is retried when it
# failed with one of these codes: the peer is not there yet or any more (UNAVAILABLE), did not answer in time
# (DEADLINE_EXCEEDED), or is stopping and cancelled the calls it had (CANCELLED; a call this process cancels
# itself ends the caller instead). Others, RESOURCE_EXHAUSTED included (a message over the size limit), would fail
# the same way again. Only idempotent calls are retried; every unary call of the services is.
RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                             grpc.StatusCode.CANCELLED})
# Idempotent calls: retried while the service is unavailable (not started yet, restarting) for up to 30 s.
UNARY_RETRY = RetryPolicy(initial=0.05, cap=2.0, deadline=30.0, jitter=0.5)


def call_with_retry(
    rpc: Callable[..., Response],
    request: Any,
    *,
    deadline: timedelta,
    metadata: tuple[tuple[str, str], ...] = (),
    attempts_for: timedelta = timedelta(seconds=30),
    sleep: Callable[[float], None] = time.sleep,
) -> Response:
    """Retry idempotent calls on UNAVAILABLE / DEADLINE_EXCEEDED with jittered exponential back-off."""
    return retry_call(
        lambda: call(rpc, request, deadline=deadline, metadata=metadata),
        policy=replace(UNARY_RETRY, deadline=attempts_for.total_seconds()),
        retryable=lambda error: isinstance(error, _RETRYABLE), sleep=sleep,
    )
