"""Servers bound to every interface advertise an address clients can dial: never 0.0.0.0 in an address, a ready
file or a metrics URL (the rule of knittrans.addresses), through real servers on port 0."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from knittrans.launch.redis import start_redis
from knittrans.serving.server import start_server
from knittrans.serving.settings import MetricsSettings, ServerSettings

ADMISSION_CONFIG = """
job: advertised
engine: {train_batch_size: 8, num_minibatches: 2, sources: {A: 0.5, B: 0.5}}
topology: {backbone: {dp: 1, cp: 1, max_tokens_per_microbatch: 4096}}
"""


def serving(target: str) -> bool:
    with grpc.insecure_channel(target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def scrape(url: str) -> str:
    return urllib.request.urlopen(url, timeout=5).read().decode()


@pytest.mark.parametrize("advertise", ["", "localhost"])
async def test_a_wildcard_server_advertises_a_dialable_address(advertise: str) -> None:
    settings = ServerSettings(host="0.0.0.0", advertise_host=advertise, metrics=MetricsSettings(host="0.0.0.0"))
    running = await start_server(settings, add_services=lambda server: [], registry=CollectorRegistry())
    try:
        host = running.address.rpartition(":")[0]
        assert host not in ("0.0.0.0", "")
        if advertise:
            assert host == advertise
        assert "0.0.0.0" not in (running.metrics_url or "")
        assert await asyncio.to_thread(serving, running.address)
        assert "knittrans_rpc_latency_seconds" in await asyncio.to_thread(scrape, running.metrics_url)
    finally:
        await running.stop(0)


def test_admission_serve_on_every_interface_writes_a_dialable_ready_file(tmp_path: Path) -> None:
    config = tmp_path / "admission.yaml"
    config.write_text(ADMISSION_CONFIG)
    ready = tmp_path / "ready.json"
    process = subprocess.Popen(
        [sys.executable, "-m", "knittrans.cli", "admission", "serve", "--config", str(config), "--host", "0.0.0.0",
         "--advertise-host", "localhost", "--port", "0", "--metrics-port", "0", "--ready-file", str(ready)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**os.environ, "KNITTRANS_SERVER__METRICS__HOST": "0.0.0.0"},
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert process.poll() is None, process.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "not ready after 60 s"
            time.sleep(0.1)
        info = json.loads(ready.read_text())
        assert "0.0.0.0" not in ready.read_text()
        assert info["address"].startswith("localhost:")
        assert info["metrics_url"].startswith("http://localhost:")
        assert serving(info["address"])
        assert "knittrans" in scrape(info["metrics_url"])
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def test_redis_bound_to_every_interface_has_a_dialable_url(tmp_path: Path) -> None:
    server = start_redis(tmp_path / "redis", bind_host="0.0.0.0", advertise_host="localhost")
    try:
        assert urlsplit(server.url).hostname == "localhost"
        import redis

        assert redis.Redis.from_url(server.url).ping()
    finally:
        server.stop()
