"""Sidecars embedded in this process (plans from the real planner over trajectories in a real file store,
served on real Unix sockets) and trainer clients in threads: encoder-role sidecars, the mini-batch context
(plan, encoding schedule), eager against iter delivery, and a dead sidecar surfacing as an error."""

from __future__ import annotations

import threading
import uuid
import zlib
from collections.abc import Iterator

import numpy as np
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from knittrans.admission.planning import plan_minibatch
from knittrans.errors import KnitTransError, Unavailable
from knittrans.reorg.assignments import Admission, PlannedAssignmentSource
from knittrans.reorg.endpoint import RunningReorg, start_reorg
from knittrans.reorg.settings import ReorgSettings, RingSettings
from knittrans.rollout import MultimodalInput, RolloutClient
from knittrans.serving.settings import MetricsSettings, ServerSettings
from knittrans.shm import list_segments
from knittrans.store.file import FileUnitStore
from knittrans.trainer import DeliveryMode, TrainerClient, TrainerSettings
from knittrans.types import BackboneTopology, ConsumerId, EncoderTopology, TokenSpan, Topology, VersionSegment
from tests.loop_thread import LoopThread

TOPOLOGY = Topology(
    backbone=BackboneTopology(dp=1, cp=2, tp=2, max_tokens_per_microbatch=300),
    encoders=(EncoderTopology(name="vision", dp=2, max_cost_per_microbatch=20),),
)


@pytest.fixture
def world(tmp_path) -> Iterator[dict]:
    job = f"emb{uuid.uuid4().hex[:8]}"
    root = tmp_path / "units"
    store = FileUnitStore(root)
    rollout = RolloutClient(store, namespace=job)
    rng = np.random.default_rng(3)
    metas, images = [], {}
    for i in range(8):
        length = int(rng.integers(40, 160))
        sample = i // 4
        pixels = np.full((6, 6, 3), 10 * sample + 1, dtype=np.uint8)
        metas.append(rollout.submit(
            {"input_ids": rng.integers(1, 1000, length, dtype=np.int32),
             "loss_mask": np.ones(length, dtype=np.uint8)},
            trajectory_id=f"t{i}", sample_id=f"s{sample}", source="A", rollout_step=0,
            segments=(VersionSegment(version=0, num_tokens=length),),
            multimodal=(MultimodalInput(data=pixels, encoder="vision", cost=4.0,
                                        placeholder=TokenSpan(start=5, end=21)),),
        ))
        images[metas[-1].multimodal[0].key] = pixels
    plans = [(Admission(minibatch_index=k, num_minibatches=2), plan_minibatch(metas[4 * k : 4 * k + 4], TOPOLOGY))
             for k in range(2)]
    loop = LoopThread()
    sidecars: dict[ConsumerId, RunningReorg] = {}
    consumers = [ConsumerId(role="backbone", dp_rank=0, cp_rank=c) for c in range(2)] + [
        ConsumerId(role="encoder:vision", dp_rank=d) for d in range(2)]
    for consumer in consumers:
        settings = ReorgSettings(job=job, role=consumer.role, dp_rank=consumer.dp_rank, cp_rank=consumer.cp_rank,
                                 store=f"file://{root}", ring=RingSettings(slots=2),
                                 server=ServerSettings(metrics=MetricsSettings(port=-1)))
        source = PlannedAssignmentSource(consumer, plans, job=job)
        sidecars[consumer] = loop.run(start_reorg(settings, source=source, store=FileUnitStore(root)))
    yield {"plans": plans, "sidecars": sidecars, "images": images, "loop": loop, "job": job}
    for running in sidecars.values():
        loop.run(running.stop(grace=0))
    loop.close()
    assert list_segments(f"knittrans-{job}-") == []


def client_for(world: dict, consumer: ConsumerId, **overrides) -> TrainerClient:
    values = {"sidecar": world["sidecars"][consumer].address, "sidecar_timeout_seconds": 2.0, "poll_seconds": 1.0,
              **overrides}
    return TrainerClient(TrainerSettings(**values))


def test_encoder_sidecars_deliver_unique_inputs_in_encoder_order_with_routes(world) -> None:
    seen_keys = []
    for d in range(2):
        consumer = ConsumerId(role="encoder:vision", dp_rank=d)
        with client_for(world, consumer) as client:
            for (_, plan), mini in zip(world["plans"], client.mini_batches(), strict=False):
                expected = [plan.encoding(int(e)) for mb in plan.encoder_microbatches("vision", d) for e in mb]
                got = []
                for micro in mini:
                    assert micro.index < mini.num_microbatches
                    if micro.empty:
                        assert "inputs" not in micro
                        continue
                    pixels = micro["inputs"].numpy()
                    for k, encoding in enumerate(micro.encoder_inputs):
                        np.testing.assert_array_equal(pixels[k], world["images"][encoding.encoding.key])
                        assert encoding.routes == plan.routes(encoding.encoding.encoding_id)
                        got.append(encoding.encoding)
                assert got == expected
                assert [e.encoding for e in mini.encoder_inputs] == expected
                seen_keys += [e.key for e in got]
                if mini.minibatch_index == 1:
                    break
    # Every unique image of each mini-batch went to exactly one encoder rank: 2 samples x 2 mini-batches.
    assert len(seen_keys) == len(set(seen_keys)) == 2


def test_backbone_micro_batches_carry_packed_encoding_positions_and_the_plan(world) -> None:
    consumer = ConsumerId(role="backbone", dp_rank=0, cp_rank=1)
    clients = [client_for(world, consumer, tp_rank=t) for t in range(2)]
    try:
        results: dict[int, list] = {0: [], 1: []}

        def consume(tp: int) -> None:
            for mini in clients[tp].mini_batches():
                uses = mini.encoding_uses
                for micro in mini:
                    assert micro.encodings == uses[micro.index]
                    results[tp].append((mini.sequence, micro.index, micro.trajectory_ids, micro.encodings,
                                        zlib.crc32(micro["input_ids"].numpy().tobytes())))
                if mini.minibatch_index == 0:
                    schedule = mini.encoding_schedule("vision")
                    assert schedule.world_size == 4  # dp 1 x cp 2 x tp 2
                    assert mini.plan is not None and mini.plan.num_trajectories == 4
                if mini.minibatch_index == 1:
                    return

        threads = [threading.Thread(target=consume, args=(tp,)) for tp in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert results[0] and results[0] == results[1]
        assert any(r[3] for r in results[0])
    finally:
        for client in clients:
            client.close()


def test_eager_and_iter_ranks_receive_the_same_bytes(world) -> None:
    consumer = ConsumerId(role="backbone", dp_rank=0, cp_rank=0)
    results: dict[str, list] = {}

    def consume(mode: DeliveryMode, tp: int) -> None:
        with client_for(world, consumer, tp_rank=tp, mode=mode) as client:
            rows = []
            for mini in client.mini_batches():
                for micro in mini:
                    rows.append((mini.sequence, micro.index,
                                 {name: zlib.crc32(t.numpy().tobytes()) for name, t in micro.tensors.items()}))
                if mini.minibatch_index == 1:
                    break
            results[mode.value] = rows

    threads = [threading.Thread(target=consume, args=(DeliveryMode.ITER, 0)),
               threading.Thread(target=consume, args=(DeliveryMode.EAGER, 1))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results["iter"] and results["iter"] == results["eager"]

    # The sidecar's metrics, under the names docs/metrics.md lists.
    metrics = {}
    for family in text_string_to_metric_families(
            generate_latest(world["sidecars"][consumer].server.registry).decode()):
        for sample in family.samples:
            if sample.name.startswith("knittrans_reorg_") and sample.labels.get("role") == "backbone":
                metrics[sample.name] = sample.value
    assert metrics["knittrans_reorg_bytes_read_total"] == metrics["knittrans_reorg_bytes_needed_total"] > 0
    assert metrics["knittrans_reorg_microbatches_published_total"] == len(results["iter"])
    assert metrics["knittrans_reorg_read_seconds_count"] == metrics["knittrans_reorg_pack_seconds_count"] == len(
        results["iter"])
    assert metrics["knittrans_reorg_slots"] == 2
    assert "knittrans_reorg_slots_occupied" in metrics
    assert metrics["knittrans_reorg_trainer_wait_seconds_count"] >= len(results["iter"])  # iter rank's waits


@pytest.mark.parametrize("mode", [DeliveryMode.ITER, DeliveryMode.EAGER])
def test_leaving_a_mini_batch_early_keeps_the_next_one_aligned(world, mode) -> None:
    consumer = ConsumerId(role="backbone", dp_rank=0, cp_rank=1)
    clients = [client_for(world, consumer, tp_rank=t, mode=mode) for t in range(2)]
    seen: dict[int, list] = {0: [], 1: []}

    def consume(tp: int) -> None:
        for mini in clients[tp].mini_batches():
            for micro in mini:
                seen[tp].append((mini.sequence, micro.index))
                break  # the rest of the mini-batch is drained (and released) when the next one is taken
            if mini.minibatch_index == 1:
                return

    threads = [threading.Thread(target=consume, args=(tp,)) for tp in range(2)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert seen[0] == seen[1] == [(1, 0), (2, 0)]
    finally:
        for client in clients:
            client.close()


def test_a_dead_sidecar_is_an_error_not_a_hang(world) -> None:
    consumer = ConsumerId(role="backbone", dp_rank=0, cp_rank=0)
    client = client_for(world, consumer, sidecar_timeout_seconds=1.0, poll_seconds=0.5)
    running = world["sidecars"].pop(consumer)
    try:
        minis = client.mini_batches()
        first = next(minis)
        world["loop"].run(running.stop(grace=0))
        with pytest.raises(KnitTransError) as info:
            for _ in first:
                pass
            next(minis)
        assert isinstance(info.value, Unavailable)
        assert "sidecar" in str(info.value)
    finally:
        client.close()


def test_a_consumer_without_micro_batches_still_sees_the_mini_batch(tmp_path) -> None:
    """A text-only mini-batch gives the encoder consumer nothing to encode; its trainer still gets the mini-batch
    (one empty micro-batch), so it can report the optimizer step the release waits for."""
    job = f"emb{uuid.uuid4().hex[:8]}"
    root = tmp_path / "units"
    store = FileUnitStore(root)
    rollout = RolloutClient(store, namespace=job)
    metas = [rollout.submit({"input_ids": np.arange(1, 41, dtype=np.int32)}, trajectory_id=f"t{i}",
                            sample_id=f"s{i}", source="A", rollout_step=0, loss_mask_field=None,
                            segments=(VersionSegment(version=0, num_tokens=40),)) for i in range(2)]
    plan = plan_minibatch(metas, TOPOLOGY)
    consumer = ConsumerId(role="encoder:vision", dp_rank=0)
    assert not plan.for_consumer(consumer).encoder_microbatches
    loop = LoopThread()
    settings = ReorgSettings(job=job, role=consumer.role, store=f"file://{root}",
                             server=ServerSettings(metrics=MetricsSettings(port=-1)))
    running = loop.run(start_reorg(settings, source=PlannedAssignmentSource(consumer, [(Admission(), plan)]),
                                   store=FileUnitStore(root)))
    try:
        with TrainerClient(TrainerSettings(sidecar=running.address, poll_seconds=1.0)) as client:
            seen = []
            for mini in client.mini_batches():  # the planned source ends after its one plan
                seen.append((mini.sequence, [(micro.index, micro.empty, micro.keys()) for micro in mini]))
            assert seen == [(1, [(0, True, [])])]
        assert running.sidecar.counters.read_calls == 0 and running.sidecar.counters.published == 1
    finally:
        loop.run(running.stop(grace=0))
        loop.close()
