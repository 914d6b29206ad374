"""Each consumer's part of an admitted mini-batch, built straight from the plan's arrays as protobuf fields.

:meth:`knittrans.plan.Plan.for_consumer` expands a consumer's part into typed objects that
:meth:`~knittrans.plan.ConsumerAssignment.to_proto` then converts back into messages. On the
report-to-assignment path that round trip (and the domain objects of every admitted trajectory it needs) costs
more than planning itself, so the service builds the same message directly: nested ``dict`` constructor fields,
which protobuf converts in one C call, from the :class:`~knittrans.admission.planning.PlanLayout` and the
admitted trajectories' messages it already holds. A test keeps the two equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from knittrans.admission.planning import PlanLayout, ReferenceColumns, plan_columns
from knittrans.admission.service.trajectory_columns import HeaderColumns, TrajectoryColumns, gather_index
from knittrans.plan import merge_spans
from knittrans.types import BACKBONE_ROLE, ConsumerId, DType, Topology, UnitKind
from knittrans.v1 import plan_pb2, trajectory_pb2

_TOKEN_FIELD = trajectory_pb2.UNIT_KIND_TOKEN_FIELD
_FIELD = trajectory_pb2.UNIT_KIND_FIELD
_TOKEN_ALIGNED = trajectory_pb2.FIELD_ALIGNMENT_TOKEN
_ITEMSIZE_LUT = np.zeros(max(trajectory_pb2.DType.values()) + 1, dtype=np.int64)
for _dtype in DType:
    _ITEMSIZE_LUT[trajectory_pb2.DType.Value(f"D_TYPE_{_dtype.name}")] = _dtype.itemsize
_KIND_FROM_PROTO = {trajectory_pb2.UnitKind.Value(f"UNIT_KIND_{kind.name}"): kind for kind in UnitKind}


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
    unit_kinds: list[int]  # proto UnitKind numbers
    unit_field_names: list[str]
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
        "num_tokens", "loss_tokens", "unit_counts", "unit_kinds", "unit_row_bytes", "unit_byte_lengths",
        "ref_counts", "costs", "starts", "ends", "ref_kinds")}
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
        parts["unit_kinds"].append(columns.unit_kinds[units])
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
        unit_kinds=tuple(joined["unit_kinds"].tolist()),
        unit_field_names=tuple(field_names),
        unit_row_bytes=tuple(joined["unit_row_bytes"].tolist()),
        unit_byte_lengths=tuple(joined["unit_byte_lengths"].tolist()),
        references=ReferenceColumns(
            trajectories=np.repeat(np.arange(len(ids), dtype=np.int64), ref_counts),
            keys=tuple(keys),
            encoders=tuple(encoders),
            costs=joined["costs"].astype(np.float64),
            starts=joined["starts"].astype(np.int64),
            ends=joined["ends"].astype(np.int64),
            kinds=tuple(_KIND_FROM_PROTO.get(k, k) for k in ref_kinds),
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


class _Lists:
    """The plan's arrays as Python lists, for one consumer's build (indexing numpy one value at a time is slow;
    they are not kept, so a mini-batch waiting for its consumers holds no containers for the collector)."""

    def __init__(self, layout: PlanLayout, rows: MiniBatchRows) -> None:
        b = layout.backbone
        self.offsets = b.microbatch_offsets.tolist()
        self.items = b.microbatch_items.tolist()
        self.padded_tokens = b.padded_tokens.tolist()
        self.cp_spans = b.cp_spans.tolist()
        self.loss = b.microbatch_loss_tokens.tolist()
        route = layout.route
        self.route = {name: getattr(route, name).tolist() for name in
                      ("encodings", "references", "dp_ranks", "cp_ranks", "tp_ranks", "microbatches", "starts", "ends")}
        self.reference_trajectories = rows.references.trajectories.tolist()
        self.reference_starts = rows.references.starts.tolist()

    @cached_property
    def route_by_trajectory(self) -> list[list[int]]:
        """Per trajectory, its route rows of TP rank 0 (in route order)."""
        trajectories = self.reference_trajectories
        by_trajectory: list[list[int]] = [[] for _ in self.padded_tokens]
        for row, (reference, tp_rank) in enumerate(zip(self.route["references"], self.route["tp_ranks"], strict=True)):
            if tp_rank == 0:
                by_trajectory[trajectories[reference]].append(row)
        return by_trajectory


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

    @property
    def minibatch_loss_tokens(self) -> int:
        return self.layout.backbone.minibatch_loss_tokens

    def assignment(self, consumer: ConsumerId) -> plan_pb2.ConsumerAssignment:
        return plan_pb2.ConsumerAssignment(**self.assignment_fields(consumer))

    def assignment_fields(self, consumer: ConsumerId) -> dict:
        """``ConsumerAssignment`` constructor fields: what ``plan.for_consumer(consumer).to_proto()`` holds."""
        lists = _Lists(self.layout, self.rows)
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
        return fields

    # ---- backbone ------------------------------------------------------------------------------------------

    def _backbone_microbatches(self, lists: _Lists, dp_rank: int, cp_rank: int) -> list[dict]:
        per_rank = self.layout.backbone.microbatches_per_rank
        offsets, items = lists.offsets, lists.items
        return [
            {
                "index": j,
                "last": j == per_rank - 1,
                "num_loss_tokens": lists.loss[g],
                "items": [self._item(lists, t, cp_rank) for t in items[offsets[g] : offsets[g + 1]]],
            }
            for j, g in ((j, dp_rank * per_rank + j) for j in range(per_rank))
        ]

    def _item(self, lists: _Lists, t: int, cp_rank: int) -> dict:
        rows = self.rows
        cp = self.topology.backbone.cp
        padded = lists.padded_tokens[t]
        chunk_tokens = padded // (2 * cp)
        spans = lists.cp_spans[t][cp_rank]
        chunks = [
            {"chunk": c, "padded": {"start": c * chunk_tokens, "end": (c + 1) * chunk_tokens},
             "tokens": {"start": spans[k][0], "end": spans[k][1]}}
            for k, c in enumerate((cp_rank, 2 * cp - 1 - cp_rank))
        ]
        num_tokens = int(rows.num_tokens[t])
        message = rows.message(t)
        units = message.units
        first = rows.unit_offsets[t]
        reads = []
        read_spans: dict[bool, list[tuple[int, int]]] = {}  # by look-ahead: the same for every field of the item
        for k in range(first, rows.unit_offsets[t + 1]):
            kind = rows.unit_kinds[k]
            if kind == _TOKEN_FIELD:
                unit = units[k - first]
                # As Plan.needs_look_ahead: label fields, and token-aligned fields (packed shifted by one).
                look_ahead = rows.unit_field_names[k] in self.label_fields or unit.alignment == _TOKEN_ALIGNED
                token_spans = read_spans.get(look_ahead)
                if token_spans is None:
                    extra = 1 if look_ahead else 0
                    token_spans = read_spans[look_ahead] = merge_spans(
                        [(s, min(e + extra, num_tokens)) for s, e in spans if e > s]
                    )
                width = rows.unit_row_bytes[k]
                reads.append({
                    "unit": unit,
                    "spans": [{"start": s, "end": e} for s, e in token_spans],
                    "byte_ranges": [{"offset": s * width, "length": (e - s) * width} for s, e in token_spans],
                    "look_ahead": look_ahead,
                })
            elif kind == _FIELD:  # images and videos reach the backbone only as encodings
                reads.append({"unit": units[k - first],
                              "byte_ranges": [{"offset": 0, "length": rows.unit_byte_lengths[k]}]})
        route = lists.route
        starts = lists.reference_starts
        keys = rows.references.keys
        uses = []
        for row in lists.route_by_trajectory[t]:
            if route["cp_ranks"][row] != cp_rank:
                continue
            reference = route["references"][row]
            start = route["starts"][row]
            uses.append({
                "encoding_id": route["encodings"][row],
                "key": keys[reference],
                "positions": {"start": start, "end": route["ends"][row]},
                "row_start": start - starts[reference],
                "reference": reference,
            })
        uses.sort(key=lambda use: use["positions"]["start"])
        return {
            "trajectory_index": t,
            "trajectory": message,
            "padded_tokens": padded,
            "chunks": chunks,
            "reads": reads,
            "encodings": uses,
        }

    # ---- encoders ------------------------------------------------------------------------------------------

    def _encoder_microbatches(self, lists: _Lists, name: str, dp_rank: int) -> list[dict]:
        plan = next(p for p in self.layout.encoders if p.name == name)
        per_rank = plan.microbatches_per_rank
        offsets = plan.microbatch_offsets.tolist()
        encodings = plan.microbatch_encodings.tolist()
        table = self.layout.encodings
        first_of_trajectory = np.searchsorted(self.rows.references.trajectories, table.source_trajectory, side="left")
        sources = (first_of_trajectory + table.source_reference).tolist()
        bounds = np.searchsorted(self.layout.route.encodings, np.arange(len(table) + 1)).tolist()
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

    def _encoding(self, lists: _Lists, e: int, r: int, bounds: list[int]) -> dict:
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

    def _routes(self, lists: _Lists, e: int, bounds: list[int]) -> list[dict]:
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
