"""A trainer job restored from a checkpoint gets the mini-batches after the checkpoint's step again: the same
trajectories, in the same order, with the same bytes (DESIGN.md §9, docs/failures.md). Real processes: the
admission service with ``retain_until_checkpoint``, a sidecar on a file store and ``trainer_worker.py`` ranks.

Run 1 trains, reports a checkpoint after step (train batch 0, mini-batch 1), trains on, and is killed with
SIGKILL in the middle of a later mini-batch. Run 2 restores step (0, 1). The oracle is run 1's own record of
what it received (per micro-batch: trajectory ids and a CRC of every field of every item) and what the rollout
wrote.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import grpc
import pytest

from knittrans.client.admission import AdmissionClient
from knittrans.v1 import reorg_service_pb2, reorg_service_pb2_grpc

from .processes import start_trainer
from .restart_stack import Stack, check_whole_steps, finish, lines, start_stack, wait_for

PER_BATCH = 2  # mini-batches per train batch, of 2 trajectories (2 micro-batches) each
MINIBATCHES = 6


@pytest.fixture
def stack(tmp_path) -> Iterator[Stack]:
    stack = start_stack(tmp_path, tp=1, num_minibatches=PER_BATCH, train_batch_size=4, minibatches=MINIBATCHES,
                        admission_config={"retain_until_checkpoint": True})
    yield stack
    stack.sidecar.stop()
    stack.admission.stop()


def run_then_kill_holding(stack: Stack, *, hold_sequence: int, released: int, extra: tuple[str, ...] = ()
                          ) -> dict[int, list[dict]]:
    """Run 1: train until micro-batch 0 of mini-batch ``hold_sequence``, check that the admission service released
    ``released`` mini-batches by then, and kill it (SIGKILL). Returns what it received, per sequence."""
    progress = stack.directory / "run1.progress"
    first, _ = start_trainer(stack.directory, socket=stack.socket, tp_rank=0, global_rank=0, admission=stack.address,
                             minibatches=MINIBATCHES, name="run1",
                             extra=("--progress", str(progress), *extra, "--hold-at", "0",
                                    "--hold-sequence", str(hold_sequence)))
    wait_for(f"run 1 to hold mini-batch {hold_sequence}",
             lambda: any(x["event"] == "holding" for x in lines(progress)), [first])
    with AdmissionClient(stack.address, deadline=timedelta(seconds=10)) as admission:
        assert admission.status().released_minibatches == released
    first.kill()
    seen: dict[int, list[dict]] = {}
    for line in lines(progress):
        if line["event"] == "micro":
            seen.setdefault(line["sequence"], []).append(line["micro"])
    assert sorted(seen) == list(range(1, hold_sequence + 1)) and len(seen[hold_sequence]) == 1
    return seen


def test_a_job_restored_from_a_checkpoint_gets_the_same_minibatches_after_it_byte_for_byte(stack: Stack) -> None:
    # Mini-batches 3 and 4 are stepped on after the checkpoint: retained; 1 and 2 are covered: released.
    seen = run_then_kill_holding(stack, hold_sequence=5, released=2, extra=("--checkpoint-at", "2"))

    second, output = start_trainer(stack.directory, socket=stack.socket, tp_rank=0, global_rank=0,
                                   admission=stack.address, minibatches=4, name="run2",
                                   extra=("--restored-step", "0:1", "--record-admitted"))
    result = finish(second, output)
    assert "error" not in result, result
    steps = result["minibatches"]
    assert [s["sequence"] for s in steps] == [3, 4, 5, 6]
    assert [tuple(s["step"][:2]) for s in steps] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    check_whole_steps(stack, result, trajectories=2, min_microbatches=2)
    for step in steps:
        if step["sequence"] in (3, 4):
            assert step["microbatches"] == seen[step["sequence"]], step["sequence"]  # byte for byte, in order
    assert steps[2]["microbatches"][:1] == seen[5]
    assert stack.sidecar.alive(), stack.sidecar.tail()


def test_a_job_restarted_before_its_first_checkpoint_gets_every_minibatch_again_from_the_first(stack: Stack) -> None:
    """Run 1 steps on mini-batches 1 and 2 without ever reporting a checkpoint, and is killed holding mini-batch
    3. Without a restore point a new process would get mini-batch 3 again (it was partway) but never 1 and 2,
    which it took to the last micro-batch: a job that restarts from its initial weights would silently skip them.
    With ``BEFORE_FIRST_STEP`` it gets all of them again, byte for byte."""
    seen = run_then_kill_holding(stack, hold_sequence=3, released=0)  # no checkpoint covers a step: all retained

    second, output = start_trainer(stack.directory, socket=stack.socket, tp_rank=0, global_rank=0,
                                   admission=stack.address, minibatches=4, name="run2",
                                   extra=("--restored-step", "before-first", "--record-admitted"))
    result = finish(second, output)
    assert "error" not in result, result
    steps = result["minibatches"]
    assert [s["sequence"] for s in steps] == [1, 2, 3, 4]
    check_whole_steps(stack, result, trajectories=2, min_microbatches=2)
    for step in steps[:2]:
        assert step["microbatches"] == seen[step["sequence"]], step["sequence"]  # byte for byte, in order
    assert steps[2]["microbatches"][:1] == seen[3]
    assert stack.sidecar.alive(), stack.sidecar.tail()


def test_a_restore_point_before_the_first_step_with_a_step_in_it_is_refused_naming_the_field(stack: Stack) -> None:
    request = reorg_service_pb2.NextMicroBatchRequest(
        tp_rank=0, session="s", restored_step=reorg_service_pb2.RestoredStep(before_first_step=True, minibatch_index=1))
    with grpc.insecure_channel(stack.socket) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            reorg_service_pb2_grpc.ReorgServiceStub(channel).NextMicroBatch(request, timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "restored_step.before_first_step" in refused.value.details()
    assert stack.sidecar.alive(), stack.sidecar.tail()
    assert stack.status().delivery_round == 0  # nothing was restored
