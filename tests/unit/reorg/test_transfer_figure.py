"""The transfer benchmark's figure (benchmarks/transfer_plot.py): each bar is an arm's median over the runs that
have the figure, the dots are those runs. The oracle is a plain sort-and-pick median over the runs' values, the
arms' order shuffled in every run as the benchmark alternates it."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from types import ModuleType

from hypothesis import given, settings
from hypothesis import strategies as st

MODULE = Path(__file__).resolve().parents[3] / "benchmarks" / "transfer_plot.py"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def load_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("transfer_plot_under_test", MODULE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


plot = load_module()


def naive_median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


ARMS = ["transferqueue-b-tp-shared", "transferqueue-streaming-prefetch", "knittrans-iter-file",
        "knittrans-eager-mooncake"]
value = st.one_of(st.none(), st.floats(min_value=1e-4, max_value=10.0))


@settings(max_examples=60, deadline=None)
@given(table=st.lists(st.fixed_dictionaries({arm: value for arm in ARMS}), min_size=1, max_size=5),
       seed=st.integers(0, 2**16))
def test_each_bar_is_the_median_of_the_runs_that_have_the_figure(table: list[dict[str, float | None]],
                                                                  seed: int) -> None:
    shuffler = random.Random(seed)
    runs = []
    for row in table:
        names = list(row)
        shuffler.shuffle(names)
        runs.append({"arms": {name: {"medium": f"medium of {name}", plot.COLD_KEY: row[name]} for name in names}})
    bars = {bar.arm: bar for bar in plot.arm_figures(runs, plot.COLD_KEY)}
    expected = {arm: [row[arm] for row in table if row[arm] is not None] for arm in ARMS}
    assert set(bars) == {arm for arm, values in expected.items() if values}
    for arm, bar in bars.items():
        assert list(bar.per_run_s) == expected[arm]
        assert bar.median_s == naive_median(expected[arm])
        assert bar.medium == f"medium of {arm}"
        assert bar.transferqueue == arm.startswith("transferqueue")
    first_order = list(runs[0]["arms"])
    assert list(bars) == [arm for arm in first_order if arm in bars]  # the first run's order, every run's arms


def test_the_figure_is_written_with_and_without_transferqueue_arms(tmp_path: Path) -> None:
    both = [{"arms": {"transferqueue-b-tp-shared": {"medium": "SimpleStorage", plot.COLD_KEY: 2.1,
                                                    plot.STEADY_KEY: None},
                      "knittrans-iter-file": {"medium": "file", plot.COLD_KEY: 0.17 + 0.01 * r,
                                              plot.STEADY_KEY: 0.003}}} for r in range(3)]
    ours_only = [{"arms": {"knittrans-iter-file": {"medium": "file", plot.COLD_KEY: 0.2, plot.STEADY_KEY: None}}}]
    summary = {"ratio_medians": {"cold_strongest_tq_over_knittrans_iter_file": 12.4}}
    for name, runs in (("both.png", both), ("ours.png", ours_only)):
        path = tmp_path / name
        plot.plot_transfer(summary if runs is both else {}, runs, path, ratio_target=100, steady_target_s=0.005)
        assert path.read_bytes()[:8] == PNG_MAGIC


@settings(max_examples=40, deadline=None)
@given(media=st.lists(st.sampled_from(["memory", "file", "mooncake"]), min_size=len(ARMS), max_size=len(ARMS)),
       seed=st.integers(0, 2**16))
def test_the_media_legend_names_each_arm_once_under_its_own_medium(media: list[str], seed: int) -> None:
    medium_of = dict(zip(ARMS, media, strict=True))
    bars = [plot.ArmFigure(arm=arm, medium=medium_of[arm], per_run_s=(1.0,)) for arm in ARMS * 2]  # both panels
    random.Random(seed).shuffle(bars)
    lines = plot.media_legend(bars)
    assert len(lines) == len(set(media))
    named = {}
    for line in lines:
        arms, _, medium = line.partition(": ")
        for arm in arms.split(", "):
            assert arm not in named
            named[arm] = medium
    assert named == medium_of
