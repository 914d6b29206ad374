"""Each consumer's part of an admitted mini-batch, built straight from the plan's arrays as protobuf fields.

:meth:`knittrans.plan.Plan.for_consumer` turns the one expansion of a backbone consumer's part
(:func:`knittrans.plan.assignment.expand_backbone`) into typed objects that
:func:`~knittrans.plan.proto.assignment_to_proto` then converts into messages. On the report-to-assignment path
that round trip (and the domain objects of every admitted trajectory it needs) costs more than planning itself,
so the service turns the same expansion straight into nested ``dict`` constructor fields, which protobuf
converts in one C call, from the :class:`~knittrans.admission.planning.PlanLayout` and the admitted
trajectories' messages it already holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from knittrans.admission.planning import PlanLayout, ReferenceColumns, plan_columns
from knittrans.admission.service.trajectory_columns import HeaderColumns, TrajectoryColumns, gather_index
from knittrans.plan.assignment import ROUTE_LISTS, AssignmentSource, ItemLayout, UnitRead, expand_backbone
from knittrans.types import BACKBONE_ROLE, ConsumerId, FieldAlignment, Topology
from knittrans.v1 import plan_pb2, trajectory_pb2
from knittrans.wire.enums import ALIGNMENT_TO_PROTO, ITEMSIZE_BY_PROTO, UNIT_KIND_FROM_PROTO

_TOKEN_ALIGNED = ALIGNMENT_TO_PROTO[FieldAlignment.TOKEN]
_ITEMSIZE_LUT = np.zeros(max(ITEMSIZE_BY_PROTO) + 1, dtype=np.int64)
for _number, _itemsize in ITEMSIZE_BY_PROTO.items():
    _ITEMSIZE_LUT[_number] = _itemsize
_READ_LUT = np.zeros(max(UNIT_KIND_FROM_PROTO) + 1, dtype=np.int64)  # proto UnitKind number -> UnitRead
for _number, _kind in UNIT_KIND_FROM_PROTO.items():
    _READ_LUT[_number] = UnitRead.of(_kind)


@dataclass(frozen=True, kw_only=True, eq=False)
class MiniBatchRows:
    """The admitted trajectories of one mini-batch, in admission order, as planning and dispatch read them.

    Trajectory t's units are ``unit_*[unit_offsets[t]:unit_offsets[t + 1]]``, in its ``units`` order; its
    references are numbered as in the plan (trajectory by trajectory). ``located`` is where each trajectory's
    metadata lives: its message is built only for the consumers that carry it (see :meth:`trajectory`)."""

    trajectory_ids: list[str]
    located: list[tuple[TrajectoryColumns, int]]
    num_tokens: np.ndarray  # int64
    loss_tokens: np.ndarray  # int64
    unit_offsets: list[int]
    unit_reads: list[int]  # UnitRead values
    unit_field_names: list[str]
    unit_token_aligned: list[bool]
    unit_row_bytes: list[int]  # bytes per token (leading axis)
    unit_byte_lengths: list[int]
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
    runs: list[tuple[TrajectoryColumns, list[int]]] = []
    for columns, row in located:
        if runs and runs[-1][0] is columns:
            runs[-1][1].append(row)
        else:
            runs.append((columns, [row]))
    ids: list[str] = []
    parts: dict[str, list] = {name: [] for name in (
        "num_tokens", "loss_tokens", "unit_counts", "unit_reads", "unit_token_aligned", "unit_row_bytes",
        "unit_byte_lengths", "ref_counts", "costs", "starts", "ends", "ref_kinds")}
    field_names: list[str] = []
    keys: list[str] = []
    encoders: list[str] = []
    hashes: list[str | None] = []
    for columns, rows in runs:
        index = np.array(rows, dtype=np.int64)
        ids.extend(columns.trajectory_ids[i] for i in rows)
        parts["num_tokens"].append(columns.num_tokens[index])
        parts["loss_tokens"].append(columns.num_loss_tokens[index])
        units = gather_index(columns.unit_offsets, index)
        parts["unit_counts"].append(np.diff(columns.unit_offsets)[index])
        kinds = columns.unit_kinds[units]
        parts["unit_reads"].append(_READ_LUT[np.where((kinds >= 0) & (kinds < len(_READ_LUT)), kinds, 0)])
        parts["unit_token_aligned"].append(columns.unit_alignments[units] == _TOKEN_ALIGNED)
        parts["unit_row_bytes"].append(_row_bytes(columns.unit_headers)[units])
        parts["unit_byte_lengths"].append(columns.unit_headers.byte_lengths[units])
        names = columns.unit_field_names
        field_names.extend(names[k] for k in units.tolist())
        refs = gather_index(columns.multimodal_offsets, index)
        parts["ref_counts"].append(np.diff(columns.multimodal_offsets)[index])
        parts["costs"].append(columns.multimodal_costs[refs])
        parts["starts"].append(columns.placeholder_starts[refs])
        parts["ends"].append(columns.placeholder_ends[refs])
        parts["ref_kinds"].append(columns.multimodal_kinds[refs])
        ref_list = refs.tolist()
        keys.extend(columns.multimodal_keys[k] for k in ref_list)
        encoders.extend(columns.multimodal_encoders[k] for k in ref_list)
        header_index = columns.multimodal_header_index[refs].tolist()
        content = columns.multimodal_headers.content_hashes
        hashes.extend(content[h] if h >= 0 else None for h in header_index)
    joined = {name: np.concatenate(values) for name, values in parts.items()}
    ref_counts = joined["ref_counts"].astype(np.int64)
    ref_kinds = joined["ref_kinds"].tolist()
    return MiniBatchRows(
        trajectory_ids=tuple(ids),
        located=list(located),
        num_tokens=joined["num_tokens"].astype(np.int64),
        loss_tokens=joined["loss_tokens"].astype(np.int64),
        # Tuples: the collector stops tracking them, and a mini-batch is kept until its consumers are done.
        unit_offsets=tuple(np.concatenate([[0], np.cumsum(joined["unit_counts"])]).astype(np.int64).tolist()),
        unit_reads=tuple(joined["unit_reads"].tolist()),
        unit_field_names=tuple(field_names),
        unit_token_aligned=tuple(joined["unit_token_aligned"].tolist()),
        unit_row_bytes=tuple(joined["unit_row_bytes"].tolist()),
        unit_byte_lengths=tuple(joined["unit_byte_lengths"].tolist()),
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
        reference_kinds=tuple(ref_kinds),
        reference_offsets=tuple(np.concatenate([[0], np.cumsum(ref_counts)]).astype(np.int64).tolist()),
    )


def _row_bytes(headers: HeaderColumns) -> np.ndarray:
    """Per header: the bytes of one step along its leading axis (itemsize times the other dimensions)."""
    row = _ITEMSIZE_LUT[np.clip(headers.dtypes, 0, len(_ITEMSIZE_LUT) - 1)]
    ranks = headers.ranks
    starts = headers.shape_offsets[:-1]
    for axis in range(1, int(ranks.max(initial=0))):
        present = ranks > axis
        dims = headers.shape[np.where(present, starts + axis, 0)].astype(np.int64)
        row = row * np.where(present, dims, 1)
    return row


class _Views:
    """The plan's arrays as Python tuples and the indices every consumer's build reads, made once per mini-batch
    (indexing numpy one value at a time is slow, and converting the whole plan for each consumer made dispatch
    O(consumers × trajectories)). Tuples of numbers, which the collector stops tracking; the dispatch drops them
    once every planned consumer had its assignment built (a later build, e.g. for a reconnecting stream, makes
    them again)."""

    def __init__(self, layout: PlanLayout, rows: MiniBatchRows, topology: Topology, label_fields: frozenset[str]):
        b = layout.backbone
        route = layout.route
        self.route = {name: tuple(getattr(route, name).tolist()) for name in
                      ("encodings", "references", "dp_ranks", "cp_ranks", "tp_ranks", "microbatches", "starts", "ends")}
        self.reference_trajectories = tuple(rows.references.trajectories.tolist())
        self.reference_starts = tuple(rows.references.starts.tolist())
        self.source = AssignmentSource(
            cp=topology.backbone.cp,
            label_fields=label_fields,
            microbatches_per_rank=b.microbatches_per_rank,
            microbatch_offsets=tuple(b.microbatch_offsets.tolist()),
            microbatch_items=tuple(b.microbatch_items.tolist()),
            microbatch_loss_tokens=tuple(b.microbatch_loss_tokens.tolist()),
            num_tokens=tuple(rows.num_tokens.tolist()),
            padded_tokens=tuple(b.padded_tokens.tolist()),
            cp_spans=tuple(tuple(tuple(tuple(chunk) for chunk in rank) for rank in spans)
                           for spans in b.cp_spans.tolist()),
            unit_offsets=rows.unit_offsets,
            unit_reads=rows.unit_reads,
            unit_field_names=rows.unit_field_names,
            unit_token_aligned=rows.unit_token_aligned,
            route={name: self.route[name] for name in ROUTE_LISTS},
            reference_trajectories=self.reference_trajectories,
            reference_starts=self.reference_starts,
        )
        # Encoders: each encoding's first reference, and its rows of the route (sorted by encoding).
        table = layout.encodings
        first_of_trajectory = np.searchsorted(rows.references.trajectories, table.source_trajectory, side="left")
        self.encoding_sources = tuple((first_of_trajectory + table.source_reference).tolist())
        self.encoding_route_bounds = tuple(np.searchsorted(route.encodings, np.arange(len(table) + 1)).tolist())
        # Per encoder: its micro-batches per rank, their offsets into its encodings, and those encodings.
        self.encoders = {
            plan.name: (plan.microbatches_per_rank, tuple(plan.microbatch_offsets.tolist()),
                        tuple(plan.microbatch_encodings.tolist()))
            for plan in layout.encoders
        }


class MiniBatchDispatch:
    """One admitted mini-batch's plan, and every consumer's part of it as ``ConsumerAssignment`` fields."""

    def __init__(
        self, rows: MiniBatchRows, topology: Topology, label_fields: Sequence[str], *, balance_target: float = 1.01
    ) -> None:
        self.rows = rows
        self.topology = topology
        self.label_fields = frozenset(label_fields)
        self.layout: PlanLayout = plan_columns(
            rows.trajectory_ids, rows.num_tokens, rows.loss_tokens, rows.references, topology,
            balance_target=balance_target,
        )
        self._views: _Views | None = None
        self._built: set[ConsumerId] = set()  # consumers built from the current views
        self._planned = topology.backbone.dp * topology.backbone.cp + sum(e.dp for e in topology.encoders)

    @property
    def minibatch_loss_tokens(self) -> int:
        return self.layout.backbone.minibatch_loss_tokens

    def assignment(self, consumer: ConsumerId) -> plan_pb2.ConsumerAssignment:
        return plan_pb2.ConsumerAssignment(**self.assignment_fields(consumer))

    def assignment_fields(self, consumer: ConsumerId) -> dict:
        """``ConsumerAssignment`` constructor fields: what ``plan.for_consumer(consumer).to_proto()`` holds."""
        lists = self._views
        if lists is None:
            lists = self._views = _Views(self.layout, self.rows, self.topology, self.label_fields)
        fields = {
            "consumer": {"role": consumer.role, "dp_rank": consumer.dp_rank, "cp_rank": consumer.cp_rank},
            "minibatch_loss_tokens": self.minibatch_loss_tokens,
            "cp": self.topology.backbone.cp,
        }
        name = consumer.encoder_name
        if name is None:
            fields["microbatches"] = self._backbone_microbatches(lists, consumer.dp_rank, consumer.cp_rank)
        else:
            fields["encoder_microbatches"] = self._encoder_microbatches(lists, name, consumer.dp_rank)
        self._built.add(consumer)
        if len(self._built) >= self._planned:  # every consumer has its part: the views are not needed any more
            self._views = None
            self._built = set()
        return fields

    # ---- backbone ------------------------------------------------------------------------------------------

    def _backbone_microbatches(self, lists: _Views, dp_rank: int, cp_rank: int) -> list[dict]:
        return [
            {"index": mb.microbatch_index, "last": mb.last, "num_loss_tokens": mb.num_loss_tokens,
             "items": [self._item(item) for item in mb.items]}
            for mb in expand_backbone(lists.source, dp_rank, cp_rank)
        ]

    def _item(self, item: ItemLayout) -> dict:
        """An item's ``ItemAssignment`` fields."""
        rows = self.rows
        t = item.trajectory
        message = rows.message(t)
        units = message.units
        first = rows.unit_offsets[t]
        row_bytes, byte_lengths = rows.unit_row_bytes, rows.unit_byte_lengths
        reads = []
        for k, look_ahead, token_spans in item.reads:
            if token_spans is None:
                reads.append({"unit": units[k - first], "byte_ranges": [{"offset": 0, "length": byte_lengths[k]}]})
            else:
                width = row_bytes[k]
                reads.append({
                    "unit": units[k - first],
                    "spans": [{"start": s, "end": e} for s, e in token_spans],
                    "byte_ranges": [{"offset": s * width, "length": (e - s) * width} for s, e in token_spans],
                    "look_ahead": look_ahead,
                })
        keys = rows.references.keys
        return {
            "trajectory_index": t,
            "trajectory": message,
            "padded_tokens": item.padded_tokens,
            "chunks": [
                {"chunk": c, "padded": {"start": ps, "end": pe}, "tokens": {"start": ts, "end": te}}
                for c, ps, pe, ts, te in item.chunks
            ],
            "reads": reads,
            "encodings": [
                {"encoding_id": e, "key": keys[r], "positions": {"start": s, "end": end}, "row_start": row_start,
                 "reference": r}
                for e, r, s, end, row_start in item.encodings
            ],
        }

    # ---- encoders ------------------------------------------------------------------------------------------

    def _encoder_microbatches(self, lists: _Views, name: str, dp_rank: int) -> list[dict]:
        per_rank, offsets, encodings = lists.encoders[name]
        sources, bounds = lists.encoding_sources, lists.encoding_route_bounds
        return [
            {
                "index": j,
                "last": j == per_rank - 1,
                "encodings": [
                    self._encoding(lists, e, sources[e], bounds) for e in encodings[offsets[g] : offsets[g + 1]]
                ],
            }
            for j, g in ((j, dp_rank * per_rank + j) for j in range(per_rank))
        ]

    def _encoding(self, lists: _Views, e: int, r: int, bounds: Sequence[int]) -> dict:
        """Encoding e, whose first reference is r."""
        rows = self.rows
        refs = rows.references
        start, end = lists.reference_starts[r], int(refs.ends[r])
        fields = {
            "encoding_id": e,
            "key": refs.keys[r],
            "encoder": refs.encoders[r],
            "cost": float(refs.costs[r]),
            "kind": rows.reference_kinds[r],
            "num_rows": end - start,
            "routes": self._routes(lists, e, bounds),
        }
        t = lists.reference_trajectories[r]
        ref = rows.message(t).multimodal[r - rows.reference_offsets[t]]
        if ref.HasField("header"):
            fields["header"] = ref.header
        return fields

    def _routes(self, lists: _Views, e: int, bounds: Sequence[int]) -> list[dict]:
        route = lists.route
        trajectories = lists.reference_trajectories
        starts = lists.reference_starts
        ids = self.rows.trajectory_ids
        entries = []
        for row in range(bounds[e], bounds[e + 1]):
            reference = route["references"][row]
            trajectory = trajectories[reference]
            start = route["starts"][row]
            entries.append({
                "consumer": {
                    "role": BACKBONE_ROLE, "dp_rank": route["dp_ranks"][row], "cp_rank": route["cp_ranks"][row]
                },
                "tp_rank": route["tp_ranks"][row],
                "microbatch": route["microbatches"][row],
                "trajectory_index": trajectory,
                "trajectory_id": ids[trajectory],
                "reference": reference,
                "positions": {"start": start, "end": route["ends"][row]},
                "row_start": start - starts[reference],
            })
        return entries
