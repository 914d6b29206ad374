"""The SDK (clients/python) imports without the services' dependencies (DESIGN.md §8): `pip install knittrans` has
none of them. Its optional extras (Mooncake, Ray, torch) are left out: they need their own packages by design."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SDK_ROOT = Path(__file__).resolve().parents[3] / "clients" / "python"
# What only the `admission` and `reorg` extras install.
SERVICE_ONLY = ("prometheus_client", "uvloop", "redis", "matplotlib")
# Modules of the SDK's own optional extras, and the generated protobuf code.
OPTIONAL = ("knittrans.v1", "knittrans.store.mooncake", "knittrans.store.ray_store", "knittrans.train",
            "knittrans.trainer")

_PROBE = """
import importlib, importlib.abc, json, sys

blocked = set(sys.argv[1].split(","))


class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: not an SDK dependency)", name=name)
        return None


sys.meta_path.insert(0, Blocker())
failures = {}
for module in sys.argv[2:]:
    try:
        importlib.import_module(module)
    except ImportError as exc:
        failures[module] = repr(exc)
print(json.dumps(failures))
"""


def _sdk_modules() -> list[str]:
    modules = []
    for path in sorted((SDK_ROOT / "knittrans").rglob("*.py")):
        parts = path.relative_to(SDK_ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join(parts)
        if not any(name == optional or name.startswith(f"{optional}.") for optional in OPTIONAL):
            modules.append(name)
    return modules


def test_the_enumeration_finds_the_sdk() -> None:
    modules = _sdk_modules()
    assert {"knittrans.client.admission", "knittrans.config", "knittrans.wire.columns", "knittrans.store"} \
        <= set(modules), modules


def test_every_sdk_module_imports_without_the_services_dependencies() -> None:
    result = subprocess.run([sys.executable, "-c", _PROBE, ",".join(SERVICE_ONLY), *_sdk_modules()],
                            capture_output=True, text=True, check=True)
    assert json.loads(result.stdout) == {}
