"""The slots the training loop let go of are freed on the release thread's tick (``release_interval_seconds``),
or at once when the loop starts waiting for data (a slot held back may be what the sidecar needs), or when the
client closes; the slot of a micro-batch the loop had to wait for is freed at once. Observed from the sidecar's
side: a real sidecar on a Unix socket, its status counting what it published and what is still occupied. The
tick is set far longer than the test runs, so only the early frees can let it pass. While the loop waits for
data, the release thread does not tick at all: observed as the thread's context switches in /proc."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest

from knittrans.admission.planning import plan_minibatch
from knittrans.errors import InvalidArgument
from knittrans.reorg.assignments import Admission, PlannedAssignmentSource
from knittrans.reorg.endpoint import RunningReorg, start_reorg
from knittrans.reorg.settings import ReorgSettings, RingSettings
from knittrans.rollout import RolloutClient
from knittrans.serving.settings import MetricsSettings, ServerSettings
from knittrans.store.file import FileUnitStore
from knittrans.trainer import TrainerClient, TrainerSettings
from knittrans.types import BackboneTopology, ConsumerId, Topology, VersionSegment
from tests.loop_thread import LoopThread

from .single_sidecar_job import wait_for

TOPOLOGY = Topology(backbone=BackboneTopology(dp=1, cp=1, tp=1, max_tokens_per_microbatch=100))
LENGTHS = (90, 70, 100, 60, 80, 95)  # no two fit one micro-batch: one micro-batch each
LONGER_THAN_THE_TEST = 600.0
T = TypeVar("T")


class VerdictOnRequest(PlannedAssignmentSource):
    """Gives no verdict until the test sets ``given``: the loop waits for data for as long as the test likes."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.given = asyncio.Event()

    async def wait_verdict(self, sequence: int):
        await self.given.wait()
        return await super().wait_verdict(sequence)


@pytest.fixture
def sidecar(tmp_path) -> Iterator[RunningReorg]:
    loop = LoopThread()
    running, _ = start_sidecar(tmp_path, loop, PlannedAssignmentSource)
    yield running
    loop.run(running.stop(grace=0))
    loop.close()


def start_sidecar(tmp_path, loop: LoopThread, source_type: type[PlannedAssignmentSource]
                  ) -> tuple[RunningReorg, PlannedAssignmentSource]:
    job = f"rel{uuid.uuid4().hex[:8]}"
    root = tmp_path / "units"
    rollout = RolloutClient(FileUnitStore(root), namespace=job)
    rng = np.random.default_rng(11)
    metas = [rollout.submit({"input_ids": rng.integers(1, 1000, length, dtype=np.int32)},
                            trajectory_id=f"t{i}", sample_id=f"s{i}", source="A", rollout_step=0,
                            segments=(VersionSegment(version=0, num_tokens=length),), loss_mask_field=None)
             for i, length in enumerate(LENGTHS)]
    plan = plan_minibatch(metas, TOPOLOGY)
    assert plan.microbatches_per_rank == len(LENGTHS)
    consumer = ConsumerId(role="backbone", dp_rank=0)
    settings = ReorgSettings(job=job, role=consumer.role, dp_rank=0, cp_rank=0, store=f"file://{root}",
                             ring=RingSettings(slots=2), server=ServerSettings(metrics=MetricsSettings(port=-1)))
    source = source_type(consumer, [(Admission(minibatch_index=0, num_minibatches=1), plan)], job=job)
    return loop.run(start_reorg(settings, source=source, store=FileUnitStore(root))), source


def client_for(sidecar: RunningReorg, interval: float) -> TrainerClient:
    return TrainerClient(TrainerSettings(sidecar=sidecar.address, device="cpu", prefetch=1, poll_seconds=1.0,
                                         release_interval_seconds=interval, report_progress=False))


def wait_staged(client: TrainerClient, what: str) -> None:
    """Until the client's prefetch thread has staged the next micro-batch, so that taking it is not a wait for
    data (the slot of one the loop waited for is freed at once). Nothing public says so: the test looks at the
    prefetch queue, rather than sleeping for a time a slow machine might not keep."""
    wait_for(lambda: client._prefetcher._queue.qsize() >= 1, what)


def when_staged(client: TrainerClient, take: Callable[[], T]) -> T:
    """``take()``, once both ring slots are published and the next micro-batch is staged."""
    wait_for(lambda: client.status().published == 2, "both ring slots published")
    wait_staged(client, "micro-batch 0 staged")
    return take()


def test_slots_let_go_of_are_held_back_until_the_loop_waits_for_data(sidecar) -> None:
    client = client_for(sidecar, LONGER_THAN_THE_TEST)
    try:
        mini = when_staged(client, lambda: next(client.mini_batches()))
        micro_batches = iter(mini)
        first = next(micro_batches)
        assert (first.index, first.waited_seconds) == (0, 0.0), "precondition: micro-batch 0 was staged"
        # micro-batch 1 goes into the prefetch queue that taking micro-batch 0 made room in
        wait_staged(client, "micro-batch 1 staged")
        second = next(micro_batches)  # lets go of micro-batch 0
        assert (second.index, second.waited_seconds) == (1, 0.0), "precondition: micro-batch 1 was staged"
        time.sleep(0.5)
        status = client.status()
        assert (status.published, status.slots_occupied) == (2, 2)  # micro-batch 0's slot is held back

        taken: list = []
        consumer = threading.Thread(target=lambda: taken.append(next(micro_batches)), daemon=True)
        consumer.start()  # micro-batch 2 needs the slot held back: the loop waits, which frees it
        consumer.join(timeout=60)
        assert [m.index for m in taken] == [2] and taken[0].waited_seconds > 0

        wait_for(lambda: client.status().published == 4, "micro-batch 3 in micro-batch 1's slot")
        wait_staged(client, "micro-batch 3 staged")
        assert next(micro_batches).index == 3  # lets go of micro-batch 2, which the loop waited for: freed at once
        wait_for(lambda: client.status().published == 5, "micro-batch 4 in micro-batch 2's slot, no wait needed")

        rest = threading.Thread(target=lambda: taken.extend(micro_batches), daemon=True)
        rest.start()
        rest.join(timeout=60)
        assert [m.index for m in taken] == [2, *range(4, len(LENGTHS))]
        assert client.status().published == len(LENGTHS)
    finally:
        client.close()  # frees what is still held back
    wait_for(lambda: sidecar.sidecar.ring.occupied == 0, "an empty ring after the client closed")


def test_without_a_tick_the_slot_is_freed_while_the_loop_computes(sidecar) -> None:
    with client_for(sidecar, 0.0) as client:
        micro_batches = iter(when_staged(client, lambda: next(client.mini_batches())))
        assert next(micro_batches).index == 0
        wait_staged(client, "micro-batch 1 staged")
        second = next(micro_batches)
        assert (second.index, second.waited_seconds) == (1, 0.0), "precondition: micro-batch 1 was staged"
        wait_for(lambda: client.status().published == 3, "micro-batch 2 in micro-batch 0's slot")


def test_the_training_loop_keeps_nothing_of_micro_batch_0_once_it_moved_past_it(sidecar) -> None:
    # The loop holds the mini-batch for the whole step. Whatever still held micro-batch 0 along with it would free
    # it on the loop's thread when the next mini-batch replaces it, instead of on the release thread after the
    # release RPC, as every other micro-batch is (0.1 to 0.2 ms per step for 4 ranks, measured).
    with client_for(sidecar, 0.0) as client:
        mini_batches = client.mini_batches()  # held, as a training loop's for statement holds it
        mini = when_staged(client, lambda: next(mini_batches))
        micro_batches = iter(mini)
        micro = next(micro_batches)
        assert micro.index == 0
        freed = threading.Event()
        weakref.finalize(micro["input_ids"], freed.set)
        micro = next(micro_batches)  # lets go of micro-batch 0: its slot is freed at once (no tick)
        assert micro.index == 1
        wait_for(lambda: client.status().published == 3, "micro-batch 2 in micro-batch 0's slot")
        assert freed.wait(timeout=10), "micro-batch 0 is still held while the loop holds its mini-batch"
        assert (mini.sequence, mini.descriptor.microbatch_index, mini.num_microbatches) == (1, 0, len(LENGTHS))
        assert [m.index for m in micro_batches] == list(range(2, len(LENGTHS)))


def test_a_negative_interval_is_refused_naming_the_field() -> None:
    with pytest.raises(InvalidArgument) as raised:
        TrainerSettings(sidecar="unix:/nowhere.sock", release_interval_seconds=-0.001)
    assert raised.value.field == "release_interval_seconds"


def voluntary_switches(thread: threading.Thread) -> int:
    """How many times ``thread`` has blocked and been woken (each tick of a timed wait is one)."""
    status = (Path("/proc/self/task") / str(thread.native_id) / "status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("voluntary_ctxt_switches:")).split()[1])


def test_while_the_loop_waits_for_data_the_release_thread_sleeps_and_slots_still_come_back(tmp_path) -> None:
    loop = LoopThread()
    running, source = start_sidecar(tmp_path, loop, VerdictOnRequest)
    assert isinstance(source, VerdictOnRequest)
    threads_before = set(threading.enumerate())
    client = client_for(running, 0.01)
    try:
        release_thread = next(t for t in set(threading.enumerate()) - threads_before
                              if t.name.startswith("knittrans-release"))
        taken: list = []
        waiting = threading.Thread(target=lambda: taken.append(list(next(client.mini_batches()))), daemon=True)
        waiting.start()  # no verdict, nothing published: the loop waits for micro-batch 0
        time.sleep(0.5)
        before = voluntary_switches(release_thread)
        time.sleep(1.0)
        assert voluntary_switches(release_thread) - before <= 2, "a 10 ms tick wakes it about 100 times a second"

        loop.loop.call_soon_threadsafe(source.given.set)
        waiting.join(timeout=60)
        # Six micro-batches through two ring slots: every slot the loop let go of came back to the sidecar.
        assert [m.index for m in taken[0]] == list(range(len(LENGTHS)))
        assert taken[0][0].waited_seconds > 0
    finally:
        client.close()
        loop.run(running.stop(grace=0))
        loop.close()
