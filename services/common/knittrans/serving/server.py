"""Start and stop a KnitTrans gRPC server: health, reflection, the boundary interceptor, /metrics, TLS."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry, start_http_server

from knittrans.addresses import advertised_host, host_port
from knittrans.errors import Unavailable
from knittrans.serving.interceptor import BoundaryInterceptor, RpcMetrics
from knittrans.serving.security import expected_token, server_credentials
from knittrans.serving.settings import ServerSettings

logger = logging.getLogger(__name__)

KEEPALIVE_OPTIONS = (
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
)


@dataclass
class RunningServer:
    server: aio.Server
    address: str  # what a client dials: "<advertised host>:PORT" or "unix:PATH"
    metrics_port: int | None
    health: health.aio.HealthServicer
    registry: CollectorRegistry
    _metrics_http: Any = None
    health_server: aio.Server | None = None
    health_port: int | None = None
    metrics_host: str = "127.0.0.1"  # the advertised host of the /metrics endpoint

    @property
    def metrics_url(self) -> str | None:
        if self.metrics_port is None:
            return None
        return f"http://{host_port(self.metrics_host, self.metrics_port)}/metrics"

    async def stop(self, grace: float) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
        if self.health_server is not None:
            await self.health_server.stop(0)
        if self._metrics_http is not None:
            http_server, thread = self._metrics_http
            http_server.shutdown()
            http_server.server_close()
            thread.join(timeout=5)


async def start_server(
    settings: ServerSettings,
    *,
    add_services: Callable[[aio.Server], Sequence[str]],
    registry: CollectorRegistry,
) -> RunningServer:
    """Build and start a server. ``add_services`` registers servicers and returns their full names."""
    # Before anything listens: a wildcard bind without a resolvable address is a config error, not a ready file
    # that says 0.0.0.0.
    advertise = advertised_host(settings.host, settings.advertise_host)
    metrics_host = advertised_host(settings.metrics.host, settings.advertise_host)
    interceptor = BoundaryInterceptor(token=expected_token(settings.auth), metrics=RpcMetrics(registry))
    options = [
        ("grpc.max_receive_message_length", settings.max_message_bytes),
        ("grpc.max_send_message_length", settings.max_message_bytes),
        *KEEPALIVE_OPTIONS,
    ]
    server = aio.server(interceptors=[interceptor], options=options)
    service_names = list(add_services(server))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [*service_names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME], server
    )
    target = f"unix:{settings.unix_socket}" if settings.unix_socket else f"{settings.host}:{settings.port}"
    credentials = server_credentials(settings.tls)
    try:
        port = server.add_secure_port(target, credentials) if credentials else server.add_insecure_port(target)
    except RuntimeError as exc:
        raise Unavailable(f"cannot listen on {target}: {exc}") from exc
    await server.start()
    for name in ("", *service_names):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    address = target if settings.unix_socket else host_port(advertise, port)
    health_server = None
    health_port = None
    if settings.health_port >= 0:
        # Kubelet's gRPC probes cannot speak TLS, so health alone is also served in plaintext; through the
        # same boundary, so that what reaches this port is decoded, counted and logged like everything else.
        health_server = aio.server(interceptors=[interceptor])
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, health_server)
        health_port = health_server.add_insecure_port(f"{settings.host}:{settings.health_port}")
        await health_server.start()
    metrics_http = None
    metrics_port = None
    if settings.metrics.port >= 0:
        metrics_http = start_http_server(settings.metrics.port, addr=settings.metrics.host, registry=registry)
        metrics_port = metrics_http[0].server_port
    logger.info("listening on %s (tls=%s, metrics port %s)", address, settings.tls.enabled, metrics_port)
    return RunningServer(
        server=server, address=address, metrics_port=metrics_port, health=health_servicer, registry=registry,
        _metrics_http=metrics_http, health_server=health_server, health_port=health_port, metrics_host=metrics_host,
    )


def write_ready_file(path: Path, ready: Mapping[str, Any]) -> None:
    """Announce a started server: ``ready`` as JSON at ``path``, which appears whole (written aside, then
    renamed), so a supervisor that sees the file can read it."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(ready))
    temporary.replace(path)


# After a graceful stop, how long threads still inside a blocking call may take before the process exits
# without them.
EXIT_WAIT_SECONDS = 2.0


def run_until_signalled(main: Callable[[asyncio.Event], Coroutine[Any, Any, int]]) -> int:
    """Run ``main(stop_event)`` on uvloop; SIGTERM and SIGINT set the event for a graceful shutdown. An entry
    point's: it may end the process itself (see :func:`exit_past_blocked_threads`)."""
    import uvloop

    async def runner() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        return await main(stop)

    code = uvloop.run(runner())
    exit_past_blocked_threads(code, EXIT_WAIT_SECONDS)
    return code


def exit_past_blocked_threads(code: int, wait_seconds: float) -> None:
    """Exit with ``code`` now if a thread is still inside a call ``wait_seconds`` after the graceful stop.

    The stop has already removed what the process made (segments, sockets, leases). What can be left is a store
    call into a peer that died with the job, which returns only after the store's own time-out, and Python's
    exit would join that thread first, so a stopped server would linger for it."""
    deadline = time.monotonic() + wait_seconds
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join(max(deadline - time.monotonic(), 0.0))
    blocked = [t.name for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon
               and t.is_alive()]
    if not blocked:
        return
    logger.warning("exiting with %d threads still in blocking calls after the stop: %s", len(blocked),
                   ", ".join(blocked))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
