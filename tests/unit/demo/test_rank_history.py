"""What a chaos-run rank restores (knittrans.demo.chaos.checkpoint.RankHistory): its first start restores
nothing, a restart before any checkpoint restores to before the first step (so its sidecars deliver every
mini-batch again), and a restart after one restores that checkpoint's step and weights."""

from __future__ import annotations

import torch

from knittrans.demo.chaos.checkpoint import RankHistory
from knittrans.steps import BEFORE_FIRST_STEP, StepId

SEQUENCE = 3
STEP = StepId(train_batch_index=1, minibatch_index=0, train_version=1)


def _model_and_optimizer(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_first_start_then_restart_without_a_checkpoint_then_restart_after_one(tmp_path) -> None:
    model, optimizer = _model_and_optimizer(0)
    first = RankHistory(tmp_path, rank=0)
    assert first.restore(model, optimizer, distributed=False) == (None, None, 0)
    first.close()

    second = RankHistory(tmp_path, rank=0)
    assert second.restore(model, optimizer, distributed=False) == (None, BEFORE_FIRST_STEP, 0)
    saved = {name: value.clone() for name, value in model.state_dict().items()}
    second.save(model, optimizer, sequence=SEQUENCE, step=STEP, applied=2)
    second.close()

    other, other_optimizer = _model_and_optimizer(1)
    third = RankHistory(tmp_path, rank=0)
    assert third.restore(other, other_optimizer, distributed=False) == (SEQUENCE, STEP, 2)
    third.close()
    assert all(torch.equal(other.state_dict()[name], value) for name, value in saved.items())
    events = [line for line in (tmp_path / "applied-rank0.jsonl").read_text().splitlines() if line]
    assert len(events) == 3  # one restore event per start


def test_another_ranks_log_does_not_make_a_first_start_a_restart(tmp_path) -> None:
    model, optimizer = _model_and_optimizer(0)
    other_rank = RankHistory(tmp_path, rank=1)
    other_rank.restore(model, optimizer, distributed=False)
    other_rank.close()
    assert (tmp_path / "applied-rank1.jsonl").read_text()  # rank 1's log holds its restore before rank 0 starts
    this_rank = RankHistory(tmp_path, rank=0)
    assert this_rank.restore(model, optimizer, distributed=False) == (None, None, 0)
    this_rank.close()
