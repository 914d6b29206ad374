"""The engine is a pure core (DESIGN.md §3.8): it imports no I/O, clock, randomness or service libraries."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[3] / "services" / "admission" / "knittrans" / "admission" / "engine"
FORBIDDEN = {"os", "sys", "io", "time", "datetime", "random", "socket", "threading", "asyncio", "logging", "grpc",
             "redis", "prometheus_client", "subprocess", "pathlib"}


@pytest.mark.parametrize("module", sorted(ENGINE.glob("*.py")), ids=lambda p: p.name)
def test_engine_module_imports_nothing_impure(module: Path) -> None:
    tree = ast.parse(module.read_text())
    imported = set()
    project = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".")[0])
            if node.module.startswith("knittrans"):
                project.add(node.module)
    assert not imported & FORBIDDEN, f"{module.name} imports {sorted(imported & FORBIDDEN)}"
    assert imported <= {"__future__", "bisect", "collections", "dataclasses", "enum", "heapq", "math", "re", "types",
                        "typing", "knittrans"}, sorted(imported)
    # Within KnitTrans only the engine itself and the shared types and errors (not the config loader).
    assert all(m.startswith("knittrans.admission.engine") or m in ("knittrans.types", "knittrans.errors")
               for m in project), sorted(project)
