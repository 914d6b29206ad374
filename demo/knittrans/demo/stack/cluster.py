"""`knittrans demo --nodes 3`: the demo's stack on three network hosts built from Linux network namespaces.

This process builds the namespaces (:class:`~knittrans.demo.stack.namespaces.NamespaceCluster`), then runs the
demo's driver on node0, where it can reach every node: ``python -m knittrans.demo.stack.cluster SETTINGS LAYOUT``.
The driver starts each part on its node (see :mod:`knittrans.demo.stack.run`) and prints the usual report; this
process returns its exit status and tears every namespace down, whatever happened.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import yaml

from knittrans.config import load_config
from knittrans.demo.stack.namespaces import NamespaceCluster, Node, namespaces_unavailable
from knittrans.demo.stack.settings import DEFAULT_OUT, DemoSettings
from knittrans.errors import FailedPrecondition

NODES = 3


def run_cluster_demo(settings: DemoSettings, *, tag: str | None = None) -> int:
    reason = namespaces_unavailable()
    if reason:
        raise FailedPrecondition(f"--nodes {settings.nodes} needs Linux network namespaces: {reason}")
    cluster = NamespaceCluster(nodes_wanted=NODES, **({"tag": tag} if tag else {}))
    with tempfile.TemporaryDirectory(prefix="knittrans-cluster-") as scratch, cluster:
        settings_path = Path(scratch) / "settings.yaml"
        # Plain values all the way down (a StrEnum is a str, a tuple a list), as the config loader reads them back.
        values = json.loads(json.dumps(asdict(settings), default=str))
        # The driver runs from another directory.
        values["out"] = str(Path(settings.out or DEFAULT_OUT).resolve())
        settings_path.write_text(yaml.safe_dump(values))
        layout_path = Path(scratch) / "layout.json"
        layout_path.write_text(json.dumps([asdict(node) for node in cluster.nodes]))
        driver = cluster.nodes[0].command(
            [sys.executable, "-m", "knittrans.demo.stack.cluster", str(settings_path), str(layout_path)])
        return subprocess.run(driver, cwd=scratch).returncode


def main(argv: list[str]) -> int:
    """The driver, on node0: run the demo with its parts placed on the nodes of the layout."""
    from knittrans.cli import configure_logging
    from knittrans.demo.cli import run_and_summarize

    configure_logging("INFO")
    settings_path, layout_path = argv
    settings = load_config(DemoSettings, path=settings_path, env={})
    nodes = [Node(**node) for node in json.loads(Path(layout_path).read_text())]
    return run_and_summarize(settings, nodes)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
