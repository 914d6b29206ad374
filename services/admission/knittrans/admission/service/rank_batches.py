"""The trajectories of a mini-batch as one set of columns, from which each DP rank's batch is cut.

A DP rank's assignment carries its trajectories as a ``TrajectoryBatch`` (``RankAssignment.trajectories``), cut
with numpy from columns the service holds anyway, instead of one ``TrajectoryMetadata`` message per trajectory
(building those was the largest cost of dispatching a large mini-batch). A mini-batch's trajectories come from
several reports (blocks of columns): :func:`gather_columns` takes each block's rows once and joins them into one
:class:`TrajectoryColumns`, so each rank's batch is one :meth:`TrajectoryColumns.take`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from knittrans.admission.service.trajectory_columns import TrajectoryColumns
from knittrans.v1 import trajectory_pb2
from knittrans.wire.trajectory import TRAJECTORY_COLUMNS

_SPARSE_PER_TRAJECTORY = tuple(spec.column for spec in TRAJECTORY_COLUMNS if spec.sparse)
_SPARSE_PER_UNIT = ("unit_alignments", "unit_coverages")


def merge_batches(parts: Sequence[trajectory_pb2.TrajectoryBatch]) -> trajectory_pb2.TrajectoryBatch:
    """One batch holding the trajectories of ``parts``, in order (each part is a valid batch)."""
    if len(parts) == 1:
        return parts[0]
    merged = trajectory_pb2.TrajectoryBatch()
    for part in parts:
        merged.MergeFrom(part)  # repeated fields, and the header columns' own, are concatenated
    _rejoin_indices(merged, parts, "field_names", "unit_fields")
    _rejoin_indices(merged, parts, "encoders", "multimodal_encoders")
    for name in _SPARSE_PER_TRAJECTORY:
        _rejoin_sparse(merged, parts, name, [len(p.trajectory_ids) for p in parts], 0)
    for name in _SPARSE_PER_UNIT:
        _rejoin_sparse(merged, parts, name, [len(p.unit_keys) for p in parts], 0)
    if any(len(p.values) for p in parts) and not all(len(p.values) for p in parts):
        del merged.values[:]
        for part in parts:
            if len(part.values):
                merged.values.extend(part.values)
            else:
                merged.values.extend(trajectory_pb2.TrajectoryValues() for _ in part.trajectory_ids)
    return merged


def _rejoin_indices(merged: trajectory_pb2.TrajectoryBatch, parts: Sequence[trajectory_pb2.TrajectoryBatch],
                    names: str, indices: str) -> None:
    """Each part's ``indices`` point into its own ``names``: make them point into the parts' names joined."""
    joined: dict[str, int] = {}
    for part in parts:
        for name in getattr(part, names):
            joined.setdefault(name, len(joined))
    del getattr(merged, names)[:]
    getattr(merged, names).extend(joined)
    if all(list(getattr(part, names)) == list(joined)[:len(getattr(part, names))] for part in parts):
        return  # every part numbers its names as the joined list does: the concatenated indices are right
    remapped = [np.array([joined[n] for n in getattr(part, names)], dtype=np.int64)[
        np.asarray(getattr(part, indices), dtype=np.int64)] for part in parts]
    column = getattr(merged, indices)
    del column[:]
    column.extend(np.concatenate(remapped).tolist())


def _rejoin_sparse(merged: trajectory_pb2.TrajectoryBatch, parts: Sequence[trajectory_pb2.TrajectoryBatch],
                   name: str, sizes: Sequence[int], zero: int) -> None:
    """A column a part leaves empty when all its values are 0: fill such parts' zeros in when another has it."""
    present = [len(getattr(part, name)) > 0 for part in parts]
    if all(present) or not any(present):
        return
    column = getattr(merged, name)
    del column[:]
    for part, size, has in zip(parts, sizes, present, strict=True):
        column.extend(getattr(part, name) if has else [zero] * size)


def gather_columns(located: Sequence[tuple[TrajectoryColumns, int]]) -> tuple[TrajectoryColumns, np.ndarray]:
    """The located trajectories (rows of blocks) as one set of columns, and where trajectory t of ``located``
    is in it (grouped by block)."""
    blocks: dict[int, tuple[TrajectoryColumns, list[int], list[int]]] = {}
    for t, (columns, row) in enumerate(located):
        entry = blocks.get(id(columns))
        if entry is None:
            entry = blocks[id(columns)] = (columns, [], [])
        entry[1].append(row)
        entry[2].append(t)
    if len(blocks) == 1:
        ((columns, rows, _),) = blocks.values()
        return columns, np.asarray(rows, dtype=np.int64)
    parts = [columns.take(rows) for columns, rows, _ in blocks.values()]
    order = np.concatenate([np.asarray(ts, dtype=np.int64) for _, _, ts in blocks.values()])
    position = np.empty(len(located), dtype=np.int64)
    position[order] = np.arange(len(located), dtype=np.int64)
    return TrajectoryColumns.from_proto(merge_batches(parts)), position
