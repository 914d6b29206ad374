"""The trajectories of a mini-batch as one set of columns in DP-rank order, from which each rank's batch is cut.

A DP rank's assignment carries its trajectories as a ``TrajectoryBatch`` (``RankAssignment.trajectories``), cut
from columns the service holds anyway, instead of one ``TrajectoryMetadata`` message per trajectory (building
those was the largest cost of dispatching a large mini-batch). A mini-batch's trajectories come from several
reports (blocks of columns): :func:`columns_in_order` takes each block's rows once with numpy and puts them in the
order the ranks carry them, so each rank's batch is a contiguous run, cut with slices
(:meth:`TrajectoryColumns.take_range`): cutting 64 ranks' batches one fancy index at a time cost more than the
whole gather.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from knittrans.admission.service.block_merge import merge_rows
from knittrans.admission.service.trajectory_columns import TrajectoryColumns


def columns_in_order(located: Sequence[tuple[TrajectoryColumns, int]], order: Sequence[int]) -> TrajectoryColumns:
    """The trajectories ``located[t]`` for each t of ``order``, in that order, as one block of columns."""
    blocks: dict[int, tuple[TrajectoryColumns, list[int], list[int]]] = {}
    for position, t in enumerate(order):
        columns, row = located[t]
        entry = blocks.get(id(columns))
        if entry is None:
            entry = blocks[id(columns)] = (columns, [], [])
        entry[1].append(row)
        entry[2].append(position)
    if len(blocks) <= 1:
        return merge_rows([(columns, rows) for columns, rows, _ in blocks.values()])
    # Each block's rows once (grouped by block), then the grouped rows put in order: two passes, however
    # finely the admission order interleaves the reports.
    grouped = merge_rows([(columns, rows) for columns, rows, _ in blocks.values()])
    positions = np.concatenate([np.asarray(p, dtype=np.int64) for _, _, p in blocks.values()])
    source = np.empty(len(positions), dtype=np.int64)
    source[positions] = np.arange(len(positions), dtype=np.int64)
    return merge_rows([(grouped, source)])
