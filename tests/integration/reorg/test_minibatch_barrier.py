"""Every trainer rank of a mini-batch computes on all of it or none of it (DESIGN.md §9), through the real stack:
``knittrans admission serve`` on port 0, three ``knittrans reorg serve`` sidecar processes on a file store (two
backbone consumers, dp = 2 with tp = 2, and one vision-encoder consumer), and a real :class:`TrainerClient` per
TP rank of each consumer (five ranks).

A unit that only one consumer reads is deleted (or truncated) after its trajectory was acknowledged. Every rank
of every consumer, not only the reader's, must get MiniBatchFailed naming that trajectory and unit before it
receives any micro-batch of the mini-batch; then every rank receives the next mini-batch with every byte as
written, the sidecar processes are the same ones, and the admission status counts the failure once.
"""

from __future__ import annotations

import dataclasses
import itertools
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from knittrans.client.admission import AdmissionClient
from knittrans.client.connection import ConnectionSettings
from knittrans.errors import MiniBatchFailed
from knittrans.rollout import MultimodalInput, RolloutClient
from knittrans.store.factory import open_store
from knittrans.store.file import file_name
from knittrans.trainer import TrainerClient, TrainerSettings
from knittrans.types import ConsumerId, TokenSpan, TrajectoryMeta, VersionSegment

from .processes import Process, start_admission, start_sidecar

DP, TP = 2, 2
TRAJECTORIES = 4  # a mini-batch (and a train batch)
TOPOLOGY = {
    "backbone": {"dp": DP, "cp": 1, "tp": TP, "max_tokens_per_microbatch": 4096},
    "encoders": [{"name": "vision", "dp": 1, "tp": 1, "max_cost_per_microbatch": 64}],
}
BACKBONE = [ConsumerId(role="backbone", dp_rank=d, cp_rank=0) for d in range(DP)]
ENCODER = ConsumerId(role="encoder:vision", dp_rank=0)
RANKS = [(c, t) for c in BACKBONE for t in range(TP)] + [(ENCODER, 0)]


@dataclasses.dataclass
class Written:
    meta: TrajectoryMeta
    fields: dict[str, np.ndarray]
    image: np.ndarray


@dataclasses.dataclass
class Stack:
    admission: Process
    sidecars: dict[ConsumerId, Process]
    client: AdmissionClient
    rollout: RolloutClient
    store_root: Path
    trainers: dict[tuple[ConsumerId, int], TrainerClient]
    iterators: dict[tuple[ConsumerId, int], Iterator]
    counter: Iterator[int]

    def write(self) -> Written:
        index = next(self.counter)
        rng = np.random.default_rng(index)
        length = 30 + 5 * (index % 4)
        fields = {"input_ids": rng.integers(1, 50_000, length, dtype=np.int32),
                  "loss_mask": (rng.random(length) < 0.7).astype(np.uint8),
                  "routing": rng.integers(0, 256, (length, 4), dtype=np.uint8)}
        image = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)  # its own sample: shared with no other trajectory
        meta = self.rollout.submit(
            fields, trajectory_id=f"t{index}", sample_id=f"s{index}", source="A", rollout_step=0,
            segments=(VersionSegment(version=0, num_tokens=length),),
            multimodal=(MultimodalInput(data=image, encoder="vision", cost=4.0,
                                        placeholder=TokenSpan(start=3, end=11)),),
        )
        return Written(meta=meta, fields=fields, image=image)

    def unit_path(self, key: str) -> Path:
        return self.store_root / "units" / file_name(key)

    def consume_everywhere(self) -> dict[tuple[ConsumerId, int], tuple[str, object]]:
        """The next mini-batch on every rank at once (ranks of one consumer share a ring): per rank either
        ("ok", micro-batches copied out) or ("failed", (error, micro-batches yielded before it))."""
        def consume(rank: tuple[ConsumerId, int]) -> tuple[str, object]:
            mini = next(self.iterators[rank])
            micros = []
            try:
                for micro in mini:
                    micros.append({"trajectory_ids": micro.trajectory_ids,
                                   "keys": [e.encoding.key for e in micro.encoder_inputs],
                                   "tensors": {n: t.numpy().copy() for n, t in micro.tensors.items()}})
            except MiniBatchFailed as error:
                return "failed", (error, mini.sequence, len(micros))
            return "ok", (mini.sequence, micros)

        with ThreadPoolExecutor(len(RANKS)) as pool:
            results = dict(zip(RANKS, pool.map(consume, RANKS), strict=True))
        return results

    def check_all_alive(self) -> None:
        for process in [self.admission, *self.sidecars.values()]:
            assert process.alive(), process.tail()


def check_intact(results: dict, written: list[Written]) -> None:
    """Every rank got the mini-batch; each trajectory's backbone fields arrived on both TP ranks of one backbone
    consumer, and each image on the encoder consumer, byte for byte as written."""
    by_id = {w.meta.trajectory_id: w for w in written}
    images = {w.meta.multimodal[0].key: w.image for w in written}
    sequences = set()
    for rank, (kind, value) in results.items():
        assert kind == "ok", (rank, value)
        sequences.add(value[0])
    assert len(sequences) == 1  # one mini-batch, the same on every rank
    for tp in range(TP):
        seen = []
        for consumer in BACKBONE:
            for micro in results[(consumer, tp)][1][1]:
                tensors, cu = micro["tensors"], micro["tensors"]["cu_seqlens"]
                for i, trajectory_id in enumerate(micro["trajectory_ids"]):
                    fields = by_id[trajectory_id].fields
                    rows = slice(int(cu[i]), int(cu[i]) + len(fields["input_ids"]))
                    for name in ("input_ids", "routing"):
                        np.testing.assert_array_equal(tensors[name][rows], fields[name])
                    seen.append(trajectory_id)
        assert sorted(seen) == sorted(by_id), tp
    got = {}
    for micro in results[(ENCODER, 0)][1][1]:
        for k, key in enumerate(micro["keys"]):
            got[key] = micro["tensors"]["inputs"][k]
    assert got.keys() == images.keys()
    for key, image in images.items():
        np.testing.assert_array_equal(got[key], image)


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    directory = tmp_path_factory.mktemp("barrier")
    job = f"ba{uuid.uuid4().hex[:8]}"
    store_root = directory / "units"
    store_url = f"file://{store_root}"
    admission = start_admission(directory, job=job, store=store_url, topology=TOPOLOGY,
                                train_batch_size=TRAJECTORIES, num_minibatches=1)
    address = admission.ready["address"]
    sidecars: dict[ConsumerId, Process] = {}
    trainers: dict[tuple[ConsumerId, int], TrainerClient] = {}
    try:
        for consumer in [*BACKBONE, ENCODER]:
            sidecars[consumer] = start_sidecar(directory, job=job, store=store_url, admission=address,
                                               dp_rank=consumer.dp_rank, cp_rank=consumer.cp_rank,
                                               role=consumer.role)
        for global_rank, (consumer, tp_rank) in enumerate(RANKS):
            # Hang guards only: a rank that never gets its mini-batch raises instead of waiting forever.
            trainers[(consumer, tp_rank)] = TrainerClient(TrainerSettings(
                sidecar=sidecars[consumer].ready["address"], tp_rank=tp_rank, global_rank=global_rank,
                admission=ConnectionSettings(target=address), device="cpu", poll_seconds=2.0,
                sidecar_timeout_seconds=10.0, wait_timeout_seconds=60.0))
        store = open_store(store_url, job=job)
        client = AdmissionClient(address, deadline=timedelta(seconds=10))
        yield Stack(admission=admission, sidecars=sidecars, client=client,
                    rollout=RolloutClient(store, namespace=job), store_root=Path(store.root), trainers=trainers,
                    iterators={rank: trainer.mini_batches() for rank, trainer in trainers.items()},
                    counter=itertools.count())
        client.close()
        store.close()
    finally:
        for trainer in trainers.values():
            trainer.close()
        for process in sidecars.values():
            process.stop()
        admission.stop()


def delete(path: Path) -> None:
    path.unlink()


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-1])


def image_key(victim: Written) -> str:
    return victim.meta.multimodal[0].key  # read by the encoder consumer only


def routing_key(victim: Written) -> str:
    return next(u.key for u in victim.meta.units if u.field_name == "routing")  # one backbone consumer only


CASES: dict[str, tuple[Callable[[Written], str], Callable[[Path], None], ConsumerId | None]] = {
    # name: (the unit to damage, the damage, the consumer that reads it; None: whichever backbone rank plans it)
    "image-deleted": (image_key, delete, ENCODER),
    "image-truncated": (image_key, truncate, ENCODER),
    "backbone-unit-deleted": (routing_key, delete, None),
    "backbone-unit-truncated": (routing_key, truncate, None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_unit_one_consumer_reads_fails_the_minibatch_on_every_rank_of_every_consumer(stack: Stack,
                                                                                       case: str) -> None:
    which, damage, reader = CASES[case]
    written = [stack.write() for _ in range(TRAJECTORIES)]
    victim = written[1]
    key = which(victim)
    damage(stack.unit_path(key))
    before = stack.client.status()
    stack.client.report([w.meta for w in written])

    results = stack.consume_everywhere()
    sequences = set()
    for rank, (kind, value) in results.items():
        assert kind == "failed", f"{rank} computed on a mini-batch another consumer could not read: {value}"
        error, sequence, yielded = value
        assert yielded == 0, rank  # the failure came before any micro-batch of the mini-batch
        assert (error.trajectory_id, error.unit_key) == (victim.meta.trajectory_id, key), (rank, error)
        assert error.sequence == sequence
        sequences.add(sequence)
    assert len(sequences) == 1

    status = stack.client.status()
    assert status.failed_minibatches == before.failed_minibatches + 1
    new = [f for f in status.recent_failures if f.sequence in sequences]
    assert len(new) == 1, new  # reported once, by the consumer that reads the unit
    failed_sequence = new[0].sequence
    assert (new[0].trajectory_id, new[0].unit_key) == (victim.meta.trajectory_id, key)
    if reader is not None:
        assert (new[0].consumer.role, new[0].consumer.dp_rank) == (reader.role, reader.dp_rank)
    else:
        assert new[0].consumer.role == "backbone"
    stack.check_all_alive()

    # Every rank goes on with the next mini-batch, intact, from the same sidecar processes.
    following = [stack.write() for _ in range(TRAJECTORIES)]
    stack.client.report([w.meta for w in following])
    check_intact(stack.consume_everywhere(), following)
    stack.check_all_alive()
    # Taking the next mini-batch reported the failed one's step on every consumer: its units were released (and
    # with it every mini-batch before it), so a failed mini-batch holds nothing in the store.
    assert stack.client.status().released_minibatches == failed_sequence
