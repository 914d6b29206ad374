"""Encoder gradients return to the encoding they belong to, whatever order routes and encoder micro-batches
are listed in (issue 13).

Ranks run as gloo subprocesses (wire_order_worker.py), one launch per world size. Hypothesis draws the
examples here, the workers loop over all of them in that one launch and report measurements; the assertions
are made here, so a failing example never leaves a rank waiting in a collective. The oracle is a naive
single-process path, written in the worker independently of the library, that re-encodes every reference on
its own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.gloo_ranks import run_ranks

WORKER = Path(__file__).with_name("wire_order_worker.py")
TOLERANCE = 1e-5  # relative to each tensor's largest entry; float64 round-off is ~1e-15
EXAMPLES_PER_WORLD = 5

# (dp, cp, tp) with dp·cp·tp = world size
TOPOLOGIES = {
    2: [(2, 1, 1), (1, 2, 1), (1, 1, 2)],
    4: [(4, 1, 1), (2, 2, 1), (2, 1, 2), (1, 2, 2), (1, 1, 4), (1, 4, 1)],
}


@st.composite
def examples(draw: st.DrawFn, world: int) -> dict:
    dp, cp, tp = draw(st.sampled_from(TOPOLOGIES[world]))
    encoder_dp = draw(st.integers(1, world))
    return {
        "dp": dp,
        "cp": cp,
        "tp": tp,
        "encoder_dp": encoder_dp,
        "encoder_max_cost": draw(st.integers(1, 3)),
        # Encoder DP rank d runs on global rank owners[d]: owners land anywhere, not only on ranks 0..dp-1.
        "owners": draw(st.permutations(range(world)))[:encoder_dp],
        "samples": draw(st.integers(1, 3)),
        "group_size": draw(st.integers(2, 4)),
        "images_per_sample": draw(st.integers(1, 2)),
        "seed": draw(st.integers(0, 2**31 - 1)),  # workload, model initialisation, and the order shuffles
    }


def draw_examples(world: int) -> list[dict]:
    """A reproducible handful of hypothesis examples (derandomized: the same list on every run)."""
    drawn: list[dict] = []

    @settings(
        max_examples=EXAMPLES_PER_WORLD,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(examples(world))
    def collect(example: dict) -> None:
        drawn.append(example)

    collect()
    return drawn


def run_examples(world_size: int, examples_list: list[dict], out: Path) -> list[dict]:
    (out / "examples.json").write_text(json.dumps(examples_list))
    return run_ranks(WORKER, world_size, out, extra_args=[f"--examples={out / 'examples.json'}"], timeout=600)


def launch(world: int, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], list[dict]]:
    drawn = draw_examples(world)
    return drawn, run_examples(world, drawn, tmp_path_factory.mktemp(f"wire_order_{world}"))


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], list[dict]]:
    return launch(2, tmp_path_factory)


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], list[dict]]:
    return launch(4, tmp_path_factory)


def test_gradient_returns_to_its_own_encoding_whatever_the_route_order(two_ranks) -> None:
    """Rank 0 owns ("b", "a"); rank 1's loss is 1·E(a) + 10·E(b): the encoder gradient is [1, 10] both ways."""
    _, results = two_ranks
    assert results[0]["repro"] == {"ba": [1.0, 10.0], "ab": [1.0, 10.0]}
    assert results[1]["repro"] == {"ba": [], "ab": []}  # rank 1 owns no encoding


@pytest.mark.parametrize("family", ["vit", "conv_groupnorm"])
@pytest.mark.parametrize("launched", ["two_ranks", "four_ranks"])
def test_planner_schedules_in_any_order_train_like_the_naive_path(
    request: pytest.FixtureRequest, launched: str, family: str
) -> None:
    drawn, results = request.getfixturevalue(launched)
    assert any(outcome["cross_rank_routes"] for outcome in results[0]["examples"]), "nothing crossed ranks"
    for rank, result in enumerate(results):
        for example, outcome in zip(drawn, result["examples"], strict=True):
            assert outcome["all_trajectories_planned"], example
            measured = outcome[family]
            assert measured["encoder_gradient_scale"] > 0, (example, measured)
            for quantity in ("encoder", "backbone", "params_after_adamw"):
                assert measured[quantity] < TOLERANCE, (rank, quantity, example, measured)
