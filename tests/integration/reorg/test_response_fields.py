"""Response-only fields (DESIGN.md §10, docs/integration.md "Response-only fields") through the real stack and a
real file store.

- ``knittrans admission serve`` declaring ``coverage: response`` fields, one ``knittrans reorg serve`` sidecar and
  a real :class:`TrainerClient`: what the trainer receives equals the naive reference (the response-only arrays
  padded with 0 over the prompt, aligned like labels), each with a ``<name>.mask`` that is 1 exactly on stored
  values; the sidecar reads what its plans need and nothing more (bytes read = bytes needed = the stored bytes);
- a report whose response-only unit has the wrong number of rows, or the wrong coverage, is refused at ingest
  naming the field, and the stack serves the next mini-batch intact;
- with cp in {1, 2, 4}, a sidecar's reads of a response-only field are exactly the response tokens of its chunks
  (plus the look-ahead token of a token-aligned field): the file store's accounting shows those bytes, moved
  bytes equal to requested bytes, and no prompt bytes.
"""

from __future__ import annotations

import dataclasses
import itertools
import uuid
from collections.abc import Iterator
from datetime import timedelta

import numpy as np
import pytest

from knittrans.admission.service.assignments import MiniBatchDispatch, gather_rows
from knittrans.admission.service.ingest.rules import IngestLimits, check_columns
from knittrans.admission.service.trajectory_columns import TrajectoryColumns
from knittrans.client.admission import AdmissionClient
from knittrans.client.connection import ConnectionSettings
from knittrans.errors import InvalidArgument
from knittrans.plan.rank_proto import consumer_assignment_from_rank_proto
from knittrans.reorg.packing import PackSettings, backbone_layout
from knittrans.reorg.reader import MicroBatchReader
from knittrans.rollout import RolloutClient
from knittrans.store.factory import open_store
from knittrans.store.file import FileUnitStore
from knittrans.trainer import TrainerClient, TrainerSettings
from knittrans.types import (
    BackboneTopology,
    ConsumerId,
    Coverage,
    Topology,
    TrajectoryMeta,
    UnitHeader,
    VersionSegment,
)
from knittrans.v1 import plan_pb2
from knittrans.wire.columns import batch_from_metas

from .processes import start_admission, start_sidecar

TOPOLOGY = {"backbone": {"dp": 1, "cp": 1, "tp": 1, "max_tokens_per_microbatch": 4096}}
SCHEMA = {
    "token_fields": {
        "input_ids": {"dtype": "int32"},
        "loss_mask": {"dtype": "uint8", "coverage": "response"},  # verl's response_mask, token-aligned
        "old_logprobs": {"dtype": "float32", "coverage": "response"},  # token-aligned: shifted when packed
        "advantages": {"dtype": "float32", "row_shape": [2], "coverage": "response"},  # already label-aligned
    },
}
RESPONSE = ("loss_mask", "old_logprobs", "advantages")
ALIGNMENT = {"loss_mask": "token", "old_logprobs": "token", "advantages": "label"}


@dataclasses.dataclass(frozen=True)
class Written:
    meta: TrajectoryMeta
    tokens: np.ndarray
    response_start: int
    response: dict[str, np.ndarray]


def write(rollout: RolloutClient, index: int, *, prompt: int | None = None) -> Written:
    rng = np.random.default_rng(index)
    length = int(rng.integers(3, 40))
    start = int(rng.integers(1, length)) if prompt is None else prompt
    response = {"loss_mask": (rng.random(length - start) < 0.8).astype(np.uint8),
                "old_logprobs": rng.standard_normal(length - start).astype(np.float32),
                "advantages": rng.standard_normal((length - start, 2)).astype(np.float32)}
    tokens = rng.integers(1, 50_000, length, dtype=np.int32)
    meta = rollout.submit({"input_ids": tokens, **response}, trajectory_id=f"t{index}", sample_id=f"s{index}",
                          source="A", rollout_step=0, segments=(VersionSegment(version=0, num_tokens=length),),
                          response_start=start, response_fields=RESPONSE, field_alignment=ALIGNMENT)
    return Written(meta=meta, tokens=tokens, response_start=start, response=response)


def expected_rows(written: Written, name: str) -> tuple[np.ndarray, np.ndarray]:
    """The naive reference: the field padded with 0 over the prompt, label-aligned (a token-aligned one moves left
    by one, 0 at the last token), and its mask (1 on stored values)."""
    stored = written.response[name]
    length = len(written.tokens)
    full = np.concatenate([np.zeros((written.response_start, *stored.shape[1:]), stored.dtype), stored])
    present = (np.arange(length) >= written.response_start).astype(np.uint8)
    if ALIGNMENT[name] == "token":
        full = np.concatenate([full[1:], np.zeros((1, *stored.shape[1:]), stored.dtype)])
        present = np.concatenate([present[1:], [0]]).astype(np.uint8)
    return full, present


@dataclasses.dataclass
class Stack:
    client: AdmissionClient
    rollout: RolloutClient
    trainer: TrainerClient
    minibatches: Iterator
    counter: Iterator[int]

    def round_trip(self) -> None:
        written = {w.meta.trajectory_id: w for w in (write(self.rollout, next(self.counter)) for _ in range(2))}
        before = self.trainer.status()  # the sidecar reads a mini-batch as soon as it is admitted
        self.client.report([w.meta for w in written.values()])
        seen = []
        for micro in next(self.minibatches):
            tensors = {name: tensor.numpy().copy() for name, tensor in micro.tensors.items()}
            cu = tensors["cu_seqlens"]
            for i, trajectory_id in enumerate(micro.trajectory_ids):
                w = written[trajectory_id]
                rows = slice(int(cu[i]), int(cu[i]) + len(w.tokens))
                np.testing.assert_array_equal(tensors["input_ids"][rows], w.tokens)
                for name in RESPONSE:
                    values, present = expected_rows(w, name)
                    np.testing.assert_array_equal(tensors[name][rows], values, err_msg=name)
                    np.testing.assert_array_equal(tensors[f"{name}.mask"][rows], present, err_msg=f"{name}.mask")
                seen.append(trajectory_id)
        assert sorted(seen) == sorted(written)
        after = self.trainer.status()
        stored = sum(u.header.byte_length for w in written.values() for u in w.meta.units)
        assert after.bytes_needed - before.bytes_needed == stored  # cp = 1: every stored byte once, no prompt
        assert after.bytes_read - before.bytes_read == stored  # amplification 1.00


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    directory = tmp_path_factory.mktemp("response")
    job = f"rf{uuid.uuid4().hex[:8]}"
    store_url = f"file://{directory / 'units'}"
    admission = start_admission(directory, job=job, store=store_url, topology=TOPOLOGY, train_batch_size=2,
                                num_minibatches=1, schema=SCHEMA)
    address = admission.ready["address"]
    sidecar = None
    try:
        sidecar = start_sidecar(directory, job=job, store=store_url, admission=address, dp_rank=0, cp_rank=0)
        store = open_store(store_url, job=job)
        client = AdmissionClient(address, deadline=timedelta(seconds=10))
        # Hang guards only: a dead sidecar makes the trainer raise instead of waiting forever.
        trainer = TrainerClient(TrainerSettings(sidecar=sidecar.ready["address"], admission=ConnectionSettings(
            target=address), poll_seconds=2.0, sidecar_timeout_seconds=10.0, wait_timeout_seconds=60.0))
        yield Stack(client=client, rollout=RolloutClient(store, namespace=job), trainer=trainer,
                    minibatches=trainer.mini_batches(), counter=itertools.count())
        trainer.close()
        client.close()
        store.close()
    finally:
        if sidecar is not None:
            sidecar.stop()
        admission.stop()


def test_response_only_fields_reach_the_trainer_padded_and_masked_reading_only_their_bytes(stack: Stack) -> None:
    for _ in range(3):
        stack.round_trip()


@pytest.mark.parametrize("columnar", [True, False], ids=["batch", "messages"])
def test_a_response_field_of_the_wrong_length_or_coverage_is_refused_naming_it(stack: Stack, columnar: bool) -> None:
    good = write(stack.rollout, next(stack.counter)).meta
    bad = write(stack.rollout, next(stack.counter)).meta
    # One row short, built without validation, as a hand-made report would arrive.
    unit_index = next(i for i, u in enumerate(bad.units) if u.field_name == "old_logprobs")
    header = bad.units[unit_index].header
    rows = header.shape[0] - 1
    wrong_rows = UnitHeader(dtype=header.dtype, shape=(rows,), byte_length=rows * 4,
                            content_hash=header.content_hash, seq_axis=0)
    units = list(bad.units)
    units[unit_index] = dataclasses.replace(units[unit_index], header=wrong_rows)
    too_short = object.__new__(TrajectoryMeta)
    too_short.__dict__.update({**bad.__dict__, "units": tuple(units)})
    with pytest.raises(InvalidArgument) as caught:
        stack.client.report([good, too_short], columnar=columnar)
    assert caught.value.field == f"trajectories[1].units[{unit_index}].header.shape", caught.value
    assert "'old_logprobs'" in caught.value.message and f"needs {rows + 1}" in caught.value.message
    # Whole-sequence coverage where the schema declares the response: a sequence-long array, but the wrong coverage.
    whole = write(stack.rollout, next(stack.counter), prompt=0).meta
    units = list(whole.units)
    units[unit_index] = dataclasses.replace(units[unit_index], coverage=Coverage.SEQUENCE)
    with pytest.raises(InvalidArgument) as caught:
        stack.client.report([good, dataclasses.replace(whole, units=tuple(units))], columnar=columnar)
    assert caught.value.field == f"trajectories[1].units[{unit_index}].coverage", caught.value
    assert "'old_logprobs'" in caught.value.message
    stack.round_trip()  # nothing was applied


# ---- cp in {1, 2, 4}: the file store's accounting ----------------------------------------------------------------


def chunk_tokens(length: int, padded: int, cp: int, cp_rank: int) -> list[range]:
    """The real tokens of CP rank ``cp_rank``'s two zigzag chunks, computed from scratch."""
    size = padded // (2 * cp)
    return [range(min(c * size, length), min((c + 1) * size, length)) for c in (cp_rank, 2 * cp - 1 - cp_rank)]


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_a_sidecar_reads_exactly_the_response_tokens_of_its_chunks(cp: int, tmp_path) -> None:
    store = FileUnitStore(tmp_path)
    rollout = RolloutClient(store, namespace="resp")
    written = [write(rollout, index) for index in range(9)]
    metas = [w.meta for w in written]
    columns = TrajectoryColumns.from_proto(batch_from_metas(metas))
    check_columns(columns, IngestLimits(sources={"A"}, encoders=()), 0, max_batch=len(metas))
    topology = Topology(backbone=BackboneTopology(dp=2, cp=cp, max_tokens_per_microbatch=96))
    dispatch = MiniBatchDispatch(gather_rows([(columns, i) for i in range(len(metas))]), topology, ("input_ids",))
    pack = PackSettings()
    by_id = {w.meta.trajectory_id: w for w in written}
    for dp_rank in range(2):
        rank = plan_pb2.RankAssignment(**dispatch.rank_fields(dp_rank))  # what the sidecars receive
        for cp_rank in range(cp):
            consumer = ConsumerId(role="backbone", dp_rank=dp_rank, cp_rank=cp_rank)
            for micro in consumer_assignment_from_rank_proto(rank, consumer).microbatches:
                expected = 0
                for item in micro.items:
                    w = by_id[item.trajectory.trajectory_id]
                    length = len(w.tokens)
                    for name in RESPONSE:
                        row = w.response[name][0].nbytes if len(w.response[name]) else 0
                        tokens = set()
                        for chunk in chunk_tokens(length, item.padded_tokens, cp, cp_rank):
                            extra = 1 if ALIGNMENT[name] == "token" and len(chunk) and chunk.stop < length else 0
                            tokens |= set(range(chunk.start, chunk.stop + extra))
                        expected += row * sum(1 for t in tokens if t >= w.response_start)
                layout = backbone_layout(micro, cp=cp, settings=pack)
                reader = MicroBatchReader(store)
                requested0, moved0 = store.stats.requested_bytes, store.stats.moved_bytes
                reader.read(layout, np.zeros(max(layout.used_bytes, 1), dtype=np.uint8))
                reader.close()
                response_keys = {read.unit.key for item in micro.items for read in item.reads
                                 if read.unit.field_name in RESPONSE}
                read_of_response = sum(p.byte_length for p in layout.reads if p.key in response_keys)
                assert read_of_response == expected, (dp_rank, cp_rank)
                assert store.stats.requested_bytes - requested0 == layout.needed_bytes
                assert store.stats.moved_bytes - moved0 == layout.needed_bytes  # amplification 1.00
    store.close()
