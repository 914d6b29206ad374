"""Encoding reuse across 2 and 4 gloo processes equals the duplicated path, and fails together before backward.

Each run starts its ranks as subprocesses (dist_worker.py) on a free loopback port; every rank computes the
duplicated-path reference itself and reports its differences as JSON.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.gloo_ranks import run_ranks

WORKER = Path(__file__).with_name("dist_worker.py")
TOLERANCE = 2e-5  # relative to each tensor's largest entry: float32 round-off




@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return run_ranks(WORKER, 2, tmp_path_factory.mktemp("two_ranks"))


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return run_ranks(WORKER, 4, tmp_path_factory.mktemp("four_ranks"))


def assert_matches_duplicated_path(results: list[dict], scenario: str) -> None:
    for rank, result in enumerate(results):
        outcome = result[scenario]
        assert outcome["encoder"] < TOLERANCE, (rank, outcome)
        assert outcome["backbone"] < TOLERANCE, (rank, outcome)
        assert outcome["params_after_step"] < 1e-6, (rank, outcome)
        assert outcome["smallest_parameter_move"] > 1e-5, (rank, outcome)


def test_two_data_parallel_ranks_with_remote_encoders(two_ranks: list[dict]) -> None:
    assert_matches_duplicated_path(two_ranks, "dp2")
    reports = [result["dp2"]["report"] for result in two_ranks]
    # Sample 2 is encoded on rank 1 and consumed only on rank 0: encodings and gradients cross both ways.
    assert all(r["rows_sent"] > 0 and r["rows_received"] > 0 for r in reports)
    assert reports[0]["rows_sent"] == reports[1]["rows_received"]
    assert reports[0]["gradient_rows_sent"] == reports[1]["gradient_rows_received"]
    assert reports[0]["encodings_cached"] == 6 and reports[0]["encodings_computed"] == 2


def test_tp_replicas_return_disjoint_rows(four_ranks: list[dict]) -> None:
    assert_matches_duplicated_path(four_ranks, "dp2tp2")
    # Had both replicas of a TP group returned every row, encoder gradients would be doubled above.
    reports = [result["dp2tp2"]["report"] for result in four_ranks]
    assert all(r["encodings_cached"] == 6 for r in reports)
    assert sum(r["gradient_rows_sent"] for r in reports) == sum(r["gradient_rows_received"] for r in reports)


def test_cp_boundary_copies_and_tp_replicas(four_ranks: list[dict]) -> None:
    assert_matches_duplicated_path(four_ranks, "cp2tp2")
    # Some image is split by a chunk boundary: one CP rank takes its leading rows, the other the rest.
    partial = [
        {(use["key"], use["first_row"], use["num_rows"]) for micro in result["cp2tp2"]["uses"] for use in micro}
        for result in four_ranks
    ]
    cp0, cp1 = partial[0], partial[2]  # ranks 0 and 2 are tp rank 0 of cp ranks 0 and 1
    assert any(first > 0 for _, first, _ in cp0 | cp1)
    split_keys = {key for key, first, rows in cp0 | cp1 if first > 0 or rows < 4}
    assert any(key in {k for k, _, _ in cp0} and key in {k for k, _, _ in cp1} for key in split_keys)


@pytest.mark.parametrize(
    ("scenario", "failing_rank_message", "other_rank_message"),
    [
        ("mismatched_schedules", "ranks disagree on the schedule", "ranks disagree on the schedule"),
        ("bad_encoder_output", "returned 1 encodings for 2 keys", r"rank\(s\) \[1\] failed the encoder output check"),
    ],
)
def test_every_rank_fails_before_any_backward(
    two_ranks: list[dict], scenario: str, failing_rank_message: str, other_rank_message: str
) -> None:
    for rank, result in enumerate(two_ranks):
        outcome = result[scenario]
        assert outcome["error_type"] == "FailedPrecondition", (rank, outcome)
        assert re.search(failing_rank_message if rank == 1 else other_rank_message, outcome["message"]), outcome
        assert outcome["backbone_steps"] == 0 and outcome["any_gradient"] is False
