"""Small read-only views over rendered Kubernetes objects, shared by the manifest tests."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

WORKLOAD_KINDS = frozenset({"Deployment", "StatefulSet", "DaemonSet", "Job"})
_QUANTITY = re.compile(r"^(?P<number>[0-9.]+)(?P<suffix>Ki|Mi|Gi|Ti|k|M|G|T)?$")
_SUFFIX_BYTES = {
    None: 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}
_VARIABLE_REFERENCE = re.compile(r"(?<!\$)\$\((?P<name>[A-Za-z_][A-Za-z0-9_]*)\)")


@dataclass(frozen=True, kw_only=True)
class PodTemplate:
    """The pod template of a workload, with the workload it belongs to."""

    workload: Mapping[str, Any]
    spec: Mapping[str, Any]
    labels: Mapping[str, str]

    @property
    def name(self) -> str:
        return f"{self.workload['kind']}/{self.workload['metadata']['name']}"

    def containers(self) -> list[Mapping[str, Any]]:
        return [*self.spec.get("initContainers", []), *self.spec["containers"]]

    def container(self, name: str) -> Mapping[str, Any]:
        for container in self.containers():
            if container["name"] == name:
                return container
        raise KeyError(f"{self.name} has no container {name!r}")

    def volume(self, name: str) -> Mapping[str, Any]:
        for volume in self.spec.get("volumes", []):
            if volume["name"] == name:
                return volume
        raise KeyError(f"{self.name} has no volume {name!r}")


def pod_templates(objects: list[dict[str, Any]]) -> list[PodTemplate]:
    return [
        PodTemplate(
            workload=obj,
            spec=obj["spec"]["template"]["spec"],
            labels=obj["spec"]["template"].get("metadata", {}).get("labels", {}),
        )
        for obj in objects
        if obj["kind"] in WORKLOAD_KINDS
    ]


def only(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A LabelSelector (matchLabels and matchExpressions) against a label set."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and labels.get(key) in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def quantity_bytes(quantity: str) -> int:
    match = _QUANTITY.match(str(quantity))
    if match is None:
        raise ValueError(f"not a byte quantity: {quantity!r}")
    return int(float(match.group("number")) * _SUFFIX_BYTES[match.group("suffix")])


def variable_references(text: str) -> set[str]:
    """The ``$(NAME)`` references that Kubernetes expands in a container's args and env values."""
    return {m.group("name") for m in _VARIABLE_REFERENCE.finditer(text)}


def container_port_names(container: Mapping[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports", []) if "name" in p}


def referenced_config(template: PodTemplate) -> Iterator[tuple[str, str]]:
    """(kind, name) of every ConfigMap and Secret a pod template reads, from volumes and env."""
    for volume in template.spec.get("volumes", []):
        if "configMap" in volume:
            yield "ConfigMap", volume["configMap"]["name"]
        if "secret" in volume:
            yield "Secret", volume["secret"]["secretName"]
    for container in template.containers():
        for env in container.get("env", []):
            source = env.get("valueFrom", {})
            if "secretKeyRef" in source:
                yield "Secret", source["secretKeyRef"]["name"]
            if "configMapKeyRef" in source:
                yield "ConfigMap", source["configMapKeyRef"]["name"]
        for env_from in container.get("envFrom", []):
            if "secretRef" in env_from:
                yield "Secret", env_from["secretRef"]["name"]
            if "configMapRef" in env_from:
                yield "ConfigMap", env_from["configMapRef"]["name"]
