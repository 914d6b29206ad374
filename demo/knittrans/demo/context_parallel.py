"""Context-parallel attention for the demo backbone: all-gather keys and values across the CP group.

Under context parallelism a CP rank holds, for every packed sequence of a micro-batch, its two zigzag chunks
(chunk r, then chunk 2cp−1−r; see :mod:`knittrans.packed.layout`). Queries stay local. Keys and values of
every CP rank are gathered (the simplest correct form, not ring attention), and the mask is built from what
the tokens are in the *whole* sequence:

- a query attends to a key of the same sequence (item index in the packed micro-batch, the same on every CP
  rank because all CP ranks pack the micro-batch's items in plan order),
- whose global position (``position_ids``, padded coordinates) is not larger.

Padding needs no special case: the padding of a sequence sits after its real tokens in global positions, so
no real token attends to it, and every token attends at least to itself. Tokens after the last sequence
(the packed stream's trailing padding) form a sequence of their own per CP rank.

The gather is an autograd function: its backward sums the gradients that every CP rank computed for the
gathered rows (an all-reduce; gloo has no reduce-scatter) and keeps this rank's rows. Collectives run in
the forward and backward of every micro-batch, so all CP ranks of a DP rank must run the same micro-batches
in the same order, which the planner guarantees (CP ranks share the DP rank's micro-batch list).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from knittrans.errors import InvalidArgument


def segment_ids_from_cu_seqlens(cu_seqlens: torch.Tensor, num_tokens: int, *, trailing_id: int) -> torch.Tensor:
    """Per packed token: the index of its sequence (``cu_seqlens[k] <= t < cu_seqlens[k+1]``), or
    ``trailing_id`` after the last sequence."""
    bounds = cu_seqlens.to(torch.int64)
    if bounds.dim() != 1 or bounds.numel() < 1:
        raise InvalidArgument("must be 1-D with at least one entry", field="cu_seqlens")
    tokens = torch.arange(num_tokens, dtype=torch.int64, device=bounds.device)
    ids = torch.searchsorted(bounds[1:].contiguous(), tokens, right=True)
    return torch.where(tokens >= bounds[-1], torch.full_like(ids, trailing_id), ids)


class _GatherRows(torch.autograd.Function):
    """All-gather along dim 0 across a process group; rows may differ in count between ranks."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, group: dist.ProcessGroup | None, counts: tuple[int, ...], rank: int):
        ctx.group, ctx.counts, ctx.rank = group, counts, rank
        longest = max(max(counts), 1)
        padded = rows.new_zeros((longest, *rows.shape[1:]))
        padded[: rows.shape[0]] = rows
        parts = [torch.empty_like(padded) for _ in counts]
        dist.all_gather(parts, padded, group=group)
        return torch.cat([part[:count] for part, count in zip(parts, counts, strict=True)])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # Every rank computed gradients for all gathered rows; this rank's rows get the sum over ranks.
        total = grad.contiguous().clone()
        dist.all_reduce(total, group=ctx.group)
        start = sum(ctx.counts[: ctx.rank])
        return total[start : start + ctx.counts[ctx.rank]], None, None, None


def _all_gather_rows(rows: torch.Tensor, group: dist.ProcessGroup | None, counts: tuple[int, ...]) -> torch.Tensor:
    """The same gather without autograd (for positions and sequence ids)."""
    with torch.no_grad():
        return _GatherRows.apply(rows, group, counts, dist.get_rank(group))


@dataclass(frozen=True, kw_only=True, eq=False)
class AttentionLayout:
    """How one micro-batch's local queries see the keys: ``mask`` (1, 1, local tokens, keys), True = attend;
    ``gather`` maps this rank's key/value rows to the rows of every CP rank (None without CP)."""

    mask: torch.Tensor
    gather: Callable[[torch.Tensor], torch.Tensor] | None = None
    key_positions: torch.Tensor | None = None
    key_sequences: torch.Tensor | None = None


def causal_mask(
    query_positions: torch.Tensor,
    query_sequences: torch.Tensor,
    key_positions: torch.Tensor,
    key_sequences: torch.Tensor,
) -> torch.Tensor:
    """(1, 1, queries, keys): same sequence, and the key's global position is not after the query's."""
    same = query_sequences[:, None] == key_sequences[None, :]
    causal = key_positions[None, :] <= query_positions[:, None]
    return (same & causal)[None, None]


def local_attention(position_ids: torch.Tensor, cu_seqlens: torch.Tensor) -> AttentionLayout:
    """Attention of one packed micro-batch that one rank holds whole (cp = 1)."""
    position_ids = position_ids.to(torch.int64)
    sequences = segment_ids_from_cu_seqlens(cu_seqlens, position_ids.numel(), trailing_id=cu_seqlens.numel() - 1)
    return AttentionLayout(mask=causal_mask(position_ids, sequences, position_ids, sequences))


def context_parallel_attention(
    position_ids: torch.Tensor, cu_seqlens: torch.Tensor, group: dist.ProcessGroup | None
) -> AttentionLayout:
    """Attention of this CP rank's part of a micro-batch; a collective: every rank of ``group`` calls it for
    the same micro-batch. ``position_ids`` are global (padded) positions, ``cu_seqlens`` local boundaries."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    position_ids = position_ids.to(torch.int64)
    items = cu_seqlens.numel() - 1
    # The stream's trailing padding of each CP rank is a sequence of its own, distinct from every item.
    sequences = segment_ids_from_cu_seqlens(cu_seqlens, position_ids.numel(), trailing_id=items + rank)

    local = torch.tensor([position_ids.numel(), items], dtype=torch.int64)
    shapes = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(shapes, local, group=group)
    counts = tuple(int(s[0]) for s in shapes)
    if any(int(s[1]) != items for s in shapes):
        raise InvalidArgument(
            f"CP ranks pack different numbers of sequences: {[int(s[1]) for s in shapes]}", field="cu_seqlens"
        )
    key_positions = _all_gather_rows(position_ids, group, counts)
    key_sequences = _all_gather_rows(sequences, group, counts)

    def gather(rows: torch.Tensor) -> torch.Tensor:
        if rows.shape[0] != counts[rank]:
            raise InvalidArgument(f"has {rows.shape[0]} rows, the layout {counts[rank]}", field="rows")
        return _GatherRows.apply(rows, group, counts, rank)

    return AttentionLayout(
        mask=causal_mask(position_ids, sequences, key_positions, key_sequences),
        gather=gather,
        key_positions=key_positions,
        key_sequences=key_sequences,
    )
