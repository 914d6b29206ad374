"""podman, configured as `make image` configures it, for the container tests.

Every podman command runs with CONTAINERS_CONF pointing at deploy/podman/containers.conf (runc, rlimits
below the host's own, no systemd), so the tests run containers exactly as `make image` built them.
Containers are reached without host ports chosen by the test: `podman run` publishes to free loopback
ports podman picks, and pods of `podman kube play` are reached at their IP on podman's bridge.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from knittrans.config import environment
from tests.deploy.tools import DEPLOY, ROOT

CONTAINERS_CONF = DEPLOY / "podman" / "containers.conf"
READY_TIMEOUT_S = 120.0
COMMAND_TIMEOUT_S = 180.0


def image_name() -> str:
    """The image `make image` builds (its IMAGE), as podman stores a local build."""
    makefile = (ROOT / "Makefile").read_text()
    match = re.search(r"^IMAGE\s*:=\s*(\S+)$", makefile, re.MULTILINE)
    assert match is not None, "the Makefile defines no IMAGE"
    return f"localhost/{match.group(1)}"


def podman(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        ["podman", *args], input=stdin, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
        env={**environment(), "CONTAINERS_CONF": str(CONTAINERS_CONF)},
    )
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited with {result.returncode}:\n{result.stderr}")
    return result


def unavailable_reason() -> str | None:
    """Why podman cannot run the container tests here, or None when it can."""
    if shutil.which("podman") is None:
        return "podman is not installed (`make test-container` installs it and builds the image)"
    if os.geteuid() != 0:
        return "the container tests need root: pods are reached on podman's bridge network (sudo make test-container)"
    info = podman("info", "--format", "{{.Host.OCIRuntime.Name}}", check=False)
    if info.returncode != 0:
        return f"podman cannot run here: {info.stderr.strip()}"
    if podman("image", "exists", image_name(), check=False).returncode != 0:
        return f"{image_name()} is not built: run `make image` (`make test-container` builds it, then runs these)"
    return None


def container_logs(container: str) -> str:
    result = podman("logs", "--tail", "40", container, check=False)
    return result.stdout + result.stderr


def container_running(container: str) -> bool:
    result = podman("inspect", "--format", "{{.State.Running}}", container, check=False)
    return result.returncode == 0 and result.stdout.strip() == "true"


def published_address(container: str, container_port: int) -> str:
    """The loopback host:port podman published ``container_port`` to."""
    output = podman("port", container, f"{container_port}/tcp").stdout.strip()
    host, _, port = output.splitlines()[0].rpartition(":")
    return f"{host}:{port}"


def pod_ip(pod: str) -> str:
    infra = podman("pod", "inspect", "--format", "{{.InfraContainerID}}", pod).stdout.strip()
    networks = json.loads(podman("inspect", "--format", "{{json .NetworkSettings.Networks}}", infra).stdout)
    addresses = [n["IPAddress"] for n in networks.values() if n.get("IPAddress")]
    assert addresses, f"pod {pod} has no address on a podman network: {networks}"
    return addresses[0]


def health_status(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        request = health_pb2.HealthCheckRequest()
        return health_pb2_grpc.HealthStub(channel).Check(request, timeout=5).status


def wait_until_serving(address: str, container: str) -> None:
    """Poll the gRPC health service as a kubelet startup probe would, until SERVING or the container exits."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    last_error = ""
    while time.monotonic() < deadline:
        if not container_running(container):
            raise AssertionError(f"{container} is not running:\n{container_logs(container)}")
        try:
            if health_status(address) == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.RpcError as error:
            last_error = str(error.code())
        time.sleep(0.5)
    raise AssertionError(
        f"{container} was not SERVING at {address} in {READY_TIMEOUT_S:.0f} s ({last_error}):\n"
        f"{container_logs(container)}"
    )


@dataclass(frozen=True, kw_only=True)
class ProcessSecurity:
    """What the kernel says about the container's main process and its file systems."""

    uid: tuple[int, ...]
    gid: tuple[int, ...]
    effective_capabilities: int
    bounding_capabilities: int
    no_new_privileges: bool
    root_read_only: bool
    tmp_writable: bool
    tmp_filesystem: str


def process_security(container: str) -> ProcessSecurity:
    """Read /proc/1/status and try writes as the container's own user, from inside the container."""
    status = dict(
        line.split(":", 1)
        for line in podman("exec", container, "cat", "/proc/1/status").stdout.splitlines()
        if ":" in line
    )
    # The last entry for a mount point is the one in effect: (file system type, options).
    mounts = {
        fields[1]: (fields[2], fields[3].split(","))
        for fields in (line.split() for line in podman("exec", container, "cat", "/proc/1/mounts").stdout.splitlines())
    }
    tmp_write = podman("exec", container, "sh", "-c", "echo x > /tmp/written && rm /tmp/written", check=False)
    return ProcessSecurity(
        uid=tuple(int(v) for v in status["Uid"].split()),
        gid=tuple(int(v) for v in status["Gid"].split()),
        effective_capabilities=int(status["CapEff"].strip(), 16),
        bounding_capabilities=int(status["CapBnd"].strip(), 16),
        no_new_privileges=status["NoNewPrivs"].strip() == "1",
        # A write probe would not tell: the image's files belong to root, so uid 10001 cannot write them anyway.
        root_read_only="ro" in mounts["/"][1],
        tmp_writable=tmp_write.returncode == 0,
        tmp_filesystem=mounts["/tmp"][0] if "/tmp" in mounts else "",
    )
