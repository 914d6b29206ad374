"""Completing a backbone micro-batch once its reads have landed where :func:`~.layout.backbone_layout` put them:
the scratch copies, padding, labels, loss mask, positions, boundaries and scalars (pure: numpy only)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from knittrans.errors import InvalidArgument
from knittrans.packed.dtypes import numpy_dtype
from knittrans.plan import ItemAssignment, MicroBatchAssignment
from knittrans.reorg.packing.layout import (
    Destination,
    PackLayout,
    PackSettings,
    ReadPlacement,
    TokenField,
    backbone_layout,
    label_tensor_name,
    mask_tensor_name,
    tensor_view,
)
from knittrans.tensor_names import (
    CU_SEQLENS,
    CU_SEQLENS_GLOBAL,
    POSITION_IDS,
    SCALAR_PREFIX,
    SCALAR_PRESENT_PREFIX,
    SEQ_LENGTHS,
)
from knittrans.types import DType


def _chunk_tokens(item: ItemAssignment) -> int:
    return item.chunks[0].padded.length


def _scratch_rows(scratch: np.ndarray, placement: ReadPlacement, field: TokenField) -> np.ndarray:
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
            if field.response:
                first = item.trajectory.response_start
                _fill_response_field(tensor, views[mask_tensor_name(field.name)], runs, length, source,
                                     span_rows if source is not None else None, first=first, shift=shift,
                                     num_tokens=num_tokens, where=f"items[{i}].reads")
                continue
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
        if field.response:
            views[mask_tensor_name(field.name)][tail] = 0
        if field.labels:
            views[label_tensor_name(field.name, settings)][tail] = settings.label_ignore_index
    if synthetic_mask is not None:
        synthetic_mask[tail] = 0
    positions[tail] = np.arange(layout.num_tokens - real_end, dtype=np.int64)

    views[CU_SEQLENS][:] = np.array([*layout.item_offsets, real_end], dtype=np.int32)
    padded = np.array([item.padded_tokens for item in mb.items], dtype=np.int64)
    views[CU_SEQLENS_GLOBAL][:] = np.concatenate([[0], np.cumsum(padded)]).astype(np.int32)
    views[SEQ_LENGTHS][:] = np.array([item.trajectory.num_tokens for item in mb.items], dtype=np.int32)
    # Every kind of scalar of an item, by name; ingest keeps a name to one kind.
    scalars = [{**dict(item.trajectory.scalars), **dict(item.trajectory.values.int_scalars),
                **dict(item.trajectory.values.bool_scalars)} for item in mb.items]
    for spec in layout.tensors:
        if spec.name.startswith(SCALAR_PREFIX):
            name = spec.name[len(SCALAR_PREFIX) :]
            missing = np.nan if spec.dtype is DType.FLOAT64 else 0
            views[spec.name][:] = [values.get(name, missing) for values in scalars]
            views[f"{SCALAR_PRESENT_PREFIX}{name}"][:] = [name in values for values in scalars]


def _fill_response_field(
    tensor: np.ndarray,
    mask: np.ndarray,
    runs: Sequence[tuple[int, int, int, int]],
    length: int,
    source: np.ndarray | None,
    span_rows: Callable[[int], int] | None,
    *,
    first: int,
    shift: bool,
    num_tokens: int,
    where: str,
) -> None:
    """One item's rows of a response-only field, whose stored row j is token ``first + j``: packed position t holds
    what a whole-sequence field padded with 0 over the prompt would hold there (its token t, or t+1 when shifted),
    and the mask is 1 exactly where that is a stored value. ``source`` is the scratch read (None: the read landed in
    place, or there was nothing to read)."""
    step = 1 if shift else 0
    for dest, token_start, count, _ in runs:
        # Positions [token_start, token_start + end) have a value (a shifted one needs a next real token) ...
        end = max(min(count, num_tokens - token_start - step), 0)
        # ... and the first `skip` of them take it from the prompt, which the field does not cover.
        skip = min(max(first - step - token_start, 0), end)
        tensor[dest : dest + skip] = 0
        mask[dest : dest + skip] = 0
        if end > skip:
            if source is not None and span_rows is not None:
                row = span_rows(token_start + skip + step)
                tensor[dest + skip : dest + end] = source[row : row + end - skip]
            elif shift or skip:
                raise InvalidArgument("a response-only field's read did not land in a scratch buffer", field=where)
            mask[dest + skip : dest + end] = 1
        tensor[dest + end : dest + length] = 0
        mask[dest + end : dest + length] = 0


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
