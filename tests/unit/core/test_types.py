"""The typed packages pass ``mypy --strict``: the same command as ``make lint``, so ``make test`` (what CI runs)
enforces it too. The package list is read from the Makefile's TYPED_PACKAGES, so there is one list."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def typed_packages() -> list[str]:
    makefile = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    match = re.search(r"^TYPED_PACKAGES\s*:=\s*(.+)$", makefile, re.MULTILINE)
    assert match is not None, "the Makefile defines no TYPED_PACKAGES"
    return match.group(1).split()


def test_the_makefile_names_the_pure_cores_as_typed() -> None:
    assert {"knittrans.admission.engine", "knittrans.admission.planning", "knittrans.reorg.packing",
            "knittrans.plan", "knittrans.wire"} <= set(typed_packages())


def test_the_makefile_names_every_sdk_module_as_typed() -> None:
    sdk = ROOT / "clients" / "python" / "knittrans"
    modules = {f"knittrans.{p.stem}" for p in sdk.iterdir()
               if p.name not in ("__init__.py", "v1", "__pycache__") and (p.suffix == ".py" or p.is_dir())}
    assert modules <= set(typed_packages()), f"not type-checked: {sorted(modules - set(typed_packages()))}"


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                    reason="mypy is not installed (it comes with the dev extra: pip install -e '.[dev]')")
def test_typed_packages_pass_mypy_strict() -> None:
    # The configuration (strict, source roots, overrides) is pyproject.toml's [tool.mypy], found from the root.
    command = [sys.executable, "-m", "mypy", *(arg for p in typed_packages() for arg in ("-p", p))]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(command[1:])} failed:\n{result.stdout}{result.stderr}"
    assert result.stdout.startswith("Success"), result.stdout
