"""Every YAML file under deploy/ passes yamllint with the repository's .yamllint."""

from __future__ import annotations

from tests.deploy.tools import DEPLOY, ROOT, run, venv_tool


def test_yamllint_passes_on_deploy() -> None:
    result = run([venv_tool("yamllint"), "--strict", "-c", ROOT / ".yamllint", DEPLOY, ROOT / ".yamllint"])
    assert result.returncode == 0, result.stdout + result.stderr


def test_yamllint_config_catches_a_long_line(tmp_path) -> None:
    sample = tmp_path / "sample.yaml"
    sample.write_text(f"key: {'x' * 130}\n")
    result = run([venv_tool("yamllint"), "--strict", "-c", ROOT / ".yamllint", sample])
    assert result.returncode != 0 and "line-length" in result.stdout
