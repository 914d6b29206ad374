"""Packing one consumer's micro-batch into training inputs (pure: numpy only, no I/O, no clock).

A backbone micro-batch is packed THD-style for one CP rank (the layout :mod:`knittrans.train.plan_adapter`
assumes): its items in plan order, each contributing its CP rank's two zigzag chunks (chunk r, then chunk
2cp−1−r) at their padded length, ``padded_tokens / cp`` tokens per item; the whole stream is then padded
to ``pack_multiple``. Tensors, each at a 64-byte-aligned offset of one buffer (a shared-memory slot):

- one tensor per per-token field, named after the field, ``[T, *per_token_shape]`` in the stored dtype
  (padding rows: ``pad_token_id`` for the tokens field, 0 otherwise);
- ``labels`` (int64 ``[T]``): the next token of the tokens field, ``label_ignore_index`` where there is none
  (sequence end, padding). Other label fields get ``<field>.next``;
- ``position_ids`` (int64 ``[T]``): global positions of the zigzag chunks (padded coordinates), so every CP
  rank sees the positions the tokens have in the whole sequence;
- ``cu_seqlens`` (int32 ``[n+1]``): item boundaries in the packed stream; ``cu_seqlens_global`` (int32
  ``[n+1]``): boundaries of the padded sequences before the CP split (what THD attention with CP wants);
  ``seq_lengths`` (int32 ``[n]``): real lengths;
- one tensor per non-sequence field, ``[n, *shape]``;
- per scalar that any item of the micro-batch has: ``scalar.<name>`` (float64 ``[n]``, NaN for an item that
  lacks it) and ``scalar_present.<name>`` (uint8 ``[n]``, 1 where the item has it). Trajectories of one job
  may carry different scalar sets (a reward model that scores some of them, say); the mask tells a missing
  value from a reported NaN.

**Alignment.** Every per-target field reaches the trainer *label-aligned*, like ``labels``: packed position t
carries what concerns the prediction of ``labels[t]``. A unit the rollout declared token-aligned
(:class:`~knittrans.types.FieldAlignment`) is shifted left by one inside its trajectory (packed ``[t]`` =
stored ``[t+1]``, 0 at the last real token), which needs the token after each CP chunk: the planner reads it
with one token of look-ahead, as it does for label fields. A label-aligned or undeclared unit is packed as
stored. The loss mask (``loss_mask_field``) is also 0 at each trajectory's last real token, whose label is
ignored; without a stored one it is generated (uint8, 1 on every real token that has a label). So
``count_nonzero(loss_mask)`` over all ranks is exactly the positions the loss uses, which the rollout reported
as ``num_loss_tokens`` and the planner sums into the mini-batch's global loss-token count.

The work is split so that the bytes can be read *straight into place*: :func:`backbone_layout` says where
every read lands (directly in its final tensor where the packed layout keeps the read's bytes contiguous,
otherwise in a scratch buffer), the reader moves the bytes, and :func:`fill_backbone` writes the rest
(padding, labels, positions, boundaries, scratch copies). :func:`pack_backbone` runs the three steps on
bytes already in memory.

Encoder micro-batches hold unique multimodal inputs, read whole into ``inputs`` (``[n, *shape]`` when all
share dtype and shape, otherwise ``inputs.<k>`` each).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from knittrans.errors import InvalidArgument
from knittrans.packed.dtypes import numpy_dtype
from knittrans.packed.layout import item_offsets, packed_encoding_uses
from knittrans.packed.tensors import PackedEncodingUse, TensorSpec, aligned, check_tensor_name
from knittrans.plan import (
    EncoderMicroBatchAssignment,
    ItemAssignment,
    MicroBatchAssignment,
    merge_spans,
)
from knittrans.tensor_names import (
    CU_SEQLENS,
    CU_SEQLENS_GLOBAL,
    GENERATED_NAMES,
    LABELS,
    POSITION_IDS,
    SCALAR_PREFIX,
    SCALAR_PRESENT_PREFIX,
    SEQ_LENGTHS,
)
from knittrans.types import ByteRange, DType, FieldAlignment, UnitKey, UnitKind, UnitRef

ENCODER_INPUTS = "inputs"


@dataclass(frozen=True, kw_only=True)
class PackSettings:
    """How micro-batches are packed; the same on every sidecar of a job."""

    tokens_field: str = "input_ids"
    loss_mask_field: str = "loss_mask"
    pad_token_id: int = 0
    label_ignore_index: int = -100
    pack_multiple: int = 1  # the packed stream is padded to a multiple of this many tokens

    def __post_init__(self) -> None:
        check_tensor_name(self.tokens_field, "tokens_field")
        check_tensor_name(self.loss_mask_field, "loss_mask_field")
        if not isinstance(self.pack_multiple, int) or isinstance(self.pack_multiple, bool) or self.pack_multiple < 1:
            raise InvalidArgument(f"must be a positive integer, got {self.pack_multiple!r}", field="pack_multiple")
        for name in ("pad_token_id", "label_ignore_index"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise InvalidArgument(f"must be an integer, got {value!r}", field=name)


class Destination(StrEnum):
    SLOT = "slot"  # straight into its final tensor
    SCRATCH = "scratch"  # into the scratch buffer; fill_* copies it into place


@dataclass(frozen=True, kw_only=True)
class ReadPlacement:
    """One batched-read entry: ``ranges`` of unit ``key`` (the whole unit when None) land back to back at
    ``offset`` of the slot or the scratch buffer."""

    key: UnitKey
    ranges: tuple[ByteRange, ...] | None
    destination: Destination
    offset: int
    byte_length: int


@dataclass(frozen=True, kw_only=True)
class _TokenField:
    name: str
    dtype: DType
    row_shape: tuple[int, ...]
    labels: bool  # a label field: next-token values go to their own tensor

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.row_shape, dtype=np.int64)) * self.dtype.itemsize


@dataclass(frozen=True, kw_only=True)
class _ItemReads:
    """Per item: for each token field, the placement index; non-sequence placements; token-aligned fields."""

    token: Mapping[str, int]
    fields: Mapping[str, int]
    shifted: frozenset[str] = frozenset()


@dataclass(frozen=True, kw_only=True, eq=False)
class PackLayout:
    """Where everything of one packed micro-batch goes (see the module docstring)."""

    tensors: tuple[TensorSpec, ...]
    used_bytes: int
    scratch_bytes: int
    reads: tuple[ReadPlacement, ...]
    item_offsets: tuple[int, ...]  # first packed token of each item
    num_tokens: int  # packed tokens, trailing padding included
    real_end: int = 0  # end of the last item (cu_seqlens[-1]); trailing padding follows
    encodings: tuple[PackedEncodingUse, ...] = ()
    token_fields: tuple[_TokenField, ...] = ()
    item_reads: tuple[_ItemReads, ...] = ()

    @property
    def needed_bytes(self) -> int:
        """Bytes the plan needs for this micro-batch: every read, look-ahead included."""
        return sum(r.byte_length for r in self.reads)

    def tensor(self, name: str) -> TensorSpec:
        for spec in self.tensors:
            if spec.name == name:
                return spec
        raise InvalidArgument(f"no tensor {name!r}", field="name")

    def has_tensor(self, name: str) -> bool:
        return any(spec.name == name for spec in self.tensors)


class _Allocator:
    def __init__(self) -> None:
        self.specs: list[TensorSpec] = []
        self.end = 0

    def add(self, name: str, dtype: DType, shape: tuple[int, ...]) -> TensorSpec:
        check_tensor_name(name, "tensor")
        if any(spec.name == name for spec in self.specs):
            raise InvalidArgument(f"two tensors would be named {name!r}", field="tensor")
        spec = TensorSpec(name=name, dtype=dtype, shape=shape, offset=aligned(self.end))
        self.specs.append(spec)
        self.end = spec.end
        return spec


def tensor_view(buffer: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """The typed view of ``spec`` inside a uint8 buffer (no copy)."""
    raw = buffer[spec.offset : spec.end]
    return raw.view(numpy_dtype(spec.dtype)).reshape(spec.shape)


# --------------------------------------------------------------------------------------------------------------
# Backbone
# --------------------------------------------------------------------------------------------------------------


def _chunk_tokens(item: ItemAssignment) -> int:
    return item.chunks[0].padded.length


def _check_item(item: ItemAssignment, cp: int, where: str) -> None:
    if len(item.chunks) != 2:
        raise InvalidArgument(f"needs two zigzag chunks, got {len(item.chunks)}", field=f"{where}.chunks")
    length = item.padded_tokens // (2 * cp)
    for k, chunk in enumerate(item.chunks):
        if chunk.padded.length != length or chunk.padded.start != chunk.chunk * length:
            raise InvalidArgument(f"chunk {chunk.chunk} is not [{chunk.chunk}·{length}, +{length})",
                                  field=f"{where}.chunks[{k}]")
        tokens = chunk.tokens
        if tokens.length and (tokens.start != chunk.padded.start or tokens.end > chunk.padded.end):
            raise InvalidArgument("real tokens must start the chunk", field=f"{where}.chunks[{k}].tokens")


def _token_fields(mb: MicroBatchAssignment, settings: PackSettings) -> tuple[_TokenField, ...]:
    fields: dict[str, _TokenField] = {}
    for i, item in enumerate(mb.items):
        names = set()
        for r, read in enumerate(item.reads):
            unit = read.unit
            if unit.kind is not UnitKind.TOKEN_FIELD:
                continue
            names.add(unit.field_name)
            shifted = unit.alignment is FieldAlignment.TOKEN
            if shifted and unit.field_name == settings.tokens_field:
                raise InvalidArgument("the tokens field is an input; it cannot be token-aligned",
                                      field=f"items[{i}].reads[{r}].unit.alignment")
            if shifted and not read.look_ahead:
                raise InvalidArgument("a token-aligned field is packed shifted by one and needs look-ahead reads",
                                      field=f"items[{i}].reads[{r}].look_ahead")
            field = _TokenField(name=unit.field_name, dtype=unit.header.dtype, row_shape=unit.header.shape[1:],
                                labels=read.look_ahead and not shifted)
            known = fields.setdefault(unit.field_name, field) if i == 0 else fields.get(unit.field_name)
            if known != field:
                raise InvalidArgument(
                    f"field {unit.field_name!r} differs from the micro-batch's first item (dtype, shape or label use)",
                    field=f"items[{i}].reads[{r}]",
                )
        if names != set(fields):
            raise InvalidArgument(
                f"has per-token fields {sorted(names)}, the first item has {sorted(fields)}", field=f"items[{i}].reads"
            )
    return tuple(fields.values())


def _non_sequence_fields(mb: MicroBatchAssignment) -> dict[str, list[UnitRef]]:
    fields: dict[str, list[UnitRef]] = {}
    for i, item in enumerate(mb.items):
        units = [read.unit for read in item.reads if read.unit.kind is UnitKind.FIELD]
        names = {u.field_name for u in units}
        if i and names != set(fields):
            raise InvalidArgument(
                f"has non-sequence fields {sorted(names)}, the first item has {sorted(fields)}",
                field=f"items[{i}].reads",
            )
        for unit in units:
            fields.setdefault(unit.field_name, []).append(unit)
    return fields


def _scalar_names(mb: MicroBatchAssignment) -> tuple[str, ...]:
    """Every scalar any item has, sorted (an item without one gets NaN and a 0 in its presence mask)."""
    return tuple(sorted({name for item in mb.items for name, _ in item.trajectory.scalars}))


def label_tensor_name(field_name: str, settings: PackSettings) -> str:
    return LABELS if field_name == settings.tokens_field else f"{field_name}.next"


def _direct_spans(item: ItemAssignment) -> list[tuple[int, int]]:
    """The read spans under which a field's bytes land back to back exactly where the packed layout wants
    them: the chunks' real tokens, no look-ahead. (When both chunks hold tokens the first one is full, so
    its end meets the second one's start in the packed stream.)"""
    return merge_spans([(c.tokens.start, c.tokens.end) for c in item.chunks])


def backbone_layout(mb: MicroBatchAssignment, *, cp: int, settings: PackSettings) -> PackLayout:
    """Where every tensor and every read of backbone micro-batch ``mb`` (one CP rank's part) goes."""
    for i, item in enumerate(mb.items):
        _check_item(item, cp, f"items[{i}]")
    offsets = list(item_offsets(mb, cp))
    real_end = offsets[-1] + mb.items[-1].padded_tokens // cp if mb.items else 0
    total = -(-real_end // settings.pack_multiple) * settings.pack_multiple
    n = len(mb.items)

    token_fields = _token_fields(mb, settings)
    non_sequence = _non_sequence_fields(mb)
    scalars = _scalar_names(mb)
    field_names = {f.name for f in token_fields} | set(non_sequence)
    clash = field_names & GENERATED_NAMES
    if clash:
        raise InvalidArgument(f"field names {sorted(clash)} are reserved for generated tensors", field="items.reads")

    alloc = _Allocator()
    field_specs = {f.name: alloc.add(f.name, f.dtype, (total, *f.row_shape)) for f in token_fields}
    for f in token_fields:
        if f.labels:
            if f.row_shape or f.dtype not in _INTEGER_DTYPES:
                raise InvalidArgument(f"labels need a 1-D integer field, {f.name!r} is {f.dtype} {f.row_shape}",
                                      field="label_fields")
            alloc.add(label_tensor_name(f.name, settings), DType.INT64, (total,))
    if settings.loss_mask_field not in field_specs:
        alloc.add(settings.loss_mask_field, DType.UINT8, (total,))
    alloc.add(POSITION_IDS, DType.INT64, (total,))
    alloc.add(CU_SEQLENS, DType.INT32, (n + 1,))
    alloc.add(CU_SEQLENS_GLOBAL, DType.INT32, (n + 1,))
    alloc.add(SEQ_LENGTHS, DType.INT32, (n,))
    non_sequence_specs: dict[str, TensorSpec | list[TensorSpec]] = {}
    for name, units in non_sequence.items():
        headers = {(u.header.dtype, u.header.shape) for u in units}
        if len(headers) == 1:
            dtype, shape = headers.pop()
            non_sequence_specs[name] = alloc.add(name, dtype, (n, *shape))
        else:
            non_sequence_specs[name] = [
                alloc.add(f"{name}.{i}", u.header.dtype, u.header.shape) for i, u in enumerate(units)
            ]
    for name in scalars:
        alloc.add(f"{SCALAR_PREFIX}{name}", DType.FLOAT64, (n,))
        alloc.add(f"{SCALAR_PRESENT_PREFIX}{name}", DType.UINT8, (n,))

    reads: list[ReadPlacement] = []
    item_reads: list[_ItemReads] = []
    scratch_end = 0
    for i, (item, offset) in enumerate(zip(mb.items, offsets, strict=True)):
        token_placements: dict[str, int] = {}
        field_placements: dict[str, int] = {}
        shifted: set[str] = set()
        direct = _direct_spans(item)
        for read in item.reads:
            unit = read.unit
            length = read.needed_bytes
            if unit.kind is UnitKind.TOKEN_FIELD:
                if unit.alignment is FieldAlignment.TOKEN:
                    shifted.add(unit.field_name)
                if length == 0:
                    continue
                spans = [(s.start, s.end) for s in read.spans]
                if not read.look_ahead and spans == direct:
                    spec = field_specs[unit.field_name]
                    row = next(f.row_bytes for f in token_fields if f.name == unit.field_name)
                    placement = ReadPlacement(key=unit.key, ranges=read.byte_ranges, destination=Destination.SLOT,
                                              offset=spec.offset + offset * row, byte_length=length)
                else:
                    scratch_end = aligned(scratch_end)
                    placement = ReadPlacement(key=unit.key, ranges=read.byte_ranges, destination=Destination.SCRATCH,
                                              offset=scratch_end, byte_length=length)
                    scratch_end += length
                token_placements[unit.field_name] = len(reads)
                reads.append(placement)
            elif unit.kind is UnitKind.FIELD:
                target = non_sequence_specs[unit.field_name]
                if isinstance(target, list):
                    start = target[i].offset
                else:
                    start = target.offset + i * unit.header.byte_length
                field_placements[unit.field_name] = len(reads)
                reads.append(ReadPlacement(key=unit.key, ranges=None, destination=Destination.SLOT, offset=start,
                                           byte_length=unit.header.byte_length))
        item_reads.append(_ItemReads(token=token_placements, fields=field_placements, shifted=frozenset(shifted)))

    return PackLayout(
        tensors=tuple(alloc.specs),
        used_bytes=alloc.end,
        scratch_bytes=scratch_end,
        reads=tuple(reads),
        item_offsets=tuple(offsets),
        num_tokens=total,
        real_end=real_end,
        encodings=packed_encoding_uses(mb, offsets),
        token_fields=token_fields,
        item_reads=tuple(item_reads),
    )


_INTEGER_DTYPES = frozenset(
    {DType.UINT8, DType.INT8, DType.UINT16, DType.INT16, DType.INT32, DType.UINT32, DType.INT64}
)


def _scratch_rows(scratch: np.ndarray, placement: ReadPlacement, field: _TokenField) -> np.ndarray:
    raw = scratch[placement.offset : placement.offset + placement.byte_length]
    return raw.view(numpy_dtype(field.dtype)).reshape((-1, *field.row_shape))


def fill_backbone(
    layout: PackLayout,
    mb: MicroBatchAssignment,
    slot: np.ndarray,
    scratch: np.ndarray,
    *,
    settings: PackSettings,
) -> None:
    """Complete a micro-batch whose reads have landed (``slot`` and ``scratch`` are uint8 buffers): copy the
    scratch reads into place (shifting token-aligned fields) and write padding, labels, loss mask, positions,
    boundaries and scalars."""
    if slot.dtype != np.uint8 or slot.nbytes < layout.used_bytes:
        raise InvalidArgument(f"needs a uint8 buffer of at least {layout.used_bytes} bytes", field="slot")
    views = {spec.name: tensor_view(slot, spec) for spec in layout.tensors}
    real_end = layout.real_end
    positions = views[POSITION_IDS]
    synthetic_mask = None if any(f.name == settings.loss_mask_field for f in layout.token_fields) else views[
        settings.loss_mask_field]

    for i, (item, offset) in enumerate(zip(mb.items, layout.item_offsets, strict=True)):
        length = _chunk_tokens(item)
        reads = layout.item_reads[i]
        num_tokens = item.trajectory.num_tokens
        # Spans hold real tokens only; rows [offset + k·length + n_k, offset + (k+1)·length) are padding.
        runs = [(offset + k * length, c.tokens.start, c.tokens.length, c.padded.start)
                for k, c in enumerate(item.chunks)]
        # The packed row of the item's last real token, if this CP rank holds it: its label is ignored.
        last_row = next((dest + count - 1 for dest, start, count, _ in runs if count and start + count == num_tokens),
                        None)
        for dest, _, _, padded_start in runs:
            positions[dest : dest + length] = np.arange(padded_start, padded_start + length, dtype=np.int64)
        if synthetic_mask is not None:
            synthetic_mask[offset : offset + 2 * length] = 0
            for dest, _, count, _ in runs:
                synthetic_mask[dest : dest + count] = 1
        for field in layout.token_fields:
            tensor = views[field.name]
            pad = settings.pad_token_id if field.name == settings.tokens_field else 0
            shift = field.name in reads.shifted
            placement_index = reads.token.get(field.name)
            placement = layout.reads[placement_index] if placement_index is not None else None
            source = None
            if placement is not None and placement.destination is Destination.SCRATCH:
                source = _scratch_rows(scratch, placement, field)
                span_rows = _span_rows(item, field.name)
            labels = views[label_tensor_name(field.name, settings)] if field.labels else None
            for dest, token_start, count, _ in runs:
                # Rows whose next token is real: where labels (and shifted fields) take the next token's value.
                available = min(count, num_tokens - token_start - 1)
                if source is not None and count:
                    row = span_rows(token_start)
                    if shift:  # token-aligned: packed [t] = stored [t+1], 0 where there is no next token
                        tensor[dest : dest + available] = source[row + 1 : row + 1 + available]
                        tensor[dest + available : dest + count] = 0
                    else:
                        tensor[dest : dest + count] = source[row : row + count]
                    if labels is not None:
                        labels[dest : dest + available] = source[row + 1 : row + 1 + available]
                        labels[dest + available : dest + count] = settings.label_ignore_index
                elif (labels is not None or shift) and count:
                    raise InvalidArgument(f"field {field.name!r} needs the next token but was not read with "
                                          "look-ahead", field=f"items[{i}].reads")
                tensor[dest + count : dest + length] = pad
                if labels is not None:
                    labels[dest + count : dest + length] = settings.label_ignore_index
        if last_row is not None:
            views[settings.loss_mask_field][last_row] = 0

    # Trailing padding of the whole stream.
    tail = slice(real_end, layout.num_tokens)
    for field in layout.token_fields:
        views[field.name][tail] = settings.pad_token_id if field.name == settings.tokens_field else 0
        if field.labels:
            views[label_tensor_name(field.name, settings)][tail] = settings.label_ignore_index
    if synthetic_mask is not None:
        synthetic_mask[tail] = 0
    positions[tail] = np.arange(layout.num_tokens - real_end, dtype=np.int64)

    views[CU_SEQLENS][:] = np.array([*layout.item_offsets, real_end], dtype=np.int32)
    padded = np.array([item.padded_tokens for item in mb.items], dtype=np.int64)
    views[CU_SEQLENS_GLOBAL][:] = np.concatenate([[0], np.cumsum(padded)]).astype(np.int32)
    views[SEQ_LENGTHS][:] = np.array([item.trajectory.num_tokens for item in mb.items], dtype=np.int32)
    scalars = [dict(item.trajectory.scalars) for item in mb.items]
    for spec in layout.tensors:
        if spec.name.startswith(SCALAR_PREFIX):
            name = spec.name[len(SCALAR_PREFIX) :]
            views[spec.name][:] = [values.get(name, np.nan) for values in scalars]
            views[f"{SCALAR_PRESENT_PREFIX}{name}"][:] = [name in values for values in scalars]


def _span_rows(item: ItemAssignment, field_name: str) -> Callable[[int], int]:
    """token -> row of the field's scratch read (its spans lie back to back)."""
    read = next(r for r in item.reads if r.unit.field_name == field_name)
    bases, row = [], 0
    for span in read.spans:
        bases.append((span.start, span.end, row))
        row += span.length

    def row_of(token: int) -> int:
        for start, end, base in bases:
            if start <= token < end:
                return base + token - start
        raise InvalidArgument(f"token {token} was not read", field=f"reads.{field_name}")

    return row_of


def pack_backbone(
    mb: MicroBatchAssignment,
    read_bytes: Sequence[bytes | np.ndarray | memoryview],
    *,
    cp: int,
    settings: PackSettings,
) -> tuple[PackLayout, np.ndarray]:
    """Pack a micro-batch from bytes already in memory: ``read_bytes[j]`` holds what placement ``j`` of
    :func:`backbone_layout` reads. Returns the layout and the packed buffer (view it with :func:`tensor_view`)."""
    layout = backbone_layout(mb, cp=cp, settings=settings)
    if len(read_bytes) != len(layout.reads):
        raise InvalidArgument(f"needs {len(layout.reads)} reads, got {len(read_bytes)}", field="read_bytes")
    slot = np.zeros(max(layout.used_bytes, 1), dtype=np.uint8)
    scratch = np.zeros(max(layout.scratch_bytes, 1), dtype=np.uint8)
    for placement, data in zip(layout.reads, read_bytes, strict=True):
        # numpy's stubs declare ndarray.__buffer__ only for Python >= 3.12, though 3.11's ndarray is a buffer.
        raw = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)  # type: ignore[arg-type]
        if raw.nbytes != placement.byte_length:
            raise InvalidArgument(f"read of {placement.key} has {raw.nbytes} bytes, expected {placement.byte_length}",
                                  field="read_bytes")
        target = slot if placement.destination is Destination.SLOT else scratch
        target[placement.offset : placement.offset + placement.byte_length] = raw
    fill_backbone(layout, mb, slot, scratch, settings=settings)
    return layout, slot


# --------------------------------------------------------------------------------------------------------------
# Encoder
# --------------------------------------------------------------------------------------------------------------


def encoder_layout(mb: EncoderMicroBatchAssignment) -> PackLayout:
    """Where the unique inputs of encoder micro-batch ``mb`` go: read whole, straight into their tensors."""
    headers = []
    for k, assignment in enumerate(mb.encodings):
        header = assignment.encoding.header
        if header is None:
            raise InvalidArgument("the rollout reported no stored header, so it cannot be read",
                                  field=f"encodings[{k}].encoding.header")
        headers.append(header)
    alloc = _Allocator()
    reads = []
    kinds = {(h.dtype, h.shape) for h in headers}
    if len(kinds) == 1:
        dtype, shape = kinds.pop()
        spec = alloc.add(ENCODER_INPUTS, dtype, (len(headers), *shape))
        offsets = [spec.offset + k * h.byte_length for k, h in enumerate(headers)]
    else:
        offsets = [alloc.add(f"{ENCODER_INPUTS}.{k}", h.dtype, h.shape).offset for k, h in enumerate(headers)]
    for assignment, header, offset in zip(mb.encodings, headers, offsets, strict=True):
        reads.append(ReadPlacement(key=assignment.encoding.key, ranges=None, destination=Destination.SLOT,
                                   offset=offset, byte_length=header.byte_length))
    return PackLayout(tensors=tuple(alloc.specs), used_bytes=alloc.end, scratch_bytes=0, reads=tuple(reads),
                      item_offsets=(), num_tokens=0)
