"""The arithmetic of a backbone sequence's layout: padding, zigzag CP chunks and the token ranges a CP rank reads.

A sequence of N real tokens is padded to P (a multiple of the pad multiple, itself a multiple of 2·cp) and cut
into 2·cp chunks of P/(2·cp) tokens; CP rank r holds chunks r and 2cp−1−r, which balances causal-attention work.
Everything here is plain arithmetic on integers or numpy arrays: no plan object, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


def padded_lengths(num_tokens: np.ndarray, pad_multiple: int) -> np.ndarray:
    """Each length rounded up to a multiple of ``pad_multiple``."""
    lengths = np.asarray(num_tokens, dtype=np.int64)
    return -(-lengths // pad_multiple) * pad_multiple


def zigzag_chunks(cp: int, cp_rank: int) -> tuple[int, int]:
    """The two chunk indices CP rank ``cp_rank`` holds: ``r`` and ``2cp−1−r``, which balances causal work."""
    return cp_rank, 2 * cp - 1 - cp_rank


def zigzag_spans(num_tokens: np.ndarray, padded_tokens: np.ndarray, cp: int) -> np.ndarray:
    """The real tokens of every zigzag chunk: an int64 array ``[trajectory, cp rank, chunk 0|1, start|end]``.

    A padded sequence of P tokens is cut into 2·cp chunks of P/(2·cp); ranges are clipped at the real length,
    so a chunk that is all padding has ``start == end == num_tokens``.
    """
    lengths = np.asarray(num_tokens, dtype=np.int64)[:, None, None]
    chunk = (np.asarray(padded_tokens, dtype=np.int64) // (2 * cp))[:, None, None]
    ranks = np.arange(cp, dtype=np.int64)
    chunk_ids = np.stack([ranks, 2 * cp - 1 - ranks], axis=1)[None]  # [1, cp, 2]
    starts = chunk * chunk_ids
    return np.stack([np.minimum(starts, lengths), np.minimum(starts + chunk, lengths)], axis=-1)


def chunk_padded_spans(padded_tokens: int, cp: int, cp_rank: int) -> tuple[tuple[int, int, int], ...]:
    """``(chunk, start, end)`` in padded coordinates (position ids) of CP rank ``cp_rank``'s two chunks."""
    size = padded_tokens // (2 * cp)
    return tuple((c, c * size, (c + 1) * size) for c in zigzag_chunks(cp, cp_rank))


def merge_spans(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, non-empty spans with overlapping or touching ones merged."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def cp_read_spans(chunk_spans: Sequence[Sequence[int]], num_tokens: int, look_ahead: bool) -> list[tuple[int, int]]:
    """The token ranges of a per-token field a CP rank reads, given the real tokens of its chunks.

    With ``look_ahead`` each non-empty chunk also takes the token after its end, when that token exists: labels
    are the next token, so a label field (or a token-aligned field, packed shifted by one) needs it.
    """
    extra = 1 if look_ahead else 0
    return merge_spans([(int(s), min(int(e) + extra, num_tokens)) for s, e in chunk_spans if e > s])


def covered_spans(spans: Sequence[tuple[int, int]], first_token: int) -> list[tuple[int, int]]:
    """The parts of token ``spans`` a field whose rows start at token ``first_token`` holds: a response-only field
    (rows from ``response_start`` on) is read there only, so no byte is read for the prompt."""
    if not first_token:
        return list(spans)
    return [(max(start, first_token), end) for start, end in spans if end > max(start, first_token)]


def clip_to_chunks(chunk_spans: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Placeholder ranges ``[starts, ends)`` (one per reference) cut by the real tokens of zigzag chunks
    (``chunk_spans[reference, ..., start|end]``, any chunk axes): ``(starts, ends)`` of shape ``chunk_spans[..., 0]``,
    where ``ends > starts`` marks the chunks that hold placeholder positions of the reference. The planner's route
    and a CP rank's encoding uses are both cut here."""
    extra = (1,) * (chunk_spans.ndim - 2)
    clipped_starts = np.maximum(chunk_spans[..., 0], starts.reshape(-1, *extra))
    clipped_ends = np.minimum(chunk_spans[..., 1], ends.reshape(-1, *extra))
    return clipped_starts, clipped_ends


def segment_sums(offsets: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Sum of ``values`` over each CSR segment, exact for integers and correct for empty segments."""
    totals = np.concatenate([np.zeros(1, dtype=values.dtype), np.cumsum(values)])
    sums: np.ndarray = totals[offsets[1:]] - totals[offsets[:-1]]
    return sums
