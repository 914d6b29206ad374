"""The ``knittrans`` dispatcher loads only the command a command line names, and parses it as the full parser."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from importlib.metadata import entry_points

import pytest
from hypothesis import given
from hypothesis import strategies as st

from knittrans.cli import ENTRY_POINT_GROUP, build_parser, command_path, command_words, selected_paths

ENTRIES = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)
PATHS = [command_path(entry.name) for entry in ENTRIES]


def help_text(parser_argv: list[str] | None, argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser(parser_argv).parse_args(argv)
    return out.getvalue()


@pytest.mark.parametrize("path", PATHS, ids=" ".join)
def test_each_command_s_help_is_the_full_parser_s(path: tuple[str, ...]) -> None:
    argv = ["--log-level", "WARNING", *path, "--help"]
    assert help_text(argv, argv) == help_text(None, argv)


@pytest.mark.parametrize("argv", [["--help"], ["-h", "reorg", "serve"]])
def test_the_top_level_help_lists_every_command(argv: list[str]) -> None:
    listing = help_text(argv, argv)
    for path in PATHS:
        assert re.search(rf"^ {{4}}{path[0]}\b", listing, re.MULTILINE), path


@pytest.mark.parametrize(("argv", "expected"), [
    (["reorg", "serve", "--config", "x.yaml"], ("reorg", "serve")),
    (["--log-level", "WARNING", "reorg", "serve", "--dp-rank", "1"], ("reorg", "serve")),
    (["--log-level=DEBUG", "plan", "--json"], ("plan",)),
    (["--help"], ()),
    ([], ()),
    (["demo", "--config", "serve"], ("demo",)),
    (["-h", "reorg", "serve"], ()),
    (["--log-level", "INFO", "--help", "plan"], ()),
])
def test_command_words(argv: list[str], expected: tuple[str, ...]) -> None:
    assert command_words(argv) == expected


@given(st.lists(st.sampled_from(["reorg", "serve", "admission", "mooncake", "store", "master", "plan", "up",
                                 "--help", "-h", "--config", "x", "--log-level", "INFO"]), max_size=6))
def test_selection_is_the_named_command_or_every_command(argv: list[str]) -> None:
    # The naive reference: a command is named when the words before the first option (the global option's
    # value skipped) begin with its path; help asked for before any word names none.
    words: list[str] = []
    skip = False
    for token in argv:
        if skip:
            skip = False
        elif token == "--log-level" and not words:
            skip = True
        elif token.startswith("-"):
            if words:
                break
            if token in ("-h", "--help"):
                words = []
                break
        else:
            words.append(token)
    named = [path for path in PATHS if tuple(words[:len(path)]) == path]
    assert selected_paths(PATHS, argv) == ({named[0]} if len(named) == 1 else set(PATHS))


@pytest.mark.parametrize("path", [("reorg", "serve"), ("plan",), ("mooncake", "master")], ids=" ".join)
def test_a_named_command_imports_no_other_command_s_module(path: tuple[str, ...]) -> None:
    own = next(entry.value.split(":")[0] for entry in ENTRIES if command_path(entry.name) == path)
    others = sorted({entry.value.split(":")[0] for entry in ENTRIES} - {own})
    probe = (
        "import sys\n"
        "from knittrans.cli import main\n"
        "try:\n"
        f"    main({[*path, '--help']!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(sorted(m for m in {[own, *others]!r} if m in sys.modules))\n"
    )
    completed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                               check=True)
    loaded = completed.stdout.strip().splitlines()[-1]
    # The parts a command's own module imports are its business; no module of another command should be loaded
    # unless the named command itself imports it (none of these do).
    assert loaded == repr([own]), completed.stdout
