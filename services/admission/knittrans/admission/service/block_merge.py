"""Small reports' columns merged into one block, so that a pending trajectory costs the same whatever the size of
the report it came in.

The ledger keeps each applied report's metadata as one block of columns (:class:`TrajectoryColumns`, a few dozen
arrays and tuples). A report of 10 trajectories pays that fixed cost for 10 rows, one of 1,000 for 1,000: about
800 bytes more per pending trajectory in reports of 10. Once ``COALESCE_AT`` blocks of fewer than ``SMALL_BLOCK``
rows have gathered, their live rows are merged into one block (:func:`merge_rows`). The merge shares the strings
(ids, keys, hashes) with the blocks it replaces, which the unit index references too, so nothing is held twice;
rows of reports that came as messages keep their block (their original messages are what the ledger answers).

Merges are kept short: a few blocks at a time (a merged block that is still small is merged again later).
Merging 64 at once cost about 9 ms in the service every 64 small reports, which set the report-to-assignment p99;
merging 8 costs one or two milliseconds, for about 100 bytes more per pending trajectory in reports of 10. Even
that is kept off the report's path: applying a record only notes its block (:func:`note_small_block`), and the
merge (:func:`merge_small_blocks`) is queued on the event loop when the mutating call that made it due lets go
of the commit lock (``JournaledCommits.mutating``), behind that call's answer and the assignment streams it woke.
Applying a record merges only as a backstop, when far more small blocks gathered than a merge takes (a journal's
recovery applies records back to back).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import TYPE_CHECKING

import numpy as np

from knittrans.admission.service.compact_columns import PackedHashes, join_packed
from knittrans.admission.service.header_columns import HeaderColumns, gather_index, offsets_of
from knittrans.admission.service.trajectory_columns import TrajectoryColumns, _header_index
from knittrans.wire.trajectory import TRAJECTORY_COLUMNS

if TYPE_CHECKING:
    from knittrans.admission.service.ledger import AdmissionLedger

SMALL_BLOCK = 128  # rows
COALESCE_AT = 8  # small blocks (see the module docstring)
BACKSTOP_AT = 4 * COALESCE_AT  # small blocks merged as a record is applied, when nobody merged them since


def note_small_block(ledger: AdmissionLedger) -> None:
    """Call after each applied record: notes the block it added, if small; merges only as the backstop (see the
    module docstring)."""
    newest = ledger._next_block - 1
    if newest > ledger._examined_block:
        ledger._examined_block = newest
        block = ledger._blocks.get(newest)
        if block is not None and block.columns.messages is None and len(block.columns) < SMALL_BLOCK:
            ledger._small_blocks.append(newest)
    if len(ledger._small_blocks) >= BACKSTOP_AT:
        merge_blocks(ledger, ledger._small_blocks)


def merge_due(ledger: AdmissionLedger) -> bool:
    return len(ledger._small_blocks) >= COALESCE_AT


def merge_small_blocks(ledger: AdmissionLedger) -> None:
    """Merge the small blocks noted, if ``COALESCE_AT`` of them gathered."""
    if merge_due(ledger):
        merge_blocks(ledger, ledger._small_blocks)


def merge_blocks(ledger: AdmissionLedger, numbers: Sequence[int]) -> None:
    """Replace these blocks by one block of their live rows, in order. The blocks are dropped only once the merged
    one is made: a merge that fails leaves the ledger as it was (it runs on the loop, after the reports it holds
    were acknowledged)."""
    from knittrans.admission.service.ledger import _BLOCK_SHIFT, _Block

    ledger.forget_released_rows()  # released rows still held would not move to the merged block
    parts: list[tuple[TrajectoryColumns, list[int]]] = []
    oldest: list[int] = []
    rows_of = ledger._rows
    merged = [number for number in numbers if number in ledger._blocks]
    for number in merged:
        block = ledger._blocks[number]
        base = number << _BLOCK_SHIFT
        rows = [i for i, t in enumerate(block.columns.trajectory_ids) if rows_of.get(t) == base + i]
        if rows:
            parts.append((block.columns, rows))
            oldest.extend(block.oldest[i] for i in rows)
    columns = merge_rows(parts) if parts else None
    ledger._small_blocks = []
    for number in merged:
        del ledger._blocks[number]
    if columns is None:
        return
    number = ledger._next_block
    ledger._next_block += 1
    ledger._examined_block = number
    ledger._blocks[number] = _Block(columns, len(columns), oldest)
    base = number << _BLOCK_SHIFT
    rows_of.update(zip(columns.trajectory_ids, range(base, base + len(columns)), strict=True))
    if len(columns) < SMALL_BLOCK:
        ledger._small_blocks.append(number)


def _concat(arrays: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype=dtype)


def _pick(values: Sequence, indices: np.ndarray) -> list:
    gather = getattr(values, "gather", None)  # packed digests: one hex conversion, not one lookup per digest
    if gather is not None:
        return gather(indices)
    return list(map(values.__getitem__, indices.tolist()))


def _merge_headers(parts: list[tuple[HeaderColumns, np.ndarray]]) -> HeaderColumns:
    ranks = _concat([h.ranks[k] for h, k in parts], np.int64)
    return HeaderColumns(
        dtypes=_concat([h.dtypes[k] for h, k in parts], np.int64),
        ranks=ranks,
        shape_offsets=offsets_of(ranks),
        shape=_concat([h.shape[gather_index(h.shape_offsets, k)] for h, k in parts], np.uint64),
        has_seq_axis=_concat([h.has_seq_axis[k] for h, k in parts], bool),
        seq_axes=_concat([h.seq_axes[k] for h, k in parts], np.int64),
        byte_lengths=_concat([h.byte_lengths[k] for h, k in parts], np.uint64),
        content_hashes=tuple(chain.from_iterable(_pick(h.content_hashes, k) for h, k in parts)),
        chunk_tokens=_concat([h.chunk_tokens[k] for h, k in parts], np.int64),
    )


def merge_rows(parts: Sequence[tuple[TrajectoryColumns, Sequence[int]]]) -> TrajectoryColumns:
    """The columns of these rows of these blocks, in order (blocks read from batches: every unit has a header)."""
    numbers: dict[int, int] = {}
    blocks: list[TrajectoryColumns] = []
    for columns, _ in parts:
        if numbers.setdefault(id(columns), len(blocks)) == len(blocks):
            blocks.append(columns)
    counts = [len(rows) for _, rows in parts]
    which = np.repeat(np.array([numbers[id(columns)] for columns, _ in parts], dtype=np.int64), counts)
    rows = _concat([np.asarray(rows, dtype=np.int64) for _, rows in parts], np.int64)
    return _in_order(blocks, which, rows)


def rows_in_order(located: Sequence[tuple[TrajectoryColumns, int]]) -> TrajectoryColumns:
    """These rows (each a row of a block), in this order, as one block; the order may interleave the blocks."""
    numbers: dict[int, int] = {}
    blocks: list[TrajectoryColumns] = []
    which = np.empty(len(located), dtype=np.int64)
    rows = np.empty(len(located), dtype=np.int64)
    for i, (columns, row) in enumerate(located):
        number = numbers.get(id(columns))
        if number is None:
            number = numbers[id(columns)] = len(blocks)
            blocks.append(columns)
        which[i], rows[i] = number, row
    return _in_order(blocks, which, rows)


def _in_order(blocks: list[TrajectoryColumns], which: np.ndarray, rows: np.ndarray) -> TrajectoryColumns:
    """Row ``rows[i]`` of block ``blocks[which[i]]`` for each i, as one block.

    When the rows are most of their blocks' (small reports merged, a mini-batch's reports), the blocks are
    joined whole, a few numpy calls per column whatever their number, and the rows are taken from the join at
    once: taking each block's rows on its own cost a few dozen numpy calls per block (tens of milliseconds for
    64 small reports, on the report path). Otherwise each block's rows are taken, then put in order."""
    if len(blocks) < 2:
        return _take_rows([(columns, rows) for columns in blocks])
    sizes = [len(columns) for columns in blocks]
    if 2 * len(rows) >= sum(sizes) and all(map(_headers_in_order, blocks)):
        joined = _join_whole(blocks)
        at = np.cumsum([0, *sizes[:-1]])[which] + rows
        return joined if len(at) == len(joined) and bool((at == np.arange(len(at))).all()) \
            else _take_rows([(joined, at)])
    order = np.argsort(which, kind="stable")  # grouped by block, each block's rows in their order
    bounds = np.searchsorted(which[order], np.arange(len(blocks) + 1))
    grouped = _take_rows([(columns, rows[order[bounds[b]:bounds[b + 1]]]) for b, columns in enumerate(blocks)])
    source = np.empty(len(order), dtype=np.int64)
    source[order] = np.arange(len(order), dtype=np.int64)
    return _take_rows([(grouped, source)])


def _headers_in_order(columns: TrajectoryColumns) -> bool:
    """Whether the block's multimodal headers are its references' with one, in order (as every reader makes
    them): the join then numbers them by counting."""
    index = columns.multimodal_header_index
    has = index >= 0
    return bool((index[has] == np.arange(int(has.sum()))).all()) and len(columns.multimodal_headers) == int(has.sum())


def _renumbered(names: list[str], indices: np.ndarray, joined: dict[str, int]) -> np.ndarray:
    numbers = [joined.setdefault(name, len(joined)) for name in names]
    if numbers == list(range(len(names))):
        return indices
    return np.asarray(numbers, dtype=np.int64)[indices] if len(indices) else indices


def _join_whole(blocks: Sequence[TrajectoryColumns]) -> TrajectoryColumns:
    """Whole blocks, one after the other, as one block."""
    field_names: dict[str, int] = {}
    encoders: dict[str, int] = {}
    unit_fields = [_renumbered(b.field_names, b.unit_fields, field_names) for b in blocks]
    multimodal_encoders = [_renumbered(b.encoders, b.multimodal_encoder_indices, encoders) for b in blocks]

    def cat(name: str, dtype) -> np.ndarray:
        return _concat([getattr(b, name) for b in blocks], dtype)

    def offsets(name: str) -> np.ndarray:
        return offsets_of(_concat([np.diff(getattr(b, name)) for b in blocks], np.int64))

    def strings(values: list[Sequence[str]]) -> tuple[str, ...]:
        return tuple(chain.from_iterable(values))

    plain = {spec.column: strings([b.plain[spec.column] for b in blocks]) if spec.dtype == "str"
             else _concat([b.plain[spec.column] for b in blocks], spec.dtype) for spec in TRAJECTORY_COLUMNS}
    values = [v for b in blocks for v in (b.values if b.values is not None else (None,) * len(b))]
    return TrajectoryColumns(
        plain=plain,
        segment_offsets=offsets("segment_offsets"),
        segment_versions=cat("segment_versions", np.uint64),
        segment_tokens=cat("segment_tokens", np.uint64),
        unit_offsets=offsets("unit_offsets"),
        unit_keys=strings([b.unit_keys for b in blocks]),
        unit_fields=_concat(unit_fields, np.int64),
        field_names=list(field_names),
        unit_kinds=cat("unit_kinds", np.int64),
        unit_alignments=cat("unit_alignments", np.int64),
        unit_coverages=cat("unit_coverages", np.int64),
        unit_has_header=cat("unit_has_header", bool),
        unit_headers=_join_headers([b.unit_headers for b in blocks]),
        multimodal_offsets=offsets("multimodal_offsets"),
        multimodal_keys=strings([b.multimodal_keys for b in blocks]),
        multimodal_encoder_indices=_concat(multimodal_encoders, np.int64),
        encoders=list(encoders),
        multimodal_costs=cat("multimodal_costs", np.float64),
        placeholder_starts=cat("placeholder_starts", np.uint64),
        placeholder_ends=cat("placeholder_ends", np.uint64),
        multimodal_kinds=cat("multimodal_kinds", np.int64),
        multimodal_header_index=_header_index(_concat([b.multimodal_header_index >= 0 for b in blocks], bool)),
        multimodal_headers=_join_headers([b.multimodal_headers for b in blocks]),
        scalar_offsets=offsets("scalar_offsets"),
        scalar_names=list(chain.from_iterable(b.scalar_names for b in blocks)),
        scalar_values=cat("scalar_values", np.float64),
        values=tuple(values) if any(v is not None for v in values) else None,
    )


def _join_headers(headers: Sequence[HeaderColumns]) -> HeaderColumns:
    ranks = _concat([h.ranks for h in headers], np.int64)
    hashes = [h.content_hashes for h in headers]
    packed = [h for h in hashes if isinstance(h, PackedHashes)]
    joined_hashes: Sequence[str] = join_packed(packed) if len(packed) == len(hashes) \
        else tuple(chain.from_iterable(hashes))
    return HeaderColumns(
        dtypes=_concat([h.dtypes for h in headers], np.int64),
        ranks=ranks,
        shape_offsets=offsets_of(ranks),
        shape=_concat([h.shape for h in headers], np.uint64),
        has_seq_axis=_concat([h.has_seq_axis for h in headers], bool),
        seq_axes=_concat([h.seq_axes for h in headers], np.int64),
        byte_lengths=_concat([h.byte_lengths for h in headers], np.uint64),
        content_hashes=joined_hashes,
        chunk_tokens=_concat([h.chunk_tokens for h in headers], np.int64),
    )


def _take_rows(parts: Sequence[tuple[TrajectoryColumns, np.ndarray]]) -> TrajectoryColumns:
    """Each part's rows, the parts one after the other, taken block by block."""
    field_names: dict[str, int] = {}
    encoders: dict[str, int] = {}
    gathered = []
    for columns, rows in parts:
        rows = np.asarray(rows, dtype=np.int64)
        fields = np.array([field_names.setdefault(n, len(field_names)) for n in columns.field_names], np.int64)
        coders = np.array([encoders.setdefault(n, len(encoders)) for n in columns.encoders], np.int64)
        refs = gather_index(columns.multimodal_offsets, rows)
        header_index = columns.multimodal_header_index[refs]
        gathered.append((columns, rows, gather_index(columns.segment_offsets, rows),
                         gather_index(columns.unit_offsets, rows), refs, header_index,
                         gather_index(columns.scalar_offsets, rows), fields, coders))

    def cat(name: str, index: int, dtype) -> np.ndarray:
        return _concat([getattr(g[0], name)[g[index]] for g in gathered], dtype)

    def counts(name: str) -> np.ndarray:
        return offsets_of(_concat([np.diff(getattr(g[0], name))[g[1]] for g in gathered], np.int64))

    plain = {}
    for spec in TRAJECTORY_COLUMNS:
        if spec.dtype == "str":
            plain[spec.column] = tuple(chain.from_iterable(_pick(g[0].plain[spec.column], g[1]) for g in gathered))
        else:
            plain[spec.column] = _concat([g[0].plain[spec.column][g[1]] for g in gathered], spec.dtype)
    has_header = _concat([h >= 0 for *_, h, _, _, _ in gathered], bool)
    values = [None if g[0].values is None else g[0].values[i] for g in gathered for i in g[1].tolist()]
    return TrajectoryColumns(
        plain=plain,
        segment_offsets=counts("segment_offsets"),
        segment_versions=cat("segment_versions", 2, np.uint64),
        segment_tokens=cat("segment_tokens", 2, np.uint64),
        unit_offsets=counts("unit_offsets"),
        unit_keys=tuple(chain.from_iterable(_pick(g[0].unit_keys, g[3]) for g in gathered)),
        unit_fields=_concat([g[7][g[0].unit_fields[g[3]]] for g in gathered], np.int64),
        field_names=list(field_names),
        unit_kinds=cat("unit_kinds", 3, np.int64),
        unit_alignments=cat("unit_alignments", 3, np.int64),
        unit_coverages=cat("unit_coverages", 3, np.int64),
        unit_has_header=cat("unit_has_header", 3, bool),
        unit_headers=_merge_headers([(g[0].unit_headers, g[3]) for g in gathered]),
        multimodal_offsets=counts("multimodal_offsets"),
        multimodal_keys=tuple(chain.from_iterable(_pick(g[0].multimodal_keys, g[4]) for g in gathered)),
        multimodal_encoder_indices=_concat([g[8][g[0].multimodal_encoder_indices[g[4]]] for g in gathered],
                                           np.int64),
        encoders=list(encoders),
        multimodal_costs=cat("multimodal_costs", 4, np.float64),
        placeholder_starts=cat("placeholder_starts", 4, np.uint64),
        placeholder_ends=cat("placeholder_ends", 4, np.uint64),
        multimodal_kinds=cat("multimodal_kinds", 4, np.int64),
        multimodal_header_index=_header_index(has_header),
        multimodal_headers=_merge_headers([(g[0].multimodal_headers, g[5][g[5] >= 0]) for g in gathered]),
        scalar_offsets=counts("scalar_offsets"),
        scalar_names=list(chain.from_iterable(_pick(g[0].scalar_names, g[6]) for g in gathered)),
        scalar_values=cat("scalar_values", 6, np.float64),
        values=tuple(values) if any(v is not None for v in values) else None,
    )
