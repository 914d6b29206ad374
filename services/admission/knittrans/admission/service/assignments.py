"""Each consumer's part of an admitted mini-batch, built straight from the plan's arrays as protobuf fields.

A backbone DP rank's part (``RankAssignment``) is the same for all of its CP ranks: it carries each trajectory's
metadata message (the one it was reported in, or built from its columns once), its padded length and the encodings
of its references, and every CP rank cuts its own zigzag chunks, reads and encoding uses from it with the
planner's geometry (:mod:`knittrans.plan.rank`). So the service builds and serialises one message per DP rank,
not one per (DP, CP) consumer. An encoder consumer's part is built once, from the
:class:`~knittrans.admission.planning.PlanLayout`, as nested ``dict`` constructor fields that protobuf converts in
one C call, with each encoding's routes parsed in from their wire form (:mod:`.route_wire`, encoded once per
mini-batch with numpy); it equals ``assignment_to_proto(plan.for_consumer(consumer))``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from knittrans.admission.planning import PlanLayout, ReferenceColumns, plan_columns
from knittrans.admission.service.block_merge import rows_in_order
from knittrans.admission.service.header_columns import offsets_of
from knittrans.admission.service.route_wire import RouteWire
from knittrans.admission.service.trajectory_columns import TrajectoryColumns, gather_index
from knittrans.errors import InvalidArgument
from knittrans.types import BACKBONE_ROLE, ConsumerId, Topology
from knittrans.v1 import plan_pb2, trajectory_pb2
from knittrans.wire.enums import UNIT_KIND_FROM_PROTO


@dataclass(frozen=True, kw_only=True, eq=False)
class MiniBatchRows:
    """The admitted trajectories of one mini-batch, in admission order, as planning and dispatch read them.

    Trajectory t's references are numbered as in the plan (trajectory by trajectory). ``located`` is where each
    trajectory's metadata lives: its message is built only for the consumers that carry it (see :meth:`message`)."""

    trajectory_ids: list[str]
    located: list[tuple[TrajectoryColumns, int]]
    num_tokens: np.ndarray  # int64
    loss_tokens: np.ndarray  # int64
    references: ReferenceColumns
    reference_kinds: list[int]  # proto UnitKind numbers
    reference_offsets: list[int]  # per trajectory, into the references
    _messages: dict[int, trajectory_pb2.TrajectoryMetadata] = field(default_factory=dict)

    def message(self, t: int) -> trajectory_pb2.TrajectoryMetadata:
        """Trajectory t's message: the one it came in, or built from its columns once, when the first consumer
        that carries it needs it (each CP rank of its DP rank does)."""
        message = self._messages.get(t)
        if message is None:
            columns, row = self.located[t]
            message = self._messages[t] = columns.message(row)
        return message


def gather_rows(located: Sequence[tuple[TrajectoryColumns, int]]) -> MiniBatchRows:
    """Collect trajectories (each a row of some ingest columns) for planning and dispatch: their messages (built
    from the columns unless the columns came from messages), and the columns planning and reads need, gathered
    a report at a time with numpy."""
    # Grouped by block, each block's rows taken at once; then put back in admission order (which may interleave
    # the reports row by row).
    blocks: dict[int, tuple[TrajectoryColumns, list[int], list[int]]] = {}
    for t, (columns, row) in enumerate(located):
        entry = blocks.get(id(columns))
        if entry is None:
            entry = blocks[id(columns)] = (columns, [], [])
        entry[1].append(row)
        entry[2].append(t)
    runs = [(columns, rows) for columns, rows, _ in blocks.values()]
    ids: list[str] = []
    parts: dict[str, list] = {name: [] for name in (
        "num_tokens", "loss_tokens", "ref_counts", "costs", "starts", "ends", "ref_kinds")}
    keys: list[str] = []
    encoders: list[str] = []
    hashes: list[str | None] = []
    for columns, rows in runs:
        index = np.array(rows, dtype=np.int64)
        ids.extend(map(columns.trajectory_ids.__getitem__, rows))  # map: the lookups run in C
        parts["num_tokens"].append(columns.num_tokens[index])
        parts["loss_tokens"].append(columns.num_loss_tokens[index])
        refs = gather_index(columns.multimodal_offsets, index)
        parts["ref_counts"].append(np.diff(columns.multimodal_offsets)[index])
        parts["costs"].append(columns.multimodal_costs[refs])
        parts["starts"].append(columns.placeholder_starts[refs])
        parts["ends"].append(columns.placeholder_ends[refs])
        parts["ref_kinds"].append(columns.multimodal_kinds[refs])
        ref_list = refs.tolist()
        keys.extend(map(columns.multimodal_keys.__getitem__, ref_list))
        encoders.extend(map(columns.multimodal_encoders.__getitem__, ref_list))
        header_index = columns.multimodal_header_index[refs]
        content = columns.multimodal_headers.content_hashes
        if not (header_index >= 0).any():
            hashes.extend([None] * len(header_index))
        elif (header_index >= 0).all():
            hashes.extend(map(content.__getitem__, header_index.tolist()))
        else:
            hashes.extend(content[h] if h >= 0 else None for h in header_index.tolist())
    joined = {name: np.concatenate(values) for name, values in parts.items()}
    if len(blocks) > 1:
        grouped_at = np.concatenate([np.asarray(ts, dtype=np.int64) for _, _, ts in blocks.values()])
        source = np.empty(len(grouped_at), dtype=np.int64)
        source[grouped_at] = np.arange(len(grouped_at), dtype=np.int64)
        ref_source = gather_index(offsets_of(joined["ref_counts"].astype(np.int64)), source)
        for name in ("num_tokens", "loss_tokens", "ref_counts"):
            joined[name] = joined[name][source]
        for name in ("costs", "starts", "ends", "ref_kinds"):
            joined[name] = joined[name][ref_source]
        source_list, ref_list = source.tolist(), ref_source.tolist()
        ids = list(map(ids.__getitem__, source_list))
        keys, encoders, hashes = (list(map(column.__getitem__, ref_list)) for column in (keys, encoders, hashes))
    ref_counts = joined["ref_counts"].astype(np.int64)
    ref_kinds = joined["ref_kinds"].tolist()
    return MiniBatchRows(
        trajectory_ids=tuple(ids),
        located=list(located),
        num_tokens=joined["num_tokens"].astype(np.int64),
        loss_tokens=joined["loss_tokens"].astype(np.int64),
        references=ReferenceColumns(
            trajectories=np.repeat(np.arange(len(ids), dtype=np.int64), ref_counts),
            keys=tuple(keys),
            encoders=tuple(encoders),
            costs=joined["costs"].astype(np.float64),
            starts=joined["starts"].astype(np.int64),
            ends=joined["ends"].astype(np.int64),
            kinds=tuple(UNIT_KIND_FROM_PROTO.get(k, k) for k in ref_kinds),
            content_hashes=tuple(hashes),
        ),
        # Tuples: the collector stops tracking them, and a mini-batch is kept until its consumers are done.
        reference_kinds=tuple(ref_kinds),
        reference_offsets=tuple(np.concatenate([[0], np.cumsum(ref_counts)]).astype(np.int64).tolist()),
    )


class _Views:
    """The plan's backbone arrays as Python tuples, made once per mini-batch (indexing numpy one value at a time
    is slow, and converting the whole plan for each consumer made dispatch O(consumers × trajectories)). Tuples of
    numbers, which the collector stops tracking."""

    def __init__(self, layout: PlanLayout):
        b = layout.backbone
        self.microbatch_offsets = tuple(b.microbatch_offsets.tolist())
        self.microbatch_items = tuple(b.microbatch_items.tolist())
        self.microbatch_loss_tokens = tuple(b.microbatch_loss_tokens.tolist())
        self.padded_tokens = tuple(b.padded_tokens.tolist())
        self.reference_encodings = tuple(layout.encodings.reference_encodings.tolist())


class _EncoderViews:
    """What the encoder consumers' parts read, made once per mini-batch, apart from the backbone's views: a DP
    rank's message does not wait for the routes to be encoded."""

    def __init__(self, layout: PlanLayout, rows: MiniBatchRows):
        route = layout.route
        # Every route row's EncodingRoutes columns, varint-encoded once (rows sorted by encoding).
        references = route.references
        trajectories = rows.references.trajectories[references]
        bounds = tuple(np.searchsorted(route.encodings, np.arange(len(layout.encodings) + 1)).tolist())
        self.routes = RouteWire({
            "dp_ranks": route.dp_ranks, "cp_ranks": route.cp_ranks, "tp_ranks": route.tp_ranks,
            "microbatches": route.microbatches, "trajectory_indices": trajectories, "references": references,
            "position_starts": route.starts, "position_ends": route.ends,
            "row_starts": route.starts - rows.references.starts[references],
        }, [rows.trajectory_ids[t] for t in trajectories.tolist()], bounds)
        self.reference_trajectories = tuple(rows.references.trajectories.tolist())
        self.reference_starts = tuple(rows.references.starts.tolist())
        # Each encoding's first reference.
        table = layout.encodings
        first_of_trajectory = np.searchsorted(rows.references.trajectories, table.source_trajectory, side="left")
        self.encoding_sources = tuple((first_of_trajectory + table.source_reference).tolist())
        # Per encoder: its micro-batches per rank, their offsets into its encodings, and those encodings.
        self.encoders = {
            plan.name: (plan.microbatches_per_rank, tuple(plan.microbatch_offsets.tolist()),
                        tuple(plan.microbatch_encodings.tolist()))
            for plan in layout.encoders
        }


class MiniBatchDispatch:
    """One admitted mini-batch's plan, and its parts as protobuf constructor fields: one ``RankAssignment`` per
    backbone DP rank (every CP rank of it cuts its own part from it, :mod:`knittrans.plan.rank`) and one
    ``ConsumerAssignment`` per encoder consumer."""

    def __init__(
        self, rows: MiniBatchRows, topology: Topology, label_fields: Sequence[str], *, balance_target: float = 1.01,
        role: str = BACKBONE_ROLE, message: Callable[[int], trajectory_pb2.TrajectoryMetadata] | None = None,
    ) -> None:
        """``topology`` is the one the consumers of ``role`` see (a trainer role's own, Topology.view_of);
        ``message``, when given, is trajectory t's message as its consumers get it (with attached fields)."""
        self.rows = rows
        self.topology = topology
        self.role = role
        self._message = message
        self.label_fields = frozenset(label_fields)
        self.layout: PlanLayout = plan_columns(
            rows.trajectory_ids, rows.num_tokens, rows.loss_tokens, rows.references, topology,
            balance_target=balance_target,
        )
        self._views: _Views | None = None
        self._encoder_views: _EncoderViews | None = None
        self._rank_columns: TrajectoryColumns | None = None

    @property
    def minibatch_loss_tokens(self) -> int:
        return self.layout.backbone.minibatch_loss_tokens

    @property
    def views(self) -> _Views:
        if self._views is None:
            self._views = _Views(self.layout)
        return self._views

    @property
    def encoder_views(self) -> _EncoderViews:
        if self._encoder_views is None:
            self._encoder_views = _EncoderViews(self.layout, self.rows)
        return self._encoder_views

    def release_views(self) -> None:
        """Every part is built: drop the views (a later build, say for a reconnecting stream, makes them again)."""
        self._views = None
        self._encoder_views = None
        self._rank_columns = None

    def _rank_batch(self, dp_rank: int) -> trajectory_pb2.TrajectoryBatch:
        """DP rank ``dp_rank``'s trajectories, in the order its micro-batches hold them, as one columnar batch
        instead of a message per trajectory (building those was the largest cost of dispatching a large
        mini-batch): a run of the mini-batch's columns, put in rank order once (:func:`.block_merge.rows_in_order`),
        cut with slices (cutting each rank's with its own fancy indices cost more than the whole gather)."""
        views = self.views
        if self._rank_columns is None:
            located = self.rows.located
            self._rank_columns = rows_in_order([located[t] for t in views.microbatch_items])
        per_rank, offsets = self.layout.backbone.microbatches_per_rank, views.microbatch_offsets
        return self._rank_columns.take_range(offsets[dp_rank * per_rank], offsets[(dp_rank + 1) * per_rank])

    # ---- backbone ------------------------------------------------------------------------------------------

    def rank_fields(self, dp_rank: int) -> dict:
        """``RankAssignment`` constructor fields of backbone DP rank ``dp_rank``: its micro-batches with each
        trajectory's metadata, padded length and reference encodings; no CP rank's cut."""
        views = self.views
        rows = self.rows
        per_rank = self.layout.backbone.microbatches_per_rank
        offsets, members = views.microbatch_offsets, views.microbatch_items
        padded, first, encodings = views.padded_tokens, rows.reference_offsets, views.reference_encodings
        # The trajectories go as the rank's batch of columns, unless a trainer role's consumers see them changed
        # (attached units, no media): those are built message by message.
        message = self._message
        microbatches = []
        for j in range(per_rank):
            g = dp_rank * per_rank + j
            items = []
            for t in members[offsets[g]:offsets[g + 1]]:
                item = {"trajectory_index": t, "padded_tokens": padded[t]}
                if message is not None:
                    item["trajectory"] = message(t)
                start, end = first[t], first[t + 1]
                if end > start:
                    item["first_reference"] = start
                    item["reference_encodings"] = encodings[start:end]
                items.append(item)
            microbatches.append({"index": j, "last": j == per_rank - 1,
                                 "num_loss_tokens": views.microbatch_loss_tokens[g], "items": items})
        fields = {
            "consumer": {"role": self.role, "dp_rank": dp_rank, "cp_rank": 0},
            "minibatch_loss_tokens": self.minibatch_loss_tokens,
            "cp": self.topology.backbone.cp,
            "label_fields": sorted(self.label_fields),
            "microbatches": microbatches,
        }
        if message is None:
            fields["trajectories"] = self._rank_batch(dp_rank)
        return fields

    # ---- encoders ------------------------------------------------------------------------------------------

    def assignment(self, consumer: ConsumerId) -> plan_pb2.ConsumerAssignment:
        """An encoder consumer's ``ConsumerAssignment``: what ``assignment_to_proto(plan.for_consumer(consumer))``
        holds. Built from constructor fields without the routes, which are then parsed in from their wire form."""
        name = consumer.encoder_name
        if name is None:
            raise InvalidArgument("a backbone consumer's part is its DP rank's (rank_fields)", field="consumer")
        views = self.encoder_views
        per_rank, offsets, encodings = views.encoders[name]
        groups = [encodings[offsets[g]:offsets[g + 1]]
                  for g in range(consumer.dp_rank * per_rank, (consumer.dp_rank + 1) * per_rank)]
        message = plan_pb2.ConsumerAssignment(
            consumer={"role": consumer.role, "dp_rank": consumer.dp_rank, "cp_rank": consumer.cp_rank},
            minibatch_loss_tokens=self.minibatch_loss_tokens,
            cp=self.topology.backbone.cp,
            encoder_microbatches=[
                {"index": j, "last": j == per_rank - 1,
                 "encodings": [self._encoding(views, e, views.encoding_sources[e]) for e in group]}
                for j, group in enumerate(groups)
            ],
        )
        routes = views.routes
        for micro, group in zip(message.encoder_microbatches, groups, strict=True):
            for encoding, e in zip(micro.encodings, group, strict=True):
                encoding.routes.MergeFromString(routes.encoding_bytes(e))
        return message

    def _encoding(self, views: _EncoderViews, e: int, r: int) -> dict:
        """Encoding e (whose first reference is r) without its routes."""
        rows = self.rows
        refs = rows.references
        start, end = views.reference_starts[r], int(refs.ends[r])
        fields = {
            "encoding_id": e,
            "key": refs.keys[r],
            "encoder": refs.encoders[r],
            "cost": float(refs.costs[r]),
            "kind": rows.reference_kinds[r],
            "num_rows": end - start,
        }
        t = views.reference_trajectories[r]
        columns, row = rows.located[t]
        header = int(columns.multimodal_header_index[int(columns.multimodal_offsets[row]) + r
                                                     - rows.reference_offsets[t]])
        if header >= 0:
            fields["header"] = columns.multimodal_headers.fields_at(header)
        return fields
