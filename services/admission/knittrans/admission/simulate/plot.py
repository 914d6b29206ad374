"""The simulation's figure (PNG, Agg backend).

Top, like the paper's Figures 2(b) and 7: token-mean staleness per train step, disaggregated (solid) and
colocated (dashed) for each policy, with each policy's architectural staleness in the legend; the warm-up
steps are shaded. Bottom, like Figure 3(c): the disaggregated admission timeline of a few train batches in
the middle of the run, one row per policy: a tick per mini-batch admission, a diamond where each train
batch's training and sync end (the version change), so that delayed admission shows as later syncs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from knittrans.admission.simulate.results import PolicySimulation

_TIMELINE_BATCHES = 4


def plot_simulation(results: Sequence[PolicySimulation], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not results:
        return
    colours = plt.get_cmap("tab10")
    figure, (staleness_axis, timeline_axis) = plt.subplots(
        2, 1, figsize=(14, 7.5 + 0.6 * len(results)), gridspec_kw={"height_ratios": [3, 1 + 0.4 * len(results)]}
    )
    _staleness(staleness_axis, results, colours)
    _timeline(timeline_axis, results, colours)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _staleness(axis, results: Sequence[PolicySimulation], colours) -> None:  # type: ignore[no-untyped-def]
    warmup = results[0].disaggregated.warmup
    if warmup:
        axis.axvspan(-0.5, warmup - 0.5, color="0.92", label="warm-up")
    for index, result in enumerate(results):
        colour = colours(index)
        architectural = result.architectural_staleness
        label = f"{result.policy.value} (architectural {'-' if architectural is None else f'{architectural:.3f}'})"
        dis = result.disaggregated.per_step_staleness
        col = result.colocated.per_step_staleness
        axis.plot(range(len(dis)), dis, color=colour, linewidth=1.4, label=label)
        axis.plot(range(len(col)), col, color=colour, linewidth=1.0, linestyle="--")
    axis.plot([], [], color="black", linewidth=1.4, label="disaggregated")
    axis.plot([], [], color="black", linewidth=1.0, linestyle="--", label="colocated")
    axis.set_xlabel("train step")
    axis.set_ylabel("token-mean staleness (versions)")
    axis.set_title("staleness per train step: disaggregated (solid) vs colocated (dashed)", fontsize="medium")
    axis.set_ylim(bottom=0)
    axis.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _timeline(axis, results: Sequence[PolicySimulation], colours) -> None:  # type: ignore[no-untyped-def]
    shortest = min(len(r.disaggregated.steps) for r in results)
    if shortest == 0:
        axis.set_title("no train batch completed", fontsize="medium")
        return
    first = max(0, shortest // 2 - _TIMELINE_BATCHES // 2)
    last = min(shortest, first + _TIMELINE_BATCHES)
    origin = min(r.disaggregated.steps[first].admit_times[0] for r in results)
    for row, result in enumerate(results):
        colour = colours(row)
        for step in result.disaggregated.steps[first:last]:
            times = [t - origin for t in step.admit_times]
            axis.plot(times, [row] * len(times), linestyle="none", marker="|", markersize=14, color=colour)
            axis.plot([step.trained_at - origin], [row], linestyle="none", marker="D", markersize=6, color=colour)
            axis.annotate(str(step.index), (times[0], row), xytext=(0, 8), textcoords="offset points",
                          fontsize="x-small", ha="center")
    axis.set_yticks(range(len(results)), [r.policy.value for r in results])
    axis.set_ylim(-0.7, len(results) - 0.3)
    axis.invert_yaxis()
    axis.set_xlabel(f"seconds since the first admission of train batch {first}")
    axis.set_title(
        f"disaggregated admission timeline, train batches {first}-{last - 1}: | mini-batch admitted, "
        "◆ training and sync done (version change)",
        fontsize="medium",
    )
