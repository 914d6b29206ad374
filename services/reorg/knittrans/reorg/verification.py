"""Checking a consumer's part of a mini-batch against the store before any of it is published (DESIGN.md §9).

Every unit the part reads must be in the store with the byte length its header says. That is one metadata query
for the whole part (:meth:`~knittrans.store.protocol.UnitStore.sizes`), moving no unit bytes, so every consumer
can afford it for every mini-batch, and it depends on nothing but the store: no trainer has to consume anything
for it to finish. What it cannot see (bytes damaged with their length kept) is still caught when the micro-batch
is read and packed, on that consumer only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import accumulate

from knittrans.errors import StoreError, StoreFullError
from knittrans.reorg.assignments import AssignmentEvent
from knittrans.reorg.reader import STORE_RETRY
from knittrans.retry import Backoff
from knittrans.store.protocol import UnitStore
from knittrans.trainer.descriptor import MiniBatchFailure
from knittrans.types import UnitKey
from knittrans.v1 import trajectory_pb2

logger = logging.getLogger(__name__)

_READ_KINDS = (trajectory_pb2.UNIT_KIND_TOKEN_FIELD, trajectory_pb2.UNIT_KIND_FIELD)  # what a backbone item reads


@dataclass(frozen=True, kw_only=True)
class StoredUnit:
    """A unit the part reads: its key, the bytes its header says (None when the rollout reported no header), the
    trajectory it belongs to (for a multimodal input, the first trajectory its output is routed to) and the first
    micro-batch that reads it."""

    key: UnitKey
    byte_length: int | None
    trajectory_id: str
    microbatch_index: int


@dataclass(frozen=True, kw_only=True)
class VerificationFailure:
    """The first unit of the part that is missing or of the wrong size."""

    microbatch_index: int
    failure: MiniBatchFailure


def stored_units(event: AssignmentEvent) -> list[StoredUnit]:
    """Every unit the consumer's part of ``event`` reads, once each, in reading order. Reads the assignment's
    message without decoding it (decoding is the delivery's work, one micro-batch at a time)."""
    units: dict[str, StoredUnit] = {}

    def add(key: str, byte_length: int | None, trajectory_id: str, index: int) -> None:
        if key not in units:
            units[key] = StoredUnit(key=UnitKey(key), byte_length=byte_length, trajectory_id=trajectory_id,
                                    microbatch_index=index)

    message, decoded = event.message, event.decoded
    if event.rank is not None and event.rank.HasField("trajectories"):  # the rank's trajectories as columns
        batch = event.rank.trajectories
        unit_offsets = [0, *accumulate(batch.unit_counts)]
        keys, kinds, lengths = batch.unit_keys, batch.unit_kinds, batch.unit_headers.byte_lengths
        row = 0
        for index, rank_micro in enumerate(event.rank.microbatches):
            for _ in rank_micro.items:
                trajectory_id = batch.trajectory_ids[row]
                for k in range(unit_offsets[row], unit_offsets[row + 1]):
                    if kinds[k] in _READ_KINDS:
                        add(keys[k], lengths[k], trajectory_id, index)
                row += 1
        return list(units.values())
    if event.rank is not None:  # a DP rank's part: every CP rank reads every field unit of its items
        for index, rank_micro in enumerate(event.rank.microbatches):
            for rank_item in rank_micro.items:
                trajectory = rank_item.trajectory
                for unit in trajectory.units:
                    if unit.kind in _READ_KINDS:
                        add(unit.key, unit.header.byte_length, trajectory.trajectory_id, index)
        return list(units.values())
    if event.encoder:
        if message is not None:
            for index, micro in enumerate(message.encoder_microbatches):
                for encoding in micro.encodings:
                    add(encoding.key, encoding.header.byte_length if encoding.HasField("header") else None,
                        encoding.routes.trajectory_ids[0] if encoding.routes.trajectory_ids else "", index)
        else:
            assert decoded is not None
            for index, encoder_micro in enumerate(decoded.encoder_microbatches):
                for use in encoder_micro.encodings:
                    header = use.encoding.header
                    add(use.encoding.key, None if header is None else header.byte_length,
                        use.routes[0].trajectory_id if use.routes else "", index)
        return list(units.values())
    if message is not None:
        for index, micro in enumerate(message.microbatches):
            for item in micro.items:
                for read in item.reads:
                    add(read.unit.key, read.unit.header.byte_length, item.trajectory.trajectory_id, index)
    else:
        assert decoded is not None
        for index, backbone_micro in enumerate(decoded.microbatches):
            for backbone_item in backbone_micro.items:
                for field_read in backbone_item.reads:
                    add(field_read.unit.key, field_read.unit.header.byte_length,
                        backbone_item.trajectory.trajectory_id, index)
    return list(units.values())


def first_mismatch(units: Sequence[StoredUnit], sizes: Sequence[int | None]) -> VerificationFailure | None:
    """The first unit whose stored size is missing or differs from its header's byte length; None if all agree."""
    for unit, size in zip(units, sizes, strict=True):
        if unit.byte_length is None:
            reason = "the rollout reported no stored header for this input, so it cannot be read"
        elif size is None:
            reason = "the unit is missing from the store"
        elif size != unit.byte_length:
            reason = f"the store holds {size} bytes of the unit, its header says {unit.byte_length}"
        else:
            continue
        return VerificationFailure(
            microbatch_index=unit.microbatch_index,
            failure=MiniBatchFailure(trajectory_id=unit.trajectory_id, unit_key=unit.key,
                                     reason=f"found before delivery: {reason}"),
        )
    return None


def verify_part(
    event: AssignmentEvent,
    store: UnitStore,
    *,
    retry_seconds: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> VerificationFailure | None:
    """Runs on a sidecar thread: query the sizes of every unit of the part (retrying transient store errors, as
    reads do) and name the first one that is missing or of the wrong size."""
    units = stored_units(event)
    if not units:
        return None
    backoff = Backoff(replace(STORE_RETRY, deadline=retry_seconds), clock=clock)
    while True:
        try:
            sizes = store.sizes([unit.key for unit in units])
            break
        except StoreFullError:
            raise
        except StoreError as error:
            delay = backoff.next_delay()
            if delay is None:
                raise
            logger.warning("store size query failed (%s); retrying in %.2fs", error, delay)
            sleep(delay)
    return first_mismatch(units, sizes)
