"""StepId.sequence numbers mini-batches as the admission service does: from 1, train batch after train batch."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from knittrans.errors import InvalidArgument
from knittrans.steps import StepId


@given(st.integers(1, 8), st.integers(0, 20))
def test_sequences_count_every_minibatch_once_from_one(num_minibatches: int, train_batches: int) -> None:
    steps = sorted(StepId(train_batch_index=t, minibatch_index=m)
                   for m in range(num_minibatches) for t in range(train_batches))
    assert [s.sequence(num_minibatches) for s in steps] == list(range(1, len(steps) + 1))


def test_a_minibatch_index_outside_the_train_batch_is_refused_naming_it() -> None:
    with pytest.raises(InvalidArgument) as refused:
        StepId(train_batch_index=0, minibatch_index=2).sequence(2)
    assert refused.value.field == "minibatch_index"
