"""Naming the trajectory and the unit behind a micro-batch the sidecar could not read or pack.

A failed read or pack raises an error whose ``field`` says where it went wrong: a unit key (the store), or a
path into the micro-batch such as ``items[2].reads[1]`` (the packer) or ``microbatches[0].items[2]...``
(decoding). :func:`blame` turns that into a :class:`~knittrans.trainer.descriptor.MiniBatchFailure`; when the
error names neither (a batched read that failed on some unit), :func:`blame_by_probing` reads the units one at
a time to find it.
"""

from __future__ import annotations

import re

import numpy as np

from knittrans.errors import KnitTransError
from knittrans.plan import EncoderMicroBatchAssignment, MicroBatchAssignment
from knittrans.reorg.packing import PackLayout
from knittrans.store.protocol import UnitRead, UnitStore
from knittrans.trainer.descriptor import MiniBatchFailure

MAX_REASON = 1024  # characters, as the admission service accepts
_ITEM = re.compile(r"items\[(\d+)\](?:\.reads\[(\d+)\])?")


def _reason(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


def unit_owners(micro: MicroBatchAssignment | EncoderMicroBatchAssignment | None) -> dict[str, str]:
    """Unit key -> the trajectory it belongs to ("" for a multimodal input, which a whole sample shares)."""
    if isinstance(micro, MicroBatchAssignment):
        return {read.unit.key: item.trajectory.trajectory_id for item in micro.items for read in item.reads}
    if isinstance(micro, EncoderMicroBatchAssignment):
        return {e.encoding.key: "" for e in micro.encodings}
    return {}


def blame(micro: MicroBatchAssignment | EncoderMicroBatchAssignment | None, error: BaseException) -> MiniBatchFailure:
    """The failure ``error`` describes, with its trajectory and unit when the error's field names them."""
    reason = _reason(error)
    field = error.field if isinstance(error, KnitTransError) and error.field else ""
    owners = unit_owners(micro)
    if field in owners:
        return MiniBatchFailure(trajectory_id=owners[field], unit_key=field, reason=reason)
    match = _ITEM.search(field)
    if match is not None and isinstance(micro, MicroBatchAssignment) and int(match[1]) < len(micro.items):
        item = micro.items[int(match[1])]
        unit_key = ""
        if match[2] is not None and int(match[2]) < len(item.reads):
            unit_key = item.reads[int(match[2])].unit.key
        return MiniBatchFailure(trajectory_id=item.trajectory.trajectory_id, unit_key=unit_key, reason=reason)
    return MiniBatchFailure(reason=reason)


def blame_by_probing(
    micro: MicroBatchAssignment | EncoderMicroBatchAssignment | None,
    layout: PackLayout | None,
    store: UnitStore,
    error: BaseException,
) -> MiniBatchFailure:
    """:func:`blame`, reading the micro-batch's units one at a time when the error names no unit: the first one
    that fails to read, or reads short, is to blame. Only runs after a failure, so its extra reads cost nothing
    in the normal case."""
    failure = blame(micro, error)
    if failure.unit_key or layout is None:
        return failure
    owners = unit_owners(micro)
    for placement in layout.reads:
        buffer = np.zeros(max(placement.byte_length, 1), dtype=np.uint8)
        try:
            count = store.get_many_into([UnitRead.of(placement.key, buffer[: placement.byte_length],
                                                     placement.ranges)])[0]
        except KnitTransError as probe_error:
            return MiniBatchFailure(trajectory_id=owners.get(placement.key, failure.trajectory_id),
                                    unit_key=placement.key, reason=f"{failure.reason} ({_reason(probe_error)})"[
                                        :MAX_REASON])
        if count != placement.byte_length:
            return MiniBatchFailure(
                trajectory_id=owners.get(placement.key, failure.trajectory_id), unit_key=placement.key,
                reason=f"{failure.reason} (the unit gives {count} bytes, its header {placement.byte_length})"[
                    :MAX_REASON])
    return failure
