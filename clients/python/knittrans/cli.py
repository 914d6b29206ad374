"""The ``knittrans`` command: a thin dispatcher over subcommands registered by each part.

Each part registers its subcommands through the ``knittrans.commands`` entry-point group. An entry's
name is the command path with spaces (``admission serve``) or dots (``admission.serve``), and its value
is a function ``register(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]``:
it adds its arguments and returns the function that runs the command. So the SDK never imports a service.

A command line that names a command loads only that command's entry: every sidecar, service and restart pays
for importing its own part, not every part's (0.2 to 0.6 of a second per process on a small machine). Help and
command lines that name none load them all, so that the listing and the error name every command.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points

from knittrans.errors import KnitTransError
from knittrans.stack_dump import dump_stacks_on_signal

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "knittrans.commands"
Runner = Callable[[argparse.Namespace], int]


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
HELP_OPTIONS = ("-h", "--help")


def command_path(entry_name: str) -> tuple[str, ...]:
    return tuple(entry_name.replace(".", " ").split())


def command_words(argv: Sequence[str]) -> tuple[str, ...]:
    """The words naming a command: those before its first option, after the global options (none when help is
    asked for before them: that help lists every command)."""
    words: list[str] = []
    tokens = iter(argv)
    for token in tokens:
        if token.startswith("-"):
            if words:
                break
            if token in HELP_OPTIONS:
                return ()
            if token == "--log-level":
                next(tokens, None)
            continue
        words.append(token)
    return tuple(words)


def selected_paths(paths: Sequence[tuple[str, ...]], argv: Sequence[str]) -> set[tuple[str, ...]]:
    """The command paths to load for ``argv``: the one it names, else all of them."""
    words = command_words(argv)
    named = {path for path in paths if words[:len(path)] == path}
    return named if len(named) == 1 else set(paths)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv`` (all commands when it is ``None``)."""
    parser = argparse.ArgumentParser(prog="knittrans", description="KnitTrans: trajectory transfer for LLM RL.")
    parser.add_argument("--log-level", default="INFO", choices=LOG_LEVELS)
    root = parser.add_subparsers(dest="command", metavar="COMMAND")
    groups: dict[tuple[str, ...], argparse._SubParsersAction[argparse.ArgumentParser]] = {(): root}
    parsers: dict[tuple[str, ...], argparse.ArgumentParser] = {}
    entries = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)
    wanted = selected_paths([command_path(e.name) for e in entries], [] if argv is None else argv)
    for entry in entries:
        path = command_path(entry.name)
        if path not in wanted:
            continue
        for depth in range(1, len(path)):
            prefix = path[:depth]
            if prefix not in groups:
                if prefix not in parsers:
                    parsers[prefix] = groups[prefix[:-1]].add_parser(prefix[-1], help=f"{prefix[-1]} commands")
                groups[prefix] = parsers[prefix].add_subparsers(dest=f"command_{depth}", metavar="COMMAND")
        try:
            register = entry.load()
        except ImportError as exc:  # a part installed without its extra must not break the other commands
            logger.warning("command %r is unavailable: %s", entry.name, exc)
            continue
        summary = (register.__doc__ or "").strip().splitlines()
        sub = groups[path[:-1]].add_parser(path[-1], help=summary[0] if summary else None)
        sub.set_defaults(_runner=register(sub))
    return parser


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(arguments)
    args = parser.parse_args(arguments)
    runner: Runner | None = getattr(args, "_runner", None)
    if runner is None:
        parser.print_help()
        return 2
    configure_logging(args.log_level)
    dump_stacks_on_signal()
    try:
        return int(runner(args) or 0)
    except KnitTransError as exc:
        print(f"knittrans: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
