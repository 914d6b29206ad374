"""The packed layout of a backbone micro-batch, as both the reorg sidecar and the trainer compute it (pure).

A CP rank's packed micro-batch holds its items in plan order, each occupying ``padded_tokens / cp`` tokens:
its zigzag chunk r, then chunk 2cp−1−r (the layout :mod:`knittrans.train.plan_adapter` assumes).
"""

from __future__ import annotations

from collections.abc import Sequence

from knittrans.errors import InvalidArgument
from knittrans.packed.tensors import PackedEncodingUse
from knittrans.plan import MicroBatchAssignment


def item_offsets(mb: MicroBatchAssignment, cp: int) -> tuple[int, ...]:
    """The first packed token of each item."""
    offsets, position = [], 0
    for i, item in enumerate(mb.items):
        if item.padded_tokens % (2 * cp):
            raise InvalidArgument(f"padded length {item.padded_tokens} is not a multiple of 2·cp = {2 * cp}",
                                  field=f"items[{i}].padded_tokens")
        offsets.append(position)
        position += item.padded_tokens // cp
    return tuple(offsets)


def packed_encoding_uses(mb: MicroBatchAssignment, offsets: Sequence[int]) -> tuple[PackedEncodingUse, ...]:
    """The micro-batch's encoding uses in packed coordinates (what the encoding-reuse helper consumes)."""
    uses = []
    for i, (item, offset) in enumerate(zip(mb.items, offsets, strict=True)):
        length = item.chunks[0].padded.length if item.chunks else 0
        held = [c.chunk for c in item.chunks]
        for u, use in enumerate(item.encodings):
            chunk = use.positions.start // length if length else -1
            if chunk not in held or use.positions.end > (chunk + 1) * length:
                raise InvalidArgument(
                    f"positions [{use.positions.start}, {use.positions.end}) are not inside one chunk of this CP rank",
                    field=f"items[{i}].encodings[{u}]",
                )
            start = offset + held.index(chunk) * length + use.positions.start - chunk * length
            uses.append(
                PackedEncodingUse(
                    encoding_id=use.encoding_id, key=use.key, packed_start=start,
                    packed_end=start + use.positions.length, row_start=use.row_start,
                    trajectory_id=item.trajectory.trajectory_id, reference=use.reference,
                )
            )
    return tuple(uses)
