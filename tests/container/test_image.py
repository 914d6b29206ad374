"""The service image, run for real: with the admission pod's security settings under `podman run`, and as the
rendered dev overlay under `podman kube play`. Each serves gRPC health, /metrics and a report → assignment
exchange, as the manifest's own user, with no capabilities and a read-only root.

`make test-container` builds the image (`make image`) and runs these; without podman, root or the image they
skip and say why.
"""

from __future__ import annotations

import base64
import json
import posixpath
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from knittrans.client.admission import AdmissionClient
from knittrans.client.connection import ConnectionSettings
from knittrans.errors import Unauthenticated
from tests.container.exchange import REPORTED, report_and_watch, scrape
from tests.container.podman import (
    container_logs,
    image_name,
    pod_ip,
    podman,
    process_security,
    published_address,
    wait_until_serving,
)
from tests.deploy.container_config import ContainerConfig, resolve
from tests.deploy.k8s_objects import PodTemplate, container_port_names, only, pod_templates
from tests.deploy.tools import render

pytestmark = [pytest.mark.container, pytest.mark.usefixtures("podman_ready")]

DEV = "overlays/dev"
WORKLOAD = "Deployment/knittrans-admission"
CONTAINER = "admission"
TOKEN_ENV = "KNITTRANS_SERVER__AUTH__TOKEN"


def dev_admission() -> tuple[list[dict[str, Any]], PodTemplate, ContainerConfig]:
    objects = render(DEV)
    template = next(t for t in pod_templates(objects) if t.name == WORKLOAD)
    return objects, template, resolve(objects, template, CONTAINER)


def check_service(*, container: str, grpc_address: str, metrics_address: str, config: ContainerConfig,
                  uid: int, gid: int, tmp_filesystem: str | None) -> None:
    """What a kubelet and the job's clients see of a running admission container (``tmp_filesystem``: the
    type /tmp must be mounted with; None for any separate mount)."""
    wait_until_serving(grpc_address, container)

    security = process_security(container)
    assert security.uid == (uid,) * 4 and security.gid == (gid,) * 4, security
    assert security.effective_capabilities == 0 and security.bounding_capabilities == 0, security
    assert security.no_new_privileges, security
    assert security.root_read_only, "the root file system is mounted read-write"
    assert security.tmp_writable and security.tmp_filesystem, security
    assert tmp_filesystem is None or security.tmp_filesystem == tmp_filesystem, security

    # The token reached the service: a call without it is refused, one with it is served.
    with AdmissionClient(ConnectionSettings(target=grpc_address)) as anonymous, pytest.raises(Unauthenticated):
        anonymous.status()
    exchange = report_and_watch(grpc_address, config.env[TOKEN_ENV])
    assert exchange.accepted == REPORTED

    engine = yaml.safe_load(config.config_text)["engine"]
    minibatch_size = engine["train_batch_size"] // engine["num_minibatches"]
    assert exchange.admitted_total >= minibatch_size
    (trajectory_ids,) = {frozenset(a.trajectory_ids) for a in exchange.first_assignments.values()}
    assert len(trajectory_ids) == minibatch_size and trajectory_ids <= exchange.reported
    for assignment in exchange.first_assignments.values():
        assert (assignment.sequence, assignment.minibatch_index) == (1, 0)
        assert assignment.num_minibatches == engine["num_minibatches"]
    # Every admitted trajectory goes to exactly one DP rank (CP is 1 in the dev job).
    assert exchange.trained_per_trajectory() == dict.fromkeys(trajectory_ids, 1)

    samples = scrape(metrics_address)
    assert samples[("knittrans_admission_reports_total", (("outcome", "accepted"),))] == REPORTED


def run_flags(template: PodTemplate, container: Mapping[str, Any]) -> tuple[list[str], int, int]:
    """`podman run` flags for the pod's and the container's securityContext, and the uid and gid they set."""
    pod, own = template.spec["securityContext"], container["securityContext"]
    uid, gid = int(pod["runAsUser"]), int(pod["runAsGroup"])
    assert pod["runAsNonRoot"] and uid != 0
    flags = ["--user", f"{uid}:{gid}"]
    if own["readOnlyRootFilesystem"]:
        # Only what the pod mounts is writable: no tmpfs podman would add on /run, /var/tmp.
        flags += ["--read-only", "--read-only-tmpfs=false"]
    if own["allowPrivilegeEscalation"] is False:
        flags += ["--security-opt", "no-new-privileges"]
    flags += [f"--cap-drop={c}" for c in own["capabilities"]["drop"]]
    assert not own.get("capabilities", {}).get("add") and not own.get("privileged")
    return flags, uid, gid


def test_the_image_serves_with_the_pods_security_settings(tmp_path: Path) -> None:
    _objects, template, config = dev_admission()
    container = template.container(CONTAINER)
    flags, uid, gid = run_flags(template, container)
    ports = container_port_names(container)
    tmp_size = template.volume("tmp")["emptyDir"]["sizeLimit"]
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    (config_dir / posixpath.basename(config.config_path)).write_text(config.config_text)
    config_dir.chmod(0o755)
    name = f"knittrans-test-{uuid.uuid4().hex[:8]}"
    command = [
        "run", "--detach", "--name", name, *flags,
        "--tmpfs", f"/tmp:rw,nosuid,nodev,size={tmp_size.removesuffix('i').lower()}",
        "--volume", f"{config_dir}:{posixpath.dirname(config.config_path)}:ro",
        *[f"--env={key}={value}" for key, value in config.env.items()],
        # Free loopback ports, chosen by podman.
        "--publish", f"127.0.0.1::{ports['grpc']}", "--publish", f"127.0.0.1::{ports['metrics']}",
        image_name(), *config.args,
    ]
    try:
        podman(*command)
        check_service(
            container=name, grpc_address=published_address(name, ports["grpc"]),
            metrics_address=published_address(name, ports["metrics"]), config=config, uid=uid, gid=gid,
            tmp_filesystem="tmpfs",
        )
    finally:
        podman("rm", "--force", "--time", "0", name, check=False)


def suffixed(name: str, suffix: str) -> str:
    return f"{name}-{suffix}"


def playable_dev_overlay(
    objects: list[dict[str, Any]], *, suffix: str, host_shm: Path
) -> tuple[list[dict[str, Any]], dict[str, dict[str, str]]]:
    """The rendered dev overlay as `podman kube play` takes it, and the Secrets to create beforehand.

    Three changes, all outside the image and the pod spec it runs with:
    - names carry a per-test suffix, so a leftover of an earlier run cannot collide;
    - podman 4.3 stores a Secret that `kube play` creates as YAML but parses it as JSON when a
      `secretKeyRef` reads it ("secret ... is not valid JSON"). The Secrets are left out of the play and
      created with `podman secret create` in the form its reader parses: a JSON object of key → base64;
    - the node's /dev/shm (the dev overlay's hostPath) is a private directory, so the test leaves the
      host's own /dev/shm alone.
    """
    workload = only(objects, "Deployment", WORKLOAD.split("/")[1])
    spec = workload["spec"]["template"]["spec"]
    secrets: dict[str, dict[str, str]] = {}
    renamed: dict[tuple[str, str], str] = {}
    for volume in spec["volumes"]:
        if "configMap" in volume:
            renamed[("ConfigMap", volume["configMap"]["name"])] = volume["configMap"]["name"] = suffixed(
                volume["configMap"]["name"], suffix)
        if "hostPath" in volume:
            volume["hostPath"]["path"] = str(host_shm)
    for container in spec["containers"]:
        for entry in container.get("env", []):
            reference = entry.get("valueFrom", {}).get("secretKeyRef")
            if reference is not None:
                secret = only(objects, "Secret", reference["name"])
                reference["name"] = suffixed(reference["name"], suffix)
                data = dict(secret.get("data", {}))
                data |= {k: base64.b64encode(v.encode()).decode() for k, v in secret.get("stringData", {}).items()}
                secrets[reference["name"]] = data
    workload["metadata"]["name"] = suffixed(workload["metadata"]["name"], suffix)
    played = []
    for obj in objects:
        if obj["kind"] == "Secret":
            continue
        key = (obj["kind"], obj["metadata"]["name"])
        if key in renamed:
            obj["metadata"]["name"] = renamed[key]
        played.append(obj)
    return played, secrets


@contextmanager
def kube_play(objects: list[dict[str, Any]], secrets: dict[str, dict[str, str]], directory: Path) -> Iterator[None]:
    """Create the Secrets, play the objects, and remove everything the play made afterwards."""
    manifest = directory / "play.yaml"
    manifest.write_text(yaml.safe_dump_all(objects, sort_keys=False))
    volumes_before = set(podman("volume", "ls", "--quiet").stdout.split())
    created: list[str] = []
    try:
        for name, data in secrets.items():
            podman("secret", "create", name, "-", stdin=json.dumps(data))
            created.append(name)
        podman("kube", "play", str(manifest))
        yield
    finally:
        podman("kube", "down", str(manifest), check=False)
        for name in created:
            podman("secret", "rm", name, check=False)
        for volume in set(podman("volume", "ls", "--quiet", check=False).stdout.split()) - volumes_before:
            podman("volume", "rm", "--force", volume, check=False)


def test_kube_play_runs_the_rendered_dev_overlay(tmp_path: Path) -> None:
    objects, template, config = dev_admission()
    container = template.container(CONTAINER)
    _flags, uid, gid = run_flags(template, container)
    ports = container_port_names(container)
    assert only(objects, "Deployment", WORKLOAD.split("/")[1])["spec"]["template"]["spec"]["containers"][0][
        "image"] == image_name().removeprefix("localhost/"), "the dev overlay runs another image than `make image`"
    suffix = uuid.uuid4().hex[:8]
    host_shm = tmp_path / "shm"
    host_shm.mkdir()
    host_shm.chmod(0o1777)
    played, secrets = playable_dev_overlay(objects, suffix=suffix, host_shm=host_shm)
    pod = f"{suffixed(WORKLOAD.split('/')[1], suffix)}-pod-0"
    name = f"{pod}-{CONTAINER}"
    with kube_play(played, secrets, tmp_path):
        address = pod_ip(pod)
        try:
            check_service(
                container=name, grpc_address=f"{address}:{ports['grpc']}",
                metrics_address=f"{address}:{ports['metrics']}", config=config, uid=uid, gid=gid,
                # The pod's emptyDir is a podman volume on the host's disk, as a kubelet's default one is.
                tmp_filesystem=None,
            )
        except AssertionError:
            print(container_logs(name))
            raise
