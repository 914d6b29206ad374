"""The ``knittrans`` command: a thin dispatcher over subcommands registered by each part.

Each part registers its subcommands through the ``knittrans.commands`` entry-point group. An entry's
name is the command path with spaces (``admission serve``) or dots (``admission.serve``), and its value
is a function ``register(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]``:
it adds its arguments and returns the function that runs the command. So the SDK never imports a service.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points

from knittrans.errors import KnitTransError

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "knittrans.commands"
Runner = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="knittrans", description="KnitTrans: trajectory transfer for LLM RL.")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    root = parser.add_subparsers(dest="command", metavar="COMMAND")
    groups: dict[tuple[str, ...], argparse._SubParsersAction[argparse.ArgumentParser]] = {(): root}
    parsers: dict[tuple[str, ...], argparse.ArgumentParser] = {}
    for entry in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        path = tuple(entry.name.replace(".", " ").split())
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
    parser = build_parser()
    args = parser.parse_args(argv)
    runner: Runner | None = getattr(args, "_runner", None)
    if runner is None:
        parser.print_help()
        return 2
    configure_logging(args.log_level)
    try:
        return int(runner(args) or 0)
    except KnitTransError as exc:
        print(f"knittrans: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
