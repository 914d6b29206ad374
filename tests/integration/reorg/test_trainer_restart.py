"""A trainer rank killed with SIGKILL in the middle of a mini-batch and restarted gets that mini-batch again from
its first micro-batch, never the rest of it alone, and no optimizer step uses a partial mini-batch (DESIGN.md
§9, docs/failures.md). Real processes: ``knittrans admission serve`` on port 0, one ``knittrans reorg serve``
sidecar on a file store and trainer ranks running ``trainer_worker.py`` (a real :class:`TrainerClient`).

The oracle is outside the code under test: what the rollout wrote (trajectory ids and field CRCs) against what
each rank's steps held, micro-batch by micro-batch, and the mini-batch's admitted trajectories.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .processes import start_trainer
from .restart_stack import MINIBATCHES, SLOTS, Stack, check_whole_steps, finish, lines, start_stack, wait_for


@pytest.fixture
def stack_tp1(tmp_path) -> Iterator[Stack]:
    stack = start_stack(tmp_path, tp=1)
    yield stack
    stack.sidecar.stop()
    stack.admission.stop()


@pytest.fixture
def stack_tp2(tmp_path) -> Iterator[Stack]:
    stack = start_stack(tmp_path, tp=2)
    yield stack
    stack.sidecar.stop()
    stack.admission.stop()


def test_a_rank_killed_mid_minibatch_gets_it_again_from_its_first_microbatch(stack_tp1: Stack) -> None:
    stack = stack_tp1
    progress = stack.directory / "rank0.progress"
    first, _ = start_trainer(stack.directory, socket=stack.socket, tp_rank=0, global_rank=0, admission=stack.address,
                             minibatches=MINIBATCHES, name="rank0-run1",
                             extra=("--progress", str(progress), "--hold-at", "1"))
    wait_for("rank 0 to hold micro-batch 1", lambda: any(x["event"] == "holding" for x in lines(progress)), [first])
    # Micro-batch 0 was released: its slot went to the next micro-batch (the ring had filled its 3 slots).
    wait_for("micro-batch 0's release", lambda: stack.status().published > SLOTS, [first])
    held = next(x for x in lines(progress) if x["event"] == "holding")
    first.kill()

    second, output = start_trainer(stack.directory, socket=stack.socket, tp_rank=0, global_rank=0,
                                   admission=stack.address, minibatches=MINIBATCHES, name="rank0-run2",
                                   extra=("--record-admitted",))
    result = finish(second, output)
    assert "error" not in result, result
    steps = result["minibatches"]
    assert [s["sequence"] for s in steps] == [held["sequence"], held["sequence"] + 1]
    check_whole_steps(stack, result)
    assert stack.sidecar.alive(), stack.sidecar.tail()


def test_the_live_tp_rank_restarts_the_minibatch_with_the_killed_one(stack_tp2: Stack) -> None:
    stack = stack_tp2
    live_progress, doomed_progress = stack.directory / "tp0.progress", stack.directory / "tp1.progress"
    live, live_output = start_trainer(
        stack.directory, socket=stack.socket, tp_rank=0, global_rank=0, admission=stack.address,
        minibatches=MINIBATCHES, name="tp0", extra=("--progress", str(live_progress), "--hold-at", "1",
                                                    "--hold-until-restart", "--record-admitted"))
    doomed, _ = start_trainer(stack.directory, socket=stack.socket, tp_rank=1, global_rank=1,
                              admission=stack.address, minibatches=MINIBATCHES, name="tp1-run1",
                              extra=("--progress", str(doomed_progress), "--hold-at", "1"))
    for progress, process in ((live_progress, live), (doomed_progress, doomed)):
        wait_for(f"{process.name} to hold micro-batch 1",
                 lambda p=progress: any(x["event"] == "holding" for x in lines(p)), [live, doomed])
    wait_for("micro-batch 0's release by both ranks", lambda: stack.status().published > SLOTS, [live, doomed])
    doomed.kill()

    restarted, restarted_output = start_trainer(stack.directory, socket=stack.socket, tp_rank=1, global_rank=1,
                                                admission=stack.address, minibatches=MINIBATCHES, name="tp1-run2",
                                                extra=("--record-admitted",))
    live_result, restarted_result = finish(live, live_output), finish(restarted, restarted_output)
    for result in (live_result, restarted_result):
        assert "error" not in result, result
        assert [s["sequence"] for s in result["minibatches"]] == [1, 2]
        check_whole_steps(stack, result)
    # The live rank learnt that the mini-batch it was in restarted, and dropped its part of it.
    assert live_result["restarted"] == [{"sequence": 1, "yielded": 2}]
    assert stack.status().delivery_round == 1
