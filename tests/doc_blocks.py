"""The runnable shell blocks of the docs: fenced ```bash blocks, read exactly as a reader copies them."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_FENCE = re.compile(r"^```bash\n(.*?)^```", re.MULTILINE | re.DOTALL)


def bash_blocks(path: Path) -> list[str]:
    """The text of every ```bash block of a markdown file, in order."""
    return [match.group(1) for match in _FENCE.finditer(path.read_text())]


def run_bash_blocks(page: Path, *, cwd: Path, env: Mapping[str, str], timeout: float) -> tuple[int, str, str]:
    """Run every ```bash block of ``page`` in order, in one ``set -e`` bash session, as a reader would; whatever a
    failed block left running is killed. Returns the exit status, stdout and stderr."""
    script = "set -e\n" + "\n".join(bash_blocks(page))
    shell = subprocess.Popen(["bash", "-c", script], cwd=cwd, env=dict(env), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = shell.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(shell.pid)
        stdout, stderr = shell.communicate()  # what it printed before it hung, for the failure message
        stderr += f"\n[the blocks did not finish in {timeout:g}s]"
    finally:
        _kill_group(shell.pid)
    return shell.returncode, stdout, stderr


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def commands(block: str) -> list[str]:
    """The commands of a block: continuation lines joined, comment lines and blank lines left out."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def readme_commands(program: str) -> list[str]:
    """The README's commands that start with ``program`` (e.g. ``knittrans demo``), comments removed."""
    found = []
    for block in bash_blocks(ROOT / "README.md"):
        for command in commands(block):
            words = shlex.split(command, comments=True)
            if words[: len(program.split())] == program.split():
                found.append(shlex.join(words))
    return found


def make_recipe(target: str) -> list[str]:
    """The command lines of a Makefile target, with ``$(VENV)/bin/`` (the venv on PATH) removed."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip().replace("$(VENV)/bin/", ""))
    return recipe
