"""Schema validation of rendered Kubernetes objects, failing on any kind it cannot check.

Core kinds are checked by kubernetes-validate in strict mode (unknown fields are errors) against both the
oldest Kubernetes release the manifests support and the newest one the validator knows. prometheus-operator
kinds are checked against the pydantic models of cloudcoil-models-prometheus-operator; those models ignore
unknown fields, so a field that does not survive the round trip through the model is reported as unknown.
Any other kind raises :class:`UnvalidatedKind`: nothing passes without a schema.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import kubernetes_validate
from cloudcoil.models.prometheus_operator import v1 as prometheus_operator
from pydantic import BaseModel
from pydantic import ValidationError as ModelValidationError

# Native sidecar containers (restartPolicy: Always on an init container) are on by default from 1.29.
OLDEST_KUBERNETES = "1.29"
NEWEST_KUBERNETES = kubernetes_validate.latest_version()

PROMETHEUS_OPERATOR_MODELS: Mapping[tuple[str, str], type[BaseModel]] = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): prometheus_operator.ServiceMonitor,
    ("monitoring.coreos.com/v1", "PodMonitor"): prometheus_operator.PodMonitor,
    ("monitoring.coreos.com/v1", "PrometheusRule"): prometheus_operator.PrometheusRule,
}


class ManifestError(AssertionError):
    """An object that does not match its schema."""


class UnvalidatedKind(ManifestError):
    """An object of a kind for which no schema is known; it must not pass silently."""


def describe(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    namespace = metadata.get("namespace")
    name = metadata.get("name", "?")
    return f"{obj.get('apiVersion')}/{obj.get('kind')} {namespace + '/' if namespace else ''}{name}"


def validate_object(obj: Mapping[str, Any]) -> str:
    """Validate one object; returns which validator accepted it."""
    key = (obj.get("apiVersion", ""), obj.get("kind", ""))
    model = PROMETHEUS_OPERATOR_MODELS.get(key)
    if model is not None:
        _validate_with_model(obj, model)
        return "prometheus-operator"
    for version in (OLDEST_KUBERNETES, NEWEST_KUBERNETES):
        try:
            kubernetes_validate.validate(dict(obj), version, strict=True)
        except kubernetes_validate.SchemaNotFoundError as exc:
            raise UnvalidatedKind(f"{describe(obj)}: no schema to validate it against ({exc.message})") from None
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            raise ManifestError(f"{describe(obj)} (Kubernetes {version}): {path}: {exc.message}") from None
    return "kubernetes"


def _validate_with_model(obj: Mapping[str, Any], model: type[BaseModel]) -> None:
    try:
        parsed = model.model_validate(obj)
    except ModelValidationError as exc:
        raise ManifestError(f"{describe(obj)}: {exc}") from None
    kept = parsed.model_dump(mode="json", by_alias=True, exclude_unset=True)
    unknown = sorted(_dropped_paths(obj, kept, ""))
    if unknown:
        raise ManifestError(f"{describe(obj)}: unknown fields {', '.join(unknown)}")


def _dropped_paths(original: Any, kept: Any, path: str) -> Iterator[str]:
    """Paths present in ``original`` but missing from the model's dump of it."""
    if isinstance(original, Mapping):
        if not isinstance(kept, Mapping):
            yield path or "<root>"
            return
        for key, value in original.items():
            child = f"{path}.{key}" if path else str(key)
            if key not in kept:
                yield child
            else:
                yield from _dropped_paths(value, kept[key], child)
    elif isinstance(original, list) and isinstance(kept, list):
        for index, (value, kept_value) in enumerate(zip(original, kept, strict=False)):
            yield from _dropped_paths(value, kept_value, f"{path}[{index}]")
