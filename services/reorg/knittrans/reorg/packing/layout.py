"""Where everything of a packed micro-batch goes: the tensors' offsets in the slot, and where each read lands
(pure; see :mod:`knittrans.reorg.packing` for the layout itself)."""

from __future__ import annotations

from collections.abc import Mapping
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
    MASK_SUFFIX,
    POSITION_IDS,
    SCALAR_PREFIX,
    SCALAR_PRESENT_PREFIX,
    SEQ_LENGTHS,
)
from knittrans.types import ByteRange, Coverage, DType, FieldAlignment, UnitKey, UnitKind, UnitRef
from knittrans.values import ScalarKind

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
class TokenField:
    name: str
    dtype: DType
    row_shape: tuple[int, ...]
    labels: bool  # a label field: next-token values go to their own tensor
    response: bool = False  # covers only the response: 0 over the prompt, and a mask tensor (mask_tensor_name)

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.row_shape, dtype=np.int64)) * self.dtype.itemsize


@dataclass(frozen=True, kw_only=True)
class ItemReads:
    """Per item: for each token field, the placement index; non-sequence placements; token-aligned fields."""

    token: Mapping[str, int]
    fields: Mapping[str, int]
    shifted: frozenset[str] = frozenset()


@dataclass(frozen=True, kw_only=True, eq=False)
class PackLayout:
    """Where everything of one packed micro-batch goes (see :mod:`knittrans.reorg.packing`)."""

    tensors: tuple[TensorSpec, ...]
    used_bytes: int
    scratch_bytes: int
    reads: tuple[ReadPlacement, ...]
    item_offsets: tuple[int, ...]  # first packed token of each item
    num_tokens: int  # packed tokens, trailing padding included
    real_end: int = 0  # end of the last item (cu_seqlens[-1]); trailing padding follows
    encodings: tuple[PackedEncodingUse, ...] = ()
    token_fields: tuple[TokenField, ...] = ()
    item_reads: tuple[ItemReads, ...] = ()

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


def _token_fields(mb: MicroBatchAssignment, settings: PackSettings) -> tuple[TokenField, ...]:
    fields: dict[str, TokenField] = {}
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
            response = unit.coverage is Coverage.RESPONSE
            if response and unit.field_name == settings.tokens_field:
                raise InvalidArgument("the tokens field must cover the whole sequence",
                                      field=f"items[{i}].reads[{r}].unit.coverage")
            field = TokenField(name=unit.field_name, dtype=unit.header.dtype, row_shape=unit.header.shape[1:],
                               labels=read.look_ahead and not shifted, response=response)
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


_SCALAR_DTYPES = {ScalarKind.FLOAT: DType.FLOAT64, ScalarKind.INT: DType.INT64, ScalarKind.BOOL: DType.BOOL}


def scalar_kinds(mb: MicroBatchAssignment) -> dict[str, ScalarKind]:
    """Every scalar any item has, sorted, with its kind (an item without one gets NaN, 0 or false, and a 0 in its
    presence mask). Ingest keeps a name to one kind per job."""
    kinds: dict[str, ScalarKind] = {}
    for i, item in enumerate(mb.items):
        trajectory = item.trajectory
        for names, kind in (((name for name, _ in trajectory.scalars), ScalarKind.FLOAT),
                            ((name for name, _ in trajectory.values.int_scalars), ScalarKind.INT),
                            ((name for name, _ in trajectory.values.bool_scalars), ScalarKind.BOOL)):
            for name in names:
                if kinds.setdefault(name, kind) is not kind:
                    raise InvalidArgument(f"scalar {name!r} is {kind} here, {kinds[name]} in an earlier item",
                                          field=f"items[{i}].trajectory.values")
    return dict(sorted(kinds.items()))


def label_tensor_name(field_name: str, settings: PackSettings) -> str:
    return LABELS if field_name == settings.tokens_field else f"{field_name}.next"


def mask_tensor_name(field_name: str) -> str:
    """A response-only field's mask: 1 where the packed field holds a stored value, 0 where it was filled."""
    return f"{field_name}{MASK_SUFFIX}"


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
    scalars = scalar_kinds(mb)
    field_names = {f.name for f in token_fields} | set(non_sequence)
    clash = field_names & GENERATED_NAMES
    if clash:
        raise InvalidArgument(f"field names {sorted(clash)} are reserved for generated tensors", field="items.reads")

    alloc = _Allocator()
    field_specs = {f.name: alloc.add(f.name, f.dtype, (total, *f.row_shape)) for f in token_fields}
    for f in token_fields:
        if f.labels:
            if f.row_shape or f.dtype not in _INTEGER_DTYPES or f.response:
                raise InvalidArgument(f"labels need a 1-D integer field over the whole sequence, {f.name!r} is "
                                      f"{f.dtype} {f.row_shape}{' (response only)' if f.response else ''}",
                                      field="label_fields")
            alloc.add(label_tensor_name(f.name, settings), DType.INT64, (total,))
        if f.response:
            alloc.add(mask_tensor_name(f.name), DType.UINT8, (total,))
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
    for name, kind in scalars.items():
        alloc.add(f"{SCALAR_PREFIX}{name}", _SCALAR_DTYPES[kind], (n,))
        alloc.add(f"{SCALAR_PRESENT_PREFIX}{name}", DType.UINT8, (n,))

    reads: list[ReadPlacement] = []
    item_reads: list[ItemReads] = []
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
        item_reads.append(ItemReads(token=token_placements, fields=field_placements, shifted=frozenset(shifted)))

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
