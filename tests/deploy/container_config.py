"""The config a KnitTrans container of a rendered manifest starts with, loaded through the real settings class.

A container's config has three layers, as `knittrans.config.load_config` merges them: the file that
``--config`` names (a ConfigMap mounted into the container), the ``KNITTRANS_*`` variables of its env, and
its command-line flags. This module resolves all three the way the kubelet would (Secrets, downward-API
fields, ``$(VAR)`` references), parses the args with the real ``knittrans`` CLI parser and loads the result
with ``load_config`` into the command's settings class, so a key the service does not know fails the test.

Values only the cluster knows are replaced by stand-ins: a Secret that is not rendered (created out of band)
by a URL-safe hex string derived from its name and key, a pod's IP by :data:`POD_IP`, a pod index by
:data:`POD_INDEX`.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import posixpath
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from knittrans.cli import build_parser
from knittrans.config import ENV_PREFIX, load_config
from tests.deploy.k8s_objects import PodTemplate, only

POD_IP = "10.0.0.42"
POD_INDEX = "2"
CONFIG_FLAG = "--config"

# Which config key each flag of a command sets, as the command's own `run` passes it to load_config.
# A flag a manifest uses that is not listed here fails the resolution rather than being ignored.
FLAG_KEYS: Mapping[str, Mapping[str, str]] = {
    "admission serve": {
        "host": "server.host",
        "port": "server.port",
        "metrics_port": "server.metrics.port",
        "state": "state",
        "store": "store",
        "job": "job",
    },
    "reorg serve": {
        "job": "job",
        "role": "role",
        "dp_rank": "dp_rank",
        "cp_rank": "cp_rank",
        "store": "store",
        "admission": "admission.target",
        "socket": "server.unix_socket",
        "slots": "ring.slots",
        "metrics_port": "server.metrics.port",
    },
}
# Parsed arguments that are not config: the config file itself, and process plumbing.
_NOT_CONFIG = {"config", "ready_file", "log_level"}

_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_POD_INDEX_LABELS = {
    "metadata.labels['batch.kubernetes.io/job-completion-index']",
    "metadata.labels['apps.kubernetes.io/pod-index']",
    "metadata.annotations['batch.kubernetes.io/job-completion-index']",
}


def settings_class(command: str) -> type:
    """The settings dataclass a ``knittrans`` command loads (imported here so that a missing part fails)."""
    if command == "admission serve":
        from knittrans.admission.service.settings import AdmissionServiceSettings

        return AdmissionServiceSettings
    if command == "reorg serve":
        from knittrans.reorg.settings import ReorgSettings

        return ReorgSettings
    raise AssertionError(f"no settings class known for `knittrans {command}`")


def secret_stand_in(name: str, key: str) -> str:
    """What an out-of-band Secret's key holds in these tests: hex, so it is safe inside a URL."""
    return hashlib.sha256(f"{name}/{key}".encode()).hexdigest()[:32]


@dataclass(frozen=True, kw_only=True)
class ContainerConfig:
    """One container's resolved command line, environment and config file."""

    where: str
    command: str  # "admission serve"
    args: tuple[str, ...]
    env: Mapping[str, str]
    config_path: str  # where --config points inside the container
    config_text: str
    mounts: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # mountPath -> volume

    @property
    def knittrans_env(self) -> dict[str, str]:
        return {name: value for name, value in self.env.items() if name.startswith(ENV_PREFIX)}

    def flags(self) -> dict[str, Any]:
        """The config keys the command line sets, parsed by the real ``knittrans`` parser."""
        try:
            parsed = build_parser().parse_args(list(self.args))
        except SystemExit as exc:
            raise AssertionError(f"{self.where}: `knittrans {' '.join(self.args)}` does not parse") from exc
        keys = FLAG_KEYS[self.command]
        flags: dict[str, Any] = {}
        for name, value in vars(parsed).items():
            if value is None or name.startswith(("_", "command")) or name in _NOT_CONFIG:
                continue
            if name not in keys:
                raise AssertionError(f"{self.where}: flag --{name.replace('_', '-')} is not known to this test")
            flags[keys[name]] = value
        return flags

    def load(self, *, env: Mapping[str, str] | None = None, flags: Mapping[str, Any] | None = None) -> Any:
        """The settings object the container would start with; ``env`` and ``flags`` are added on top."""
        with tempfile.TemporaryDirectory() as directory:
            path = Path(directory) / posixpath.basename(self.config_path)
            path.write_text(self.config_text)
            return load_config(
                settings_class(self.command),
                path=path,
                env={**self.knittrans_env, **(env or {})},
                flags={**self.flags(), **(flags or {})},
            )

    def volume_at(self, path: str) -> Mapping[str, Any]:
        """The volume mounted at the deepest mount point that contains ``path``."""
        candidates = [m for m in self.mounts if path == m or path.startswith(m.rstrip("/") + "/")]
        if not candidates:
            raise AssertionError(f"{self.where}: nothing is mounted at {path}")
        return self.mounts[max(candidates, key=len)]


def resolve(objects: list[dict[str, Any]], template: PodTemplate, container_name: str) -> ContainerConfig:
    container = template.container(container_name)
    where = f"{template.name}/{container_name}"
    if container.get("envFrom"):
        raise AssertionError(f"{where}: envFrom would hide which KNITTRANS_* variables it sets")
    env = _resolve_env(objects, template, container, where)
    args = tuple(_expand(str(a), env) for a in container.get("args", []))
    command = " ".join(args[:2])
    if command not in FLAG_KEYS:
        raise AssertionError(f"{where}: not a knittrans service command: {args[:2]}")
    volumes = {v["name"]: v for v in template.spec.get("volumes", [])}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container.get("volumeMounts", [])}
    config_path = _config_path(args, where)
    partial = ContainerConfig(
        where=where, command=command, args=args, env=env, config_path=config_path, config_text="", mounts=mounts
    )
    config_text = _config_map_file(objects, partial.volume_at(config_path), config_path, where)
    return ContainerConfig(
        where=where, command=command, args=args, env=env, config_path=config_path, config_text=config_text,
        mounts=mounts,
    )


def _config_path(args: tuple[str, ...], where: str) -> str:
    for index, arg in enumerate(args):
        if arg == CONFIG_FLAG and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith(CONFIG_FLAG + "="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{where}: no {CONFIG_FLAG} argument")


def _config_map_file(objects: list[dict[str, Any]], volume: Mapping[str, Any], path: str, where: str) -> str:
    if "configMap" not in volume:
        raise AssertionError(f"{where}: {path} is not on a ConfigMap volume")
    if "items" in volume["configMap"]:
        raise AssertionError(f"{where}: ConfigMap volumes with items are not resolved by this test")
    config_map = only(objects, "ConfigMap", volume["configMap"]["name"])
    name = posixpath.basename(path)
    data = config_map.get("data", {})
    if name not in data:
        raise AssertionError(f"{where}: ConfigMap {config_map['metadata']['name']} has no key {name}")
    return data[name]


def _resolve_env(
    objects: list[dict[str, Any]], template: PodTemplate, container: Mapping[str, Any], where: str
) -> dict[str, str]:
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        name = entry["name"]
        if "value" in entry:
            env[name] = _expand(str(entry["value"]), env)
            continue
        source = entry.get("valueFrom", {})
        if "secretKeyRef" in source:
            env[name] = _secret_value(objects, source["secretKeyRef"]["name"], source["secretKeyRef"]["key"])
        elif "configMapKeyRef" in source:
            reference = source["configMapKeyRef"]
            env[name] = str(only(objects, "ConfigMap", reference["name"])["data"][reference["key"]])
        elif "fieldRef" in source:
            env[name] = _field_value(template, source["fieldRef"]["fieldPath"], where)
        else:
            raise AssertionError(f"{where}: env {name} has a source this test does not resolve: {source}")
    return env


def _secret_value(objects: list[dict[str, Any]], name: str, key: str) -> str:
    rendered = [o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == name]
    if not rendered:
        return secret_stand_in(name, key)
    secret = rendered[0]
    if key in secret.get("stringData", {}):
        return str(secret["stringData"][key])
    return base64.b64decode(secret["data"][key]).decode()


def _field_value(template: PodTemplate, path: str, where: str) -> str:
    if path in _POD_INDEX_LABELS:
        return POD_INDEX
    if path in ("status.podIP", "status.hostIP"):
        return POD_IP
    if path == "metadata.namespace":
        return str(template.workload["metadata"].get("namespace", "default"))
    if path == "metadata.name":
        return f"{template.workload['metadata']['name']}-{POD_INDEX}"
    raise AssertionError(f"{where}: downward-API field {path} is not resolved by this test")


def _expand(text: str, defined: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined variables are replaced, ``$$`` escapes, the rest stays."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return defined.get(match.group(1), match.group(0))

    return _REFERENCE.sub(replace, text)


@functools.cache
def _service_ports(kustomization: str) -> dict[tuple[str, str], dict[str, int]]:
    from tests.deploy.tools import render

    return {
        (o["metadata"]["name"], o["metadata"].get("namespace", "default")): {
            p.get("name", ""): p["port"] for p in o["spec"]["ports"]
        }
        for o in render(kustomization)
        if o["kind"] == "Service"
    }


def service_for(address: str, *, namespace: str, kustomization: str) -> tuple[str, str, int]:
    """(Service, its port name, port) in a rendered kustomization that a ``host:port`` address reaches.

    ``name`` resolves in ``namespace``; ``name.ns``, ``name.ns.svc`` and ``name.ns.svc.cluster.local``
    in ``ns``, as cluster DNS resolves them.
    """
    host, _, port_text = address.rpartition(":")
    labels = host.split(".")
    if len(labels) == 1:
        service, service_namespace = labels[0], namespace
    elif len(labels) == 2 or labels[2:] in (["svc"], ["svc", "cluster", "local"]):
        service, service_namespace = labels[0], labels[1]
    else:
        raise AssertionError(f"{address} is not a Service address")
    ports = _service_ports(kustomization).get((service, service_namespace))
    if ports is None:
        raise AssertionError(f"{address}: {kustomization} renders no Service {service_namespace}/{service}")
    by_port = {number: name for name, number in ports.items()}
    if int(port_text) not in by_port:
        raise AssertionError(f"{address}: Service {service_namespace}/{service} has no port {port_text}")
    return service, by_port[int(port_text)], int(port_text)
