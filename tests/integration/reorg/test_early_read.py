"""A sidecar reads and packs a mini-batch's first micro-batch while the admission service decides its verdict, and
publishes it only after a good one (DESIGN.md §9: every consumer sees a mini-batch whole or not at all).

A real sidecar on a Unix socket over a file store, a real TrainerClient, and an assignment source that holds the
verdict back until the test gives it. The oracle is the bytes the rollout wrote, regenerated from the seed, and
the sidecar's own byte counters (what the store moved)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import pytest

from knittrans.admission.planning import plan_minibatch
from knittrans.errors import MiniBatchFailed, UnitNotFound
from knittrans.reorg.assignments import Admission, Verdict
from knittrans.reorg.endpoint import RunningReorg, start_reorg
from knittrans.reorg.settings import ReorgSettings, RingSettings
from knittrans.rollout import RolloutClient
from knittrans.serving.settings import MetricsSettings, ServerSettings
from knittrans.store.file import FileUnitStore
from knittrans.store.protocol import UnitRead
from knittrans.trainer import TrainerClient, TrainerSettings
from knittrans.trainer.descriptor import MiniBatchFailure
from knittrans.types import BackboneTopology, ConsumerId, Topology, VersionSegment
from tests.loop_thread import LoopThread

from . import test_release_tick
from .single_sidecar_job import wait_for

TOPOLOGY = Topology(backbone=BackboneTopology(dp=1, cp=1, tp=1, max_tokens_per_microbatch=100))
LENGTHS = (70, 95, 60, 85)  # no two fit one micro-batch: one trajectory per micro-batch
SEED = 23
INT32 = 4


class VerdictOnRequest(test_release_tick.VerdictOnRequest):
    """Gives the verdict only once the test sets ``given``: ``failure`` if the test set one, else the source's."""

    failure: MiniBatchFailure | None = None

    async def wait_verdict(self, sequence: int) -> Verdict:
        verdict = await super().wait_verdict(sequence)
        return verdict if self.failure is None else Verdict(failure=self.failure)


class FirstReadMisses(FileUnitStore):
    """The file store, except that its first batched read finds a unit missing (as a read racing the unit's write
    would); every later read, and every size query, sees the store as it is."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.missed = threading.Event()

    def get_many_into(self, reads: Sequence[UnitRead]) -> list[int]:
        if not self.missed.is_set():
            self.missed.set()
            raise UnitNotFound("no such unit", field=reads[0].key)
        return super().get_many_into(reads)


def written_tokens() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEED)
    return {f"t{i}": rng.integers(1, 1000, length, dtype=np.int32) for i, length in enumerate(LENGTHS)}


@contextmanager
def sidecar_and_client(tmp_path, store_type: type[FileUnitStore] = FileUnitStore
                       ) -> Iterator[tuple[LoopThread, RunningReorg, VerdictOnRequest, FileUnitStore, TrainerClient]]:
    """A sidecar with one mini-batch assigned (on its loop, with its source and its store) and a trainer client."""
    job = f"early{uuid.uuid4().hex[:8]}"
    root = tmp_path / "units"
    rollout = RolloutClient(FileUnitStore(root), namespace=job)
    metas = [rollout.submit({"input_ids": tokens}, trajectory_id=trajectory_id, sample_id=trajectory_id, source="A",
                            rollout_step=0, segments=(VersionSegment(version=0, num_tokens=len(tokens)),),
                            loss_mask_field=None)
             for trajectory_id, tokens in written_tokens().items()]
    plan = plan_minibatch(metas, TOPOLOGY)
    assert plan.microbatches_per_rank == len(LENGTHS), "precondition: one trajectory per micro-batch"
    consumer = ConsumerId(role="backbone", dp_rank=0)
    settings = ReorgSettings(job=job, role=consumer.role, dp_rank=0, cp_rank=0, store=f"file://{root}",
                             ring=RingSettings(slots=2), server=ServerSettings(metrics=MetricsSettings(port=-1)))
    source = VerdictOnRequest(consumer, [(Admission(minibatch_index=0, num_minibatches=1), plan)], job=job)
    store = store_type(root)
    loop = LoopThread()
    running = loop.run(start_reorg(settings, source=source, store=store))
    client = client_for(running)
    try:
        yield loop, running, source, store, client
    finally:
        client.close()
        loop.run(running.stop(grace=0))
        loop.close()


def client_for(running: RunningReorg) -> TrainerClient:
    return TrainerClient(TrainerSettings(sidecar=running.address, device="cpu", prefetch=1, poll_seconds=1.0,
                                         report_progress=False))


def take_all(client: TrainerClient) -> list[tuple[int, np.ndarray]]:
    """Each micro-batch's index and real tokens, copied while it is held (its slot is reused after)."""
    return [(micro.index, micro["input_ids"].numpy().reshape(-1)[: int(micro["seq_lengths"].sum())].copy())
            for micro in next(client.mini_batches())]


def assert_as_written(micro_batches: list[tuple[int, np.ndarray]]) -> None:
    """Each micro-batch holds one trajectory's tokens as the rollout wrote them, and every trajectory comes once."""
    written = written_tokens()
    seen = []
    for index, tokens in micro_batches:
        match = [t for t, w in written.items() if len(w) == len(tokens) and np.array_equal(w, tokens)]
        assert len(match) == 1, f"micro-batch {index} holds tokens no trajectory was written with"
        seen.append(match[0])
    assert sorted(seen) == sorted(written)


def test_micro_batch_0_is_read_before_the_verdict_and_published_only_after_it(tmp_path) -> None:
    with sidecar_and_client(tmp_path) as (loop, running, source, _, client):
        sidecar = running.sidecar
        wait_for(lambda: sidecar.counters.bytes_read > 0, "micro-batch 0 read while the verdict is held back")
        time.sleep(0.5)  # time to read further, if anything wrongly would
        counters = sidecar.counters
        assert counters.published == 0 and client.status().published == 0
        assert counters.bytes_read == counters.bytes_needed
        assert counters.bytes_read // INT32 in LENGTHS, "one micro-batch, one trajectory's tokens, read before"

        taken: list = []
        taking = threading.Thread(target=lambda: taken.append(take_all(client)), daemon=True)
        taking.start()
        time.sleep(0.3)
        assert not taken and client.status().published == 0, "nothing reaches a trainer before the verdict"

        loop.loop.call_soon_threadsafe(source.given.set)
        taking.join(timeout=60)
        assert [index for index, _ in taken[0]] == list(range(len(LENGTHS)))
        assert_as_written(taken[0])
        counters = sidecar.counters
        # Micro-batch 0 was read once, before the verdict, and never again.
        assert counters.bytes_read == counters.bytes_needed == sum(LENGTHS) * INT32
        assert counters.read_calls == len(LENGTHS)


def test_a_failed_verdict_after_the_early_read_publishes_the_failure_in_its_place(tmp_path) -> None:
    with sidecar_and_client(tmp_path) as (loop, running, source, _, client):
        sidecar = running.sidecar
        wait_for(lambda: sidecar.counters.bytes_read > 0, "micro-batch 0 read while the verdict is held back")
        source.failure = MiniBatchFailure(trajectory_id="t2", unit_key="elsewhere/unit",
                                          reason="found before delivery: the unit is missing from the store")
        loop.loop.call_soon_threadsafe(source.given.set)
        mini = next(client.mini_batches())
        with pytest.raises(MiniBatchFailed) as raised:
            list(mini)
        assert (raised.value.trajectory_id, raised.value.unit_key) == ("t2", "elsewhere/unit")
        # Only the failure was published; the slot micro-batch 0 was packed into came back.
        assert sidecar.counters.published == 1
        wait_for(lambda: sidecar.ring.occupied == 0, "every slot free once the failure was released")


def test_an_early_read_that_fails_is_read_again_after_a_good_verdict(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="knittrans.reorg.sidecar")
    with sidecar_and_client(tmp_path, FirstReadMisses) as (loop, running, source, store, client):
        assert isinstance(store, FirstReadMisses)
        assert store.missed.wait(timeout=60), "micro-batch 0 is read before the verdict"
        time.sleep(0.3)
        assert running.sidecar.counters.published == 0
        loop.loop.call_soon_threadsafe(source.given.set)
        micro_batches = take_all(client)
        assert [index for index, _ in micro_batches] == list(range(len(LENGTHS)))
        assert_as_written(micro_batches)
        assert any("reading it again" in record.getMessage() for record in caplog.records)
