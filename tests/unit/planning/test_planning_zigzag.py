"""Zigzag CP splitting: exact tiling, look-ahead for labels, whole non-sequence fields, causal-work balance."""

from __future__ import annotations

import numpy as np
import pytest
from planning_data import image, topology, trajectory

from knittrans.admission.planning import plan_minibatch
from knittrans.plan import padded_lengths, zigzag_chunks, zigzag_spans
from knittrans.types import ByteRange, ConsumerId, EncoderTopology, TokenSpan


def causal_work(start: int, end: int) -> int:
    """Attention work of query tokens [start, end) under a causal mask: token i attends to i + 1 keys."""
    return sum(range(start + 1, end + 1))


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_zigzag_balances_causal_attention_better_than_contiguous_halves(cp: int) -> None:
    length = 2 * cp * 1000
    spans = zigzag_spans(np.array([length]), np.array([length]), cp)[0]
    zigzag = [sum(causal_work(int(s), int(e)) for s, e in spans[r]) for r in range(cp)]
    block = length // cp
    contiguous = [causal_work(r * block, (r + 1) * block) for r in range(cp)]
    assert sum(zigzag) == sum(contiguous) == causal_work(0, length)
    zigzag_ratio = max(zigzag) / min(zigzag)
    contiguous_ratio = max(contiguous) / min(contiguous)
    assert zigzag_ratio == 1.0  # chunks r and 2cp-1-r always sum to the same work
    assert contiguous_ratio > 2 * cp - 2


def test_zigzag_chunks_pair_rank_r_with_its_mirror() -> None:
    assert [zigzag_chunks(4, r) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]


@pytest.mark.parametrize("length", [1, 5, 7, 8, 9, 23, 100])
@pytest.mark.parametrize("cp", [1, 2, 3])
def test_spans_tile_the_sequence_and_clip_padding(length: int, cp: int) -> None:
    padded = int(padded_lengths(np.array([length]), 2 * cp)[0])
    assert padded % (2 * cp) == 0 and 0 <= padded - length < 2 * cp
    spans = zigzag_spans(np.array([length]), np.array([padded]), cp)[0].reshape(-1, 2)
    covered = np.zeros(length, dtype=int)
    for start, end in spans:
        covered[start:end] += 1
    assert covered.tolist() == [1] * length


def test_label_fields_read_one_token_of_look_ahead_clipped_at_the_end() -> None:
    # 10 tokens, cp=2: padded to 12, chunks of 3: [0,3) [3,6) [6,9) [9,10)+pad; rank 0: chunks 0 and 3.
    plan = plan_minibatch([trajectory("t", 10)], topology(dp=1, cp=2, budget=100))
    rank0 = plan.for_consumer(ConsumerId(role="backbone", dp_rank=0, cp_rank=0)).microbatches[0].items[0]
    rank1 = plan.for_consumer(ConsumerId(role="backbone", dp_rank=0, cp_rank=1)).microbatches[0].items[0]
    assert [(c.chunk, c.padded, c.tokens) for c in rank0.chunks] == [
        (0, TokenSpan(start=0, end=3), TokenSpan(start=0, end=3)),
        (3, TokenSpan(start=9, end=12), TokenSpan(start=9, end=10)),
    ]
    reads0 = {r.unit.field_name: r for r in rank0.reads}
    reads1 = {r.unit.field_name: r for r in rank1.reads}
    # input_ids is the label field: one token past each chunk, but never past the sequence end.
    assert reads0["input_ids"].spans == (TokenSpan(start=0, end=4), TokenSpan(start=9, end=10))
    assert reads1["input_ids"].spans == (TokenSpan(start=3, end=10),)
    assert reads0["input_ids"].byte_ranges == (ByteRange(offset=0, length=16), ByteRange(offset=36, length=4))
    # Other per-token fields: exactly the chunks (rank 1's two chunks are adjacent, so one read).
    assert reads0["routing"].spans == (TokenSpan(start=0, end=3), TokenSpan(start=9, end=10))
    assert reads1["routing"].spans == (TokenSpan(start=3, end=9),)
    assert reads1["routing"].byte_ranges == (ByteRange(offset=12, length=24),)
    # Non-sequence fields go whole to every CP rank.
    assert reads0["advantage"].byte_ranges == reads1["advantage"].byte_ranges == (ByteRange(offset=0, length=8),)
    assert rank0.local_tokens == rank1.local_tokens == 6


def test_sequence_parallelism_pads_to_2_cp_tp() -> None:
    plan = plan_minibatch([trajectory("t", 17)], topology(dp=1, cp=2, tp=3, budget=100, sequence_parallel=True))
    assert int(plan.backbone.padded_tokens[0]) == 24
    assert plan.quality.padding_tokens == 7


def test_placeholder_cut_by_a_cp_boundary_goes_to_both_ranks() -> None:
    # 16 tokens, cp=2: chunks [0,4) [4,8) [8,12) [12,16); the image fills [2, 10).
    meta = trajectory("t", 16, multimodal=(image("s/img", 2, 8),))
    plan = plan_minibatch([meta], topology(dp=1, cp=2, tp=2, budget=100, encoders=_vision()))
    routes = plan.routes(0)
    by_rank = sorted((r.consumer.cp_rank, r.tp_rank, r.positions.start, r.positions.end, r.row_start) for r in routes)
    assert by_rank == sorted(
        [
            (0, 0, 2, 4, 0),
            (0, 1, 2, 4, 0),
            (1, 0, 4, 8, 2),
            (1, 1, 4, 8, 2),
            (1, 0, 8, 10, 6),
            (1, 1, 8, 10, 6),
        ]
    )
    uses = plan.for_consumer(ConsumerId(role="backbone", dp_rank=0, cp_rank=1)).microbatches[0].items[0].encodings
    assert [(u.positions, u.row_start) for u in uses] == [
        (TokenSpan(start=4, end=8), 2),
        (TokenSpan(start=8, end=10), 6),
    ]


def _vision() -> tuple[EncoderTopology, ...]:
    return (EncoderTopology(name="vision", dp=1, max_cost_per_microbatch=1000.0),)
