"""Launch a multi-process gloo test: one Python process per rank running a worker script, each writing
``rank<N>.json`` into ``out`` (a ``crash`` key holds a rank's traceback)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_ranks(worker: Path, world_size: int, out: Path, *, extra_args: Sequence[str] = (),
              timeout: float = 150) -> list[dict]:
    """Run every rank to completion and return their results in rank order; fail naming a rank that exited
    non-zero (with its output) or crashed."""
    port = free_port()
    processes = [
        subprocess.Popen(
            [sys.executable, str(worker), f"--rank={rank}", f"--world-size={world_size}", f"--port={port}",
             f"--out={out}", *extra_args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for rank in range(world_size)
    ]
    logs = []
    try:
        for process in processes:
            logs.append(process.communicate(timeout=timeout)[0].decode(errors="replace"))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    for rank, (process, log) in enumerate(zip(processes, logs, strict=True)):
        assert process.returncode == 0, f"rank {rank} exited with {process.returncode}:\n{log}"
    results = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(world_size)]
    crashes = [f"rank {rank} crashed:\n{result['crash']}" for rank, result in enumerate(results) if "crash" in result]
    assert not crashes, "\n".join(crashes)
    return results
