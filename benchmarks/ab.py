"""Run one benchmark at two revisions of this repository, interleaved, and print both results side by side.

The baseline revision is checked out into a temporary git worktree; each round runs the benchmark once at the
baseline and once at the working tree (the order alternates between rounds, so a drift in the machine's load
hits both arms alike). Both arms use this venv; each arm's sources come first on PYTHONPATH, so each imports
its own code. Every round's JSON is kept; the summary takes each numeric figure's median over the rounds.
``--script head`` runs the working tree's benchmark script in both arms (each arm still imports its own code),
for a benchmark mode the baseline's script does not have yet.

    python benchmarks/ab.py --base 51f23d1 --benchmark admission_service --rounds 3 -- --quick
    python benchmarks/ab.py --base e40758e --benchmark admission_service --script head -- --scale-quick
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SOURCE_ROOTS = ("clients/python", "services/common", "services/admission", "services/reorg", "demo", ".")

logger = logging.getLogger("ab")


def run_arm(tree: Path, benchmark: str, arguments: Sequence[str], script_tree: Path | None = None) -> dict[str, Any]:
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(str(tree / root) for root in SOURCE_ROOTS)
    script = (script_tree or tree) / "benchmarks" / f"{benchmark}.py"
    result = subprocess.run([sys.executable, str(script), *arguments], cwd=tree, env=environment,
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"{script} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return json.loads(result.stdout)


def numeric_leaves(document: Any, prefix: str = "") -> Iterator[tuple[str, float]]:
    """Every number in a JSON document, named by its path; a list item is named by its index and its string
    fields (``modes[0 state=memory].ingest[1 form=batch].reports_per_second``), so arms line up by meaning."""
    if isinstance(document, dict):
        for key, value in document.items():
            yield from numeric_leaves(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(document, list):
        for index, item in enumerate(document):
            labels = [f"{k}={v}" for k, v in item.items() if isinstance(v, str)] if isinstance(item, dict) else []
            yield from numeric_leaves(item, f"{prefix}[{' '.join([str(index), *labels])}]")
    elif isinstance(document, (int, float)) and not isinstance(document, bool):
        yield prefix, float(document)


def summarise(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    medians: dict[str, dict[str, float]] = {}
    for arm, documents in rounds.items():
        values: dict[str, list[float]] = {}
        for document in documents:
            for path, value in numeric_leaves(document):
                values.setdefault(path, []).append(value)
        medians[arm] = {path: statistics.median(v) for path, v in values.items()}
    common = sorted(set(medians["base"]) & set(medians["head"]))
    return {
        path: {"base": medians["base"][path], "head": medians["head"][path],
               "head_over_base": medians["head"][path] / medians["base"][path] if medians["base"][path] else None}
        for path in common
    }


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the baseline revision (a commit, tag or branch)")
    parser.add_argument("--benchmark", required=True, help="a benchmark of benchmarks/, without .py")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each runs both arms once (default 3)")
    parser.add_argument("--script", choices=("each", "head"), default="each",
                        help="whose benchmark script each arm runs: its own (default) or the working tree's")
    parser.add_argument("arguments", nargs="*", help="arguments for the benchmark (after --)")
    options = parser.parse_args(argv)
    if options.rounds < 1:
        parser.error("--rounds: must be at least 1")
    with tempfile.TemporaryDirectory(prefix="knittrans-ab-") as scratch:
        base_tree = Path(scratch) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(base_tree),
                        options.base], check=True)
        try:
            rounds: dict[str, list[dict[str, Any]]] = {"base": [], "head": []}
            for number in range(options.rounds):
                order = [("base", base_tree), ("head", ROOT)]
                for arm, tree in order if number % 2 == 0 else reversed(order):
                    logger.info("round %d/%d: %s", number + 1, options.rounds, arm)
                    script_tree = ROOT if options.script == "head" else None
                    rounds[arm].append(run_arm(tree, options.benchmark, options.arguments, script_tree))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_tree)], check=False)
    print(json.dumps({"benchmark": options.benchmark, "base": options.base, "rounds": options.rounds,
                      "script": options.script,
                      "arguments": options.arguments, "medians": summarise(rounds), "runs": rounds}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
