"""deploy/Dockerfile passes hadolint and keeps its promises: non-root, `knittrans` entry point, no build tools.

These run everywhere, without a container engine; tests/container builds nothing but runs the image
`make image` built (`make test-container`), as docs/deploy.md says.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

import pytest

from tests.deploy.tools import DEPLOY, DOCKERFILE, ROOT, run, venv_tool

BUILD_TOOLS = re.compile(r"^(gcc|g\+\+|cpp|clang|make|cmake|ninja-build|build-essential|git|.*-dev)$")


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def arguments(self, instruction: str) -> list[str]:
        return [args for op, args in self.instructions if op == instruction]


def stages() -> list[Stage]:
    """The stages of the Dockerfile, with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    parsed: list[Stage] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        op, _, args = line.partition(" ")
        op = op.upper()
        if op == "FROM":
            words = args.split()
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else str(len(parsed))
            parsed.append(Stage(name=name, base=words[0]))
        elif parsed:
            parsed[-1].instructions.append((op, args.strip()))
    return parsed


def lineage(name: str) -> list[Stage]:
    """A stage and the stages it is built FROM, nearest first."""
    by_name = {s.name: s for s in stages()}
    chain = [by_name[name]]
    while chain[-1].base in by_name:
        chain.append(by_name[chain[-1].base])
    return chain


def setting(chain: list[Stage], instruction: str) -> str | None:
    for stage in chain:
        values = stage.arguments(instruction)
        if values:
            return values[-1]
    return None


def installed_packages(stage: Stage) -> list[str]:
    packages = []
    for command in stage.arguments("RUN"):
        for part in re.split(r"&&|;", command):
            words = shlex.split(part)
            if words[:2] == ["apt-get", "install"] or words[:1] == ["apk"]:
                packages += [w for w in words[2:] if not w.startswith("-")]
    return packages


def test_hadolint_passes() -> None:
    result = run([venv_tool("hadolint"), "--no-color", DOCKERFILE])
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("final", ["service", "trainer"])
def test_final_stages_run_knittrans_as_a_numeric_non_root_user_without_build_tools(final: str) -> None:
    chain = lineage(final)
    user = setting(chain, "USER")
    assert user is not None
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "a numeric uid lets Kubernetes check runAsNonRoot"
    assert setting(chain, "ENTRYPOINT") == '["knittrans"]'
    for stage in chain:
        tools = [p for p in installed_packages(stage) if BUILD_TOOLS.match(p)]
        assert not tools, f"stage {stage.name} installs build tools {tools}"
    copied_from = {
        a.split()[0].removeprefix("--from=") for s in chain for a in s.arguments("COPY") if a.startswith("--from=")
    }
    assert copied_from, "the final stage copies the built environment from a build stage"


def test_service_image_is_the_default_target_and_has_no_torch() -> None:
    all_stages = stages()
    assert all_stages[-1].name == "service"
    for stage in [*lineage("service"), *[s for s in all_stages if s.name in {"build"}]]:
        assert not any("torch" in run_args for run_args in stage.arguments("RUN")), stage.name
    trainer_build = next(s for s in all_stages if s.name == "build-trainer")
    (install,) = [a for a in trainer_build.arguments("RUN") if "torch" in a]
    assert "torch==2.13.0" in install and "--index-url" in install
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in DOCKERFILE.read_text()


def test_build_context_sends_what_the_build_copies() -> None:
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert "*" in ignore
    build = next(s for s in stages() if s.name == "build")
    for copy in build.arguments("COPY"):
        *sources, _destination = copy.split()
        for source in sources:
            source = source.rstrip("/")
            assert source in allowed, f"COPY {source} is excluded from the build context"
            assert (ROOT / source).exists(), source
