"""The pure cores (admission engine, planner, packer) load no I/O or service libraries, even indirectly."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# (protobuf, which the typed plan serialises with, imports threading for its own locks; that is not I/O)
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
