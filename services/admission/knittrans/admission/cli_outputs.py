"""The output options the offline commands (``knittrans replay``, ``knittrans simulate``) share: ``--json``,
``--plot`` and ``--progress``, and writing what they ask for."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_output_arguments(parser: argparse.ArgumentParser, *, plot: str, progress: str) -> None:
    """``--json OUT.json``, ``--plot OUT.png`` (``plot`` says what it draws) and ``--progress`` (``progress``
    says when ``auto`` shows bars)."""
    parser.add_argument("--json", metavar="OUT.json", help="write the results as JSON")
    parser.add_argument("--plot", metavar="OUT.png", help=plot)
    parser.add_argument(
        "--progress", choices=("auto", "always", "never"), default="auto", help=f"progress {progress}",
    )


def shows_progress(choice: str, *, interactive: bool, work: int, minimum: int) -> bool:
    """Whether ``--progress choice`` shows bars: ``auto`` does on a terminal for at least ``minimum`` units."""
    return choice == "always" or (choice == "auto" and interactive and work >= minimum)


def write_json(path: str, document: dict) -> None:  # type: ignore[type-arg]
    """Write ``document`` to ``path`` (creating its folder) and say so on stdout."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {path}", flush=True)


def prepare_plot(path: str) -> None:
    """Create the folder of the plot at ``path``."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
