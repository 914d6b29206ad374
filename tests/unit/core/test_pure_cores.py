"""The pure cores (admission engine, planner, packer) load no I/O or service libraries, even indirectly."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SERVICE_LIBRARIES = ("grpc", "redis", "prometheus_client", "uvloop", "mooncake", "ray", "torch", "asyncio", "socket",
                     "subprocess", "yaml", "sqlite3")
CORES = ("knittrans.admission.engine", "knittrans.admission.planning.planner", "knittrans.reorg.packing")


@pytest.mark.parametrize("core", CORES)
def test_importing_a_core_loads_no_service_library(core: str) -> None:
    probe = (
        "import importlib, json, sys; before = set(sys.modules); importlib.import_module(sys.argv[1]); "
        "print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    loaded = json.loads(subprocess.run([sys.executable, "-c", probe, core], capture_output=True, text=True,
                                       check=True).stdout)
    offending = sorted({name.split(".")[0] for name in loaded} & set(SERVICE_LIBRARIES))
    assert offending == [], f"{core} pulls in {offending}"


# The typed plan's protobuf codec lives in knittrans.plan.proto, imported only where messages are built or read.
PROTOBUF_FREE = (*CORES, "knittrans.admission.planning", "knittrans.plan", "knittrans.plan.json")


@pytest.mark.parametrize("module", PROTOBUF_FREE)
def test_importing_a_core_or_the_plan_loads_no_protobuf(module: str) -> None:
    probe = "import importlib, sys; importlib.import_module(sys.argv[1]); print('google.protobuf' in sys.modules)"
    loaded = subprocess.run([sys.executable, "-c", probe, module], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "False", f"{module} loads google.protobuf"
