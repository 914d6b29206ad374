"""The demo training step across gloo processes equals one process on the same data, to float32 round-off.

With cp = 2 every CP rank holds two zigzag chunks of each sequence, all-gathers keys and values and masks by
global positions; image placeholders are cut by chunk boundaries and filled from deduplicated encodings on
both sides. Loss, gradients (after the all-reduce) and the parameters after two optimizer steps must match
the single-process reference. dp = 2, cp = 2 adds data parallelism and the loss normalisation across it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gloo_ranks import run_ranks

WORKER = Path(__file__).with_name("demo_train_worker.py")
GRAD_TOLERANCE = 2e-5  # relative to each tensor's largest entry
PARAM_TOLERANCE = 1e-5


def run_demo_ranks(dp: int, cp: int, out: Path) -> list[dict]:
    return run_ranks(WORKER, dp * cp, out, extra_args=[f"--dp={dp}", f"--cp={cp}"])


@pytest.mark.parametrize(("dp", "cp"), [(1, 2), (2, 2)])
def test_distributed_step_equals_one_process(dp: int, cp: int, tmp_path: Path) -> None:
    results = run_demo_ranks(dp, cp, tmp_path)
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
