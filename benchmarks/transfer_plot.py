"""The transfer benchmark's figure: each arm's exposed transfer on the one clock, cold step and steady state.

Two panels share one log scale of seconds: the cold first step (left) and the steady state per step (right). Each
arm is a bar at its median over the runs, with a dot per run, so the spread between runs is seen beside the
median. The left panel marks where KnitTrans iter would have to be for the 100x target (the strongest
TransferQueue arm's median over 100), the right one the 5 ms steady-state target. The title gives the ratios of
the summary (the median over runs of each run's own ratio, not a ratio of medians); a footer names each arm's
medium.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

COLD_KEY = "exposed_one_clock_cold_s"
STEADY_KEY = "exposed_one_clock_steady_s_per_step"


@dataclass(frozen=True, kw_only=True)
class ArmFigure:
    """One bar: an arm's values of one figure in every run that has it, and their median."""

    arm: str
    medium: str
    per_run_s: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.per_run_s:
            raise ValueError(f"{self.arm}: per_run_s is empty")

    @property
    def median_s(self) -> float:
        return statistics.median(self.per_run_s)

    @property
    def transferqueue(self) -> bool:
        return self.arm.startswith("transferqueue-")


def arm_figures(runs: Sequence[Mapping[str, Any]], key: str) -> list[ArmFigure]:
    """The bars of figure ``key`` (say ``exposed_one_clock_cold_s``): every arm with a value in some run, in the
    order the arms first appear (the runs alternate their order; the figure keeps one)."""
    order: dict[str, str] = {}
    values: dict[str, list[float]] = {}
    for run in runs:
        for name, figures in run["arms"].items():
            order.setdefault(name, figures.get("medium", ""))
            value = figures.get(key)
            if value is not None:
                values.setdefault(name, []).append(float(value))
    return [ArmFigure(arm=name, medium=medium, per_run_s=tuple(values[name])) for name, medium in order.items()
            if name in values]


def media_legend(bars: Sequence[ArmFigure]) -> list[str]:
    """One line per medium: the arms that read from it, then the medium."""
    arms_of: dict[str, list[str]] = {}
    for bar in bars:
        arms = arms_of.setdefault(bar.medium, [])
        if bar.arm not in arms:
            arms.append(bar.arm)
    return [f"{', '.join(arms)}: {medium}" for medium, arms in arms_of.items()]


def _label(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1e3:.1f} ms"


def _panel(axis: Any, bars: Sequence[ArmFigure], title: str) -> None:
    rows = range(len(bars))
    colours = ["tab:orange" if bar.transferqueue else "tab:blue" for bar in bars]
    axis.barh(list(rows), [bar.median_s for bar in bars], color=colours, alpha=0.55)
    for row, bar in zip(rows, bars, strict=True):
        axis.scatter(bar.per_run_s, [row] * len(bar.per_run_s), color="black", s=12, zorder=3)
        axis.annotate(_label(bar.median_s), (max(bar.per_run_s), row), xytext=(6, 0), textcoords="offset points",
                      va="center", fontsize="small")
    axis.set_yticks(list(rows), [bar.arm for bar in bars], fontsize="small")
    axis.invert_yaxis()  # the first arm on top
    axis.set_xscale("log")
    axis.set_xlabel("seconds, log scale")
    axis.set_title(title, fontsize="medium")


def plot_transfer(summary: Mapping[str, Any], runs: Sequence[Mapping[str, Any]], path: str | Path, *,
                  ratio_target: float, steady_target_s: float) -> None:
    """Write the figure of one benchmark run (its ``summary`` and ``runs``) to ``path`` as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cold, steady = arm_figures(runs, COLD_KEY), arm_figures(runs, STEADY_KEY)
    media = media_legend([*cold, *steady])
    figure, axes = plt.subplots(1, 2, figsize=(15, 0.45 * max(len(cold), len(steady), 4) + 2.2 + 0.2 * len(media)))
    _panel(axes[0], cold, "cold first step, exposed")
    _panel(axes[1], steady, "steady state, exposed per step")
    queue_cold = [bar.median_s for bar in cold if bar.transferqueue]
    if queue_cold:
        axes[0].axvline(min(queue_cold) / ratio_target, color="tab:red", linestyle="--",
                        label=f"{ratio_target:.0f}x under the strongest TransferQueue arm")
        axes[0].legend(fontsize="small", loc="lower right")
    axes[1].axvline(steady_target_s, color="tab:red", linestyle="--", label=f"target {_label(steady_target_s)}")
    axes[1].legend(fontsize="small", loc="lower right")
    cold_ratios = {key.rsplit("_", 1)[1]: value for key, value in summary.get("ratio_medians", {}).items()
                   if key.startswith("cold_strongest_tq_over_knittrans_iter_") and value is not None}
    ratio_text = ", ".join(f"{store} {value:.1f}x" for store, value in cold_ratios.items())
    figure.suptitle(f"One clock, {len(runs)} interleaved run(s): bars are medians, dots single runs"
                    + (f"; cold, strongest TransferQueue arm over KnitTrans iter: {ratio_text}" if ratio_text else ""),
                    fontsize="medium")
    # Which medium each arm reads from, under the panels: the arms' names do not say it for TransferQueue's.
    figure.text(0.01, 0.01, "\n".join(media), fontsize="small", va="bottom")
    figure.tight_layout(rect=(0, 0.03 * len(media), 1, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)
