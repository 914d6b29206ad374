"""The typed plan of one admitted mini-batch (DESIGN.md §4).

The admission service computes a :class:`Plan` for every admitted mini-batch; sidecars and trainers consume
it, so it lives in the SDK. A plan holds:

- the backbone layout: per DP rank an ordered list of micro-batches (every rank has the same count), each a
  list of trajectory indices; per trajectory its padded length and the zigzag CP chunks (2·cp chunks, CP rank
  r holds chunks r and 2cp−1−r);
- the encoder plan: the mini-batch's unique multimodal inputs (encodings), and per encoder DP rank the
  encoder micro-batches that encode them;
- the route map: for every encoding, each backbone (dp, cp, tp) rank and micro-batch that consumes it, with
  the placeholder positions that fall in that CP rank's chunks;
- quality figures.

Trajectories are referred to by their index in :attr:`Plan.trajectories`, encodings by their id (index in
the encoding table), and multimodal references by their global index: references are numbered trajectory by
trajectory, in each trajectory's ``multimodal`` order.

Modules: :mod:`~knittrans.plan.geometry` (padding and zigzag CP arithmetic), :mod:`~knittrans.plan.parts`
(the plan and its parts), :mod:`~knittrans.plan.assignment` (what one consumer receives),
:mod:`~knittrans.plan.validate` (the invariants), and the codecs :mod:`~knittrans.plan.json` (with
:mod:`~knittrans.plan.trajectory_json`, the BATCH.jsonl form) and
:mod:`~knittrans.plan.proto`. This package loads no protobuf: import :mod:`knittrans.plan.proto` where the
protobuf forms are needed.
"""

from knittrans.plan.assignment import (
    ChunkSlice,
    ConsumerAssignment,
    EncoderMicroBatchAssignment,
    Encoding,
    EncodingAssignment,
    EncodingUse,
    FieldRead,
    ItemAssignment,
    MicroBatchAssignment,
    RouteEntry,
)
from knittrans.plan.geometry import merge_spans, padded_lengths, segment_sums, zigzag_chunks, zigzag_spans
from knittrans.plan.parts import (
    DEFAULT_LABEL_FIELDS,
    PLAN_FORMAT,
    ROUTE_COLUMNS,
    BackbonePlan,
    BalanceScheme,
    EncoderPlan,
    EncoderQuality,
    EncodingOwner,
    EncodingTable,
    Plan,
    PlanQuality,
    RouteMap,
)

__all__ = [
    "DEFAULT_LABEL_FIELDS",
    "PLAN_FORMAT",
    "ROUTE_COLUMNS",
    "BackbonePlan",
    "BalanceScheme",
    "ChunkSlice",
    "ConsumerAssignment",
    "EncoderMicroBatchAssignment",
    "EncoderPlan",
    "EncoderQuality",
    "Encoding",
    "EncodingAssignment",
    "EncodingOwner",
    "EncodingTable",
    "EncodingUse",
    "FieldRead",
    "ItemAssignment",
    "MicroBatchAssignment",
    "Plan",
    "PlanQuality",
    "RouteEntry",
    "RouteMap",
    "merge_spans",
    "padded_lengths",
    "segment_sums",
    "zigzag_chunks",
    "zigzag_spans",
]
