"""The replay's figure: one row per policy.

Left, like the paper's Figure 10(a): each train batch's per-source composition against its quota (bars
below their quota are hatched red). Right, like Figure 3(b): for the middle train batch, each source's rollout
progress since the train batch started (finished trajectories over its quota) against time, with a line at
every mini-batch admission.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from pathlib import Path

from knittrans.admission.replay.driver import PolicyResult
from knittrans.admission.replay.trace import Trace


def plot_replay(trace: Trace, results: Sequence[PolicyResult], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not results:
        return
    sources = list(results[0].quotas)
    colours = plt.get_cmap("tab10")
    progress = _rollout_progress(trace, sources)
    figure, axes = plt.subplots(
        len(results), 2, figsize=(15, 3.2 * len(results)), squeeze=False, gridspec_kw={"width_ratios": [3, 2]}
    )
    for row, result in enumerate(results):
        _composition(axes[row][0], result, sources, colours)
        _timeline(axes[row][1], result, sources, colours, progress)
    axes[0][0].legend(ncols=len(sources) + 1, fontsize="small", loc="lower left", bbox_to_anchor=(0, 1.12))
    axes[0][1].legend(fontsize="small", loc="lower left", bbox_to_anchor=(0, 1.12), ncols=len(sources))
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _rollout_progress(trace: Trace, sources: list[str]) -> dict[str, list[float]]:
    """Finish times per source, sorted."""
    times: dict[str, list[float]] = {source: [] for source in sources}
    for index in trace.arrival_order:
        record = trace.records[index]
        if record.source in times and record.end is not None:
            times[record.source].append(record.end)
    return times


def _composition(axis, result: PolicyResult, sources: list[str], colours) -> None:  # type: ignore[no-untyped-def]
    width = 0.8 / max(1, len(sources))
    lowest = min(
        [min(result.quotas.values(), default=0)]
        + [count for batch in result.train_batches for count in batch.composition.values()]
    )
    for s, source in enumerate(sources):
        xs = [b.index + (s - (len(sources) - 1) / 2) * width for b in result.train_batches]
        counts = [b.composition[source] for b in result.train_batches]
        quota = result.quotas[source]
        axis.bar(xs, counts, width=width, color=colours(s), label=source)
        below = [(x, c) for x, c in zip(xs, counts, strict=True) if c < quota]
        if below:
            axis.bar([x for x, _ in below], [c for _, c in below], width=width, color="none", edgecolor="red",
                     hatch="///", linewidth=0.8)
        axis.scatter(xs, [quota] * len(xs), marker="_", color="black", s=40, zorder=3,
                     label="quota" if s == 0 else None)
    axis.set_ylim(bottom=max(0.0, lowest * 0.85))
    axis.set_title(
        f"{result.policy.value}: composition per train batch ({result.violations} below a quota, hatched)",
        fontsize="medium",
    )
    axis.set_xlabel("train batch")
    axis.set_ylabel("admitted units")


def _timeline(axis, result: PolicyResult, sources: list[str], colours, progress) -> None:  # type: ignore[no-untyped-def]
    if not result.train_batches:
        axis.set_title(f"{result.policy.value}: no train batch completed", fontsize="medium")
        return
    batch = result.train_batches[len(result.train_batches) // 2]
    start, final = batch.start, batch.admit_times[-1]
    horizon = final + 0.1 * max(final - start, 1.0)
    for s, source in enumerate(sources):
        ends = progress[source]
        first, last = bisect_right(ends, start), bisect_right(ends, horizon)
        quota = max(1, result.quotas[source])
        xs = [start, *ends[first:last], horizon]
        ys = [0.0, *((i + 1) / quota for i in range(last - first)), (last - first) / quota]
        axis.step(xs, ys, where="post", color=colours(s), linewidth=1.2, label=f"{source} finished / quota")
    for position, when in enumerate(batch.admit_times):
        final = position == len(batch.admit_times) - 1
        axis.axvline(when, color="black", linewidth=0.8, linestyle="-" if final else "--")
        axis.annotate(f"t{position + 1}", (when, 0), xytext=(2, 2), textcoords="offset points", fontsize="small")
    fraction = batch.first_admit_fraction
    axis.set_title(
        f"train batch {batch.index}: first mini-batch at "
        f"{'-' if fraction is None else f'{fraction:.0%}'} of the interval to the final admission",
        fontsize="medium",
    )
    axis.set_xlabel("time (s)")
    axis.set_ylabel("rollout progress")
