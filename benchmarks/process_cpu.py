"""Where a timed window's CPU went: the on-CPU time of named groups of processes between two snapshots.

Read from ``/proc/<pid>/task/<tid>/schedstat`` (nanoseconds on a CPU, every thread of the process), which is
exact where ``/proc/<pid>/stat``'s utime and stime count in ticks of 10 ms. A thread that ends between two
snapshots takes its time with it, so a window's figure is a lower bound; the processes measured here keep their
threads for the whole run.

Together with the window's length and the CPUs the run may use, it says whether a window was bound by CPU: a
window whose processes used nearly all of ``cpus x window`` is, and its length then follows the CPU it needs
rather than any one path through it. For a system whose processes are not all known (TransferQueue's Ray
actors and workers), :func:`machine_cpu_seconds` gives the whole machine's share instead, from ``/proc/stat``, in
ticks of 10 ms: to within a few per cent over a window of a second, coarser over a tenth of one.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path


def process_cpu_seconds(pid: int) -> float:
    """On-CPU seconds of every live thread of ``pid`` so far; 0 for a process that has gone."""
    total = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return 0.0
    for task in tasks:
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):  # the thread ended as we read it
            continue
    return total / 1e9


def machine_cpu_seconds() -> tuple[float, float]:
    """(busy, elapsed) CPU-seconds of the whole machine since boot, every CPU together (``/proc/stat``)."""
    ticks = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    idle = ticks[3] + ticks[4]  # idle and iowait
    per_second = os.sysconf("SC_CLK_TCK")
    return (sum(ticks) - idle) / per_second, sum(ticks) / per_second


def machine_busy_fraction(before: tuple[float, float], after: tuple[float, float]) -> float:
    """The share of every CPU of the machine that was busy between two :func:`machine_cpu_seconds`."""
    elapsed = after[1] - before[1]
    return (after[0] - before[0]) / elapsed if elapsed > 0 else 0.0


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0))


@dataclass(frozen=True, kw_only=True)
class CpuMeter:
    """Named groups of processes to meter together (e.g. ``{"admission": [pid], "sidecars": [...]}``)."""

    groups: Mapping[str, tuple[int, ...]]

    @classmethod
    def of(cls, groups: Mapping[str, Iterable[int]]) -> CpuMeter:
        return cls(groups={name: tuple(pids) for name, pids in groups.items()})

    def snapshot(self) -> dict[str, float]:
        return {name: sum(process_cpu_seconds(pid) for pid in pids) for name, pids in self.groups.items()}


def cpu_in_window(before: Mapping[str, float], after: Mapping[str, float], *, window_s: float,
                  cpus: int) -> dict[str, float]:
    """Each group's CPU seconds between the snapshots, their total, and the total's share of ``cpus x window``."""
    used = {f"{name}_cpu_s": max(0.0, after[name] - before[name]) for name in before}
    total = sum(used.values())
    return {**used, "total_cpu_s": total, "cpus": cpus,
            "busy_fraction_of_cpus": total / (cpus * window_s) if window_s > 0 else 0.0}
