"""The demo training step across gloo processes equals one process on the same data, to float32 round-off.

With cp = 2 every CP rank holds two zigzag chunks of each sequence, all-gathers keys and values and masks by
global positions; image placeholders are cut by chunk boundaries and filled from deduplicated encodings on
both sides. Loss, gradients (after the all-reduce) and the parameters after two optimizer steps must match
the single-process reference. dp = 2, cp = 2 adds data parallelism and the loss normalisation across it.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("demo_train_worker.py")
GRAD_TOLERANCE = 2e-5  # relative to each tensor's largest entry
PARAM_TOLERANCE = 1e-5


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_ranks(dp: int, cp: int, out: Path) -> list[dict]:
    world_size = dp * cp
    port = free_port()
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                f"--rank={rank}",
                f"--world-size={world_size}",
                f"--dp={dp}",
                f"--cp={cp}",
                f"--port={port}",
                f"--out={out}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for rank in range(world_size)
    ]
    logs = []
    try:
        for process in processes:
            logs.append(process.communicate(timeout=150)[0].decode(errors="replace"))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    for rank, (process, log) in enumerate(zip(processes, logs, strict=True)):
        assert process.returncode == 0, f"rank {rank} exited with {process.returncode}:\n{log}"
    results = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(world_size)]
    for rank, result in enumerate(results):
        assert "crash" not in result, f"rank {rank} crashed:\n{result['crash']}"
    return results


@pytest.mark.parametrize(("dp", "cp"), [(1, 2), (2, 2)])
def test_distributed_step_equals_one_process(dp: int, cp: int, tmp_path: Path) -> None:
    results = run_ranks(dp, cp, tmp_path)
    assert sum(r["cut_placeholders"] for r in results) > 0  # some image is split across CP ranks
    for rank, result in enumerate(results):
        # The schedule gathered from each rank's own assignments equals the one derived from the full plan.
        assert result["schedules_agree"], rank
        for step in result["steps"]:
            assert step["loss_tokens"] == step["reference_loss_tokens"], (rank, step)
            assert abs(step["loss"] - step["reference_loss"]) <= 1e-5 * step["reference_loss"], (rank, step)
            assert step["grad_encoder"] < GRAD_TOLERANCE, (rank, step)
            assert step["grad_backbone"] < GRAD_TOLERANCE, (rank, step)
            # One encoding per unique image, shared by its group of trajectories.
            assert step["encoding_references"] == 4 * step["encodings_computed"], (rank, step)
        assert result["params_after_steps"] < PARAM_TOLERANCE, (rank, result)
