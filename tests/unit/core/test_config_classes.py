"""Every config class, found by reading the sources, names a missing required key like any other field error.

The classes are not listed by hand: every ``load_config(X, ...)`` and ``build(X, ...)`` call in the KnitTrans
sources names a root, and every dataclass reachable through a root's annotations is a config class too.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import typing
from pathlib import Path

import pytest

from knittrans.cli import main
from knittrans.config import build, load_config
from knittrans.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
SOURCE_ROOTS = [ROOT / "clients" / "python", ROOT / "services" / "common", ROOT / "services" / "admission",
                ROOT / "services" / "reorg", ROOT / "demo"]
LOADERS = {"load_config", "build"}


def _imported_names(tree: ast.Module, module: str) -> dict[str, tuple[str, str]]:
    """Every ``from M import N`` anywhere in a file (function-level imports included): N -> (M, N)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                names[alias.asname or alias.name] = (node.module, alias.name)
    return names


def _root_classes() -> set[type]:
    roots: set[type] = set()
    for source_root in SOURCE_ROOTS:
        for path in sorted((source_root / "knittrans").rglob("*.py")):
            if "/v1/" in path.as_posix():
                continue
            tree = ast.parse(path.read_text())
            module = ".".join(path.relative_to(source_root).with_suffix("").parts)
            imported = None
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Name)):
                    continue
                called = node.func.id if isinstance(node.func, ast.Name) else None
                if called not in LOADERS:
                    continue
                imported = imported if imported is not None else _imported_names(tree, module)
                if imported.get(called, ("", ""))[0] != "knittrans.config" and module != "knittrans.config":
                    continue
                name = node.args[0].id
                owner, attr = imported.get(name, (module, name))
                candidate = getattr(importlib.import_module(owner), attr, None)
                if isinstance(candidate, type) and dataclasses.is_dataclass(candidate):
                    roots.add(candidate)
    return roots


def _nested(annotation: object) -> list[type]:
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return [annotation]
    return [c for arg in typing.get_args(annotation) for c in _nested(arg)]


def _config_classes() -> list[type]:
    seen: dict[type, None] = {}
    pending = sorted(_root_classes(), key=lambda c: c.__qualname__)
    while pending:
        cls = pending.pop()
        if cls in seen:
            continue
        seen[cls] = None
        for hint in typing.get_type_hints(cls).values():
            pending.extend(_nested(hint))
    return sorted(seen, key=lambda c: f"{c.__module__}.{c.__qualname__}")


def _required(cls: type) -> list[str]:
    return [
        f.name for f in dataclasses.fields(cls)
        if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]


CONFIG_CLASSES = _config_classes()
REQUIRED = [(cls, name) for cls in CONFIG_CLASSES for name in _required(cls)]


def test_the_enumeration_finds_the_config_classes() -> None:
    names = {cls.__name__ for cls in CONFIG_CLASSES}
    assert {"AdmissionServiceSettings", "ReorgSettings", "Topology", "BackboneTopology", "EngineConfig",
            "ServerSettings", "SimConfig", "ReplayConfig"} <= names, names


@pytest.mark.parametrize(("cls", "name"), REQUIRED, ids=[f"{c.__name__}.{n}" for c, n in REQUIRED])
def test_a_missing_required_key_is_named(cls: type, name: str) -> None:
    """Missing keys are reported before any value is converted, so the other values here may be anything."""
    others = {other: None for other in _required(cls) if other != name}
    with pytest.raises(ConfigError) as info:
        build(cls, others, prefix="section.")
    assert info.value.field == f"section.{name}"
    assert str(info.value) == f"section.{name}: is required"


@pytest.mark.parametrize("cls", CONFIG_CLASSES, ids=[c.__name__ for c in CONFIG_CLASSES])
def test_an_empty_section_names_its_first_required_key_or_builds(cls: type) -> None:
    required = _required(cls)
    if not required:
        return  # every key has a default; what the defaults mean is each class's own test
    with pytest.raises(ConfigError) as info:
        build(cls, {})
    assert str(info.value) == f"{required[0]}: is required"


def test_a_topology_without_dp_names_backbone_dp(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    topology = tmp_path / "topology.yaml"
    topology.write_text("backbone:\n  max_tokens_per_microbatch: 4096\n")
    batch = ROOT / "examples" / "plan" / "text-only.jsonl"
    assert main(["plan", "--batch", str(batch), "--topology", str(topology)]) == 2
    assert capsys.readouterr().err.strip() == "knittrans: error: backbone.dp: is required"


def test_a_service_config_without_engine_names_it(tmp_path: Path) -> None:
    from knittrans.admission.service.settings import AdmissionServiceSettings

    config = tmp_path / "admission.yaml"
    config.write_text("job: demo\n")
    with pytest.raises(ConfigError) as info:
        load_config(AdmissionServiceSettings, path=config, env={})
    assert str(info.value) == "engine: is required"
