"""Data the admission service acknowledges never crashes the data plane (DESIGN.md §9, "Poison data cannot get
in"), through the real stack: ``knittrans admission serve`` on port 0, one ``knittrans reorg serve`` sidecar
process on a file store, and a real :class:`TrainerClient` (dp = cp = tp = 1, two trajectories a mini-batch).

- every kind of report that disagrees with the job's schema (fixed by its first trajectory) is refused at
  ingest with INVALID_ARGUMENT naming the field, in both report forms;
- trajectories whose scalar sets differ are accepted and packed (NaN plus a presence mask);
- every kind of damaged unit (deleted, truncated, grown) makes the trainer's mini-batch raise MiniBatchFailed
  naming the trajectory and the unit, the admission status records it;
and after each case the very same sidecar process is alive and delivers the next mini-batch intact.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from knittrans.client.admission import AdmissionClient
from knittrans.client.connection import ConnectionSettings
from knittrans.errors import InvalidArgument, MiniBatchFailed
from knittrans.rollout import RolloutClient
from knittrans.store.factory import open_store
from knittrans.store.file import file_name
from knittrans.trainer import TrainerClient, TrainerSettings
from knittrans.types import DType, TrajectoryMeta, UnitHeader, UnitKind, UnitRef, VersionSegment
from tests.builders import digest

from .processes import Process, start_admission, start_sidecar

TOPOLOGY = {"backbone": {"dp": 1, "cp": 1, "tp": 1, "max_tokens_per_microbatch": 4096}}
ROUTING = 4


@dataclasses.dataclass
class Stack:
    admission: Process
    sidecar: Process
    client: AdmissionClient
    rollout: RolloutClient
    store_root: Path
    trainer: TrainerClient
    minibatches: Iterator
    counter: Iterator[int]

    def fields(self, length: int, seed: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        return {
            "input_ids": rng.integers(1, 50_000, length, dtype=np.int32),
            "loss_mask": (rng.random(length) < 0.7).astype(np.uint8),
            "routing": rng.integers(0, 256, (length, ROUTING), dtype=np.uint8),
            "stats": rng.random(3).astype(np.float32),
        }

    def write(self, *, scalars: dict[str, float] | None = None) -> tuple[TrajectoryMeta, dict[str, np.ndarray]]:
        """Store a good trajectory's units (not reported yet)."""
        index = next(self.counter)
        fields = self.fields(12 + 7 * (index % 5), index)
        meta = self.rollout.submit(
            fields, trajectory_id=f"t{index}", sample_id=f"s{index}", source="A", rollout_step=0,
            segments=(VersionSegment(version=0, num_tokens=len(fields["input_ids"])),),
            scalars={"reward": float(index)} if scalars is None else scalars, non_sequence_fields=("stats",),
        )
        return meta, fields

    def report(self, metas: list[TrajectoryMeta], *, columnar: bool = True) -> None:
        self.client.report(metas, columnar=columnar)

    def unit_path(self, key: str) -> Path:
        return self.store_root / "units" / file_name(key)

    def consume(self) -> tuple[object, list[dict]]:
        """The next mini-batch, every micro-batch's tensors copied out (raises what iterating it raises)."""
        mini = next(self.minibatches)
        micros = []
        for micro in mini:
            tensors = {name: tensor.numpy().copy() for name, tensor in micro.tensors.items()}
            micros.append({"trajectory_ids": micro.trajectory_ids, "tensors": tensors})
        return mini, micros

    def check_serves_next(self) -> None:
        """The same sidecar process is up, and the next mini-batch arrives with every byte intact."""
        written = [self.write() for _ in range(2)]
        self.report([meta for meta, _ in written])
        _, micros = self.consume()
        check_intact(micros, {meta.trajectory_id: (meta, fields) for meta, fields in written})
        assert self.sidecar.alive(), self.sidecar.tail()
        assert self.admission.alive(), self.admission.tail()


def check_intact(micros: list[dict], expected: dict[str, tuple[TrajectoryMeta, dict[str, np.ndarray]]]) -> None:
    seen = []
    for micro in micros:
        tensors = micro["tensors"]
        cu = tensors["cu_seqlens"]
        for i, trajectory_id in enumerate(micro["trajectory_ids"]):
            meta, fields = expected[trajectory_id]
            length = len(fields["input_ids"])
            rows = slice(int(cu[i]), int(cu[i]) + length)
            for name in ("input_ids", "routing"):
                np.testing.assert_array_equal(tensors[name][rows], fields[name])
            # Submitted token-aligned (the default), the loss mask is delivered label-aligned: the next token's.
            np.testing.assert_array_equal(tensors["loss_mask"][rows], np.append(fields["loss_mask"][1:], 0))
            np.testing.assert_array_equal(tensors["stats"][i], fields["stats"])
            assert tensors["scalar.reward"][i] == dict(meta.scalars)["reward"]
            seen.append(trajectory_id)
    assert sorted(seen) == sorted(expected)


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    directory = tmp_path_factory.mktemp("poison")
    job = f"po{uuid.uuid4().hex[:8]}"
    store_root = directory / "units"
    store_url = f"file://{store_root}"
    admission = start_admission(directory, job=job, store=store_url, topology=TOPOLOGY, train_batch_size=2,
                                num_minibatches=1)
    address = admission.ready["address"]
    sidecar = None
    try:
        sidecar = start_sidecar(directory, job=job, store=store_url, admission=address, dp_rank=0, cp_rank=0)
        store = open_store(store_url, job=job)
        client = AdmissionClient(address, deadline=timedelta(seconds=10))
        # Hang guards only: a dead sidecar makes the trainer raise instead of waiting forever.
        trainer = TrainerClient(TrainerSettings(sidecar=sidecar.ready["address"], admission=ConnectionSettings(
            target=address), poll_seconds=2.0, sidecar_timeout_seconds=10.0, wait_timeout_seconds=60.0))
        stack = Stack(admission=admission, sidecar=sidecar, client=client,
                      rollout=RolloutClient(store, namespace=job), store_root=Path(store.root), trainer=trainer,
                      minibatches=trainer.mini_batches(), counter=itertools.count())
        stack.check_serves_next()  # the first trajectory fixes the job's schema
        yield stack
        trainer.close()
        client.close()
        store.close()
    finally:
        if sidecar is not None:
            sidecar.stop()
        admission.stop()


# ---- reports that disagree with the job's schema -------------------------------------------------------------


def _replace_unit(meta: TrajectoryMeta, field: str, change: Callable[[UnitRef], UnitRef | None]) -> TrajectoryMeta:
    units = []
    for unit in meta.units:
        changed = change(unit) if unit.field_name == field else unit
        if changed is not None:
            units.append(changed)
    return dataclasses.replace(meta, units=tuple(units))


def _header(unit: UnitRef, dtype: DType, shape: tuple[int, ...]) -> UnitHeader:
    return dataclasses.replace(unit.header, dtype=dtype, shape=shape,
                               byte_length=math.prod(shape) * dtype.itemsize, content_hash=digest(f"{unit.key}!"))


def routing_dtype(meta: TrajectoryMeta) -> TrajectoryMeta:
    return _replace_unit(meta, "routing", lambda u: dataclasses.replace(
        u, header=_header(u, DType.INT32, u.header.shape)))


def routing_width(meta: TrajectoryMeta) -> TrajectoryMeta:
    return _replace_unit(meta, "routing", lambda u: dataclasses.replace(
        u, header=_header(u, u.header.dtype, (u.header.shape[0], ROUTING * 2))))


def routing_missing(meta: TrajectoryMeta) -> TrajectoryMeta:
    return _replace_unit(meta, "routing", lambda u: None)


def extra_field(meta: TrajectoryMeta) -> TrajectoryMeta:
    tokens = meta.num_tokens
    extra = UnitRef(key=f"{meta.trajectory_id}/logprobs", field_name="logprobs", kind=UnitKind.TOKEN_FIELD,
                    header=UnitHeader(dtype=DType.FLOAT32, shape=(tokens,), byte_length=4 * tokens,
                                      content_hash=digest("logprobs"), seq_axis=0))
    return dataclasses.replace(meta, units=(*meta.units, extra))


def stats_dtype(meta: TrajectoryMeta) -> TrajectoryMeta:
    return _replace_unit(meta, "stats", lambda u: dataclasses.replace(
        u, header=_header(u, DType.FLOAT64, u.header.shape)))


def routing_not_per_token(meta: TrajectoryMeta) -> TrajectoryMeta:
    return _replace_unit(meta, "routing", lambda u: dataclasses.replace(
        u, kind=UnitKind.FIELD, header=dataclasses.replace(u.header, seq_axis=None)))


def scalar_not_a_tensor_name(meta: TrajectoryMeta) -> TrajectoryMeta:
    return dataclasses.replace(meta, scalars=(("reward/model", 1.0),))


def _unit_index(meta: TrajectoryMeta, field: str) -> int:
    return next(i for i, unit in enumerate(meta.units) if unit.field_name == field)


INCONSISTENT = {
    # name: (change, the field the error names, given the good trajectory's metadata)
    "token-field-dtype": (routing_dtype, lambda m: f"units[{_unit_index(m, 'routing')}].header.dtype"),
    "token-field-trailing-shape": (routing_width, lambda m: f"units[{_unit_index(m, 'routing')}].header.shape"),
    "token-field-missing": (routing_missing, lambda m: "units"),
    "extra-field": (extra_field, lambda m: f"units[{len(m.units)}].field_name"),
    "non-sequence-field-dtype": (stats_dtype, lambda m: f"units[{_unit_index(m, 'stats')}].header.dtype"),
    "field-kind": (routing_not_per_token, lambda m: f"units[{_unit_index(m, 'routing')}].kind"),
    "scalar-name": (scalar_not_a_tensor_name, lambda m: "scalars"),
}


@pytest.mark.parametrize("columnar", [True, False], ids=["batch", "messages"])
@pytest.mark.parametrize("kind", sorted(INCONSISTENT))
def test_an_inconsistent_report_is_refused_at_ingest_naming_the_field(stack: Stack, kind: str,
                                                                      columnar: bool) -> None:
    change, expected_field = INCONSISTENT[kind]
    good, _ = stack.write()
    bad = change(dataclasses.replace(good, trajectory_id=f"{good.trajectory_id}-bad"))
    # Second in its report, after a good trajectory: the whole report is refused, naming the bad one.
    other, _ = stack.write()
    with pytest.raises(InvalidArgument) as caught:
        stack.report([other, bad], columnar=columnar)
    assert caught.value.field == f"trajectories[1].{expected_field(good)}", caught.value
    assert stack.client.status().pool_size == 0  # nothing of the refused report was applied
    stack.check_serves_next()


# ---- scalar sets may differ ------------------------------------------------------------------------------------


def test_trajectories_with_different_scalar_sets_are_packed_with_a_presence_mask(stack: Stack) -> None:
    with_reward, _ = stack.write(scalars={"reward": 0.25, "advantage": -1.5})
    without, _ = stack.write(scalars={})
    stack.report([with_reward, without])
    _, micros = stack.consume()
    values: dict[str, dict[str, tuple[float, int]]] = {}
    for micro in micros:
        tensors = micro["tensors"]
        for i, trajectory_id in enumerate(micro["trajectory_ids"]):
            values[trajectory_id] = {
                name: (float(tensors[f"scalar.{name}"][i]), int(tensors[f"scalar_present.{name}"][i]))
                for name in ("reward", "advantage")
            }
    assert values[with_reward.trajectory_id] == {"reward": (0.25, 1), "advantage": (-1.5, 1)}
    missing = values[without.trajectory_id]
    assert all(math.isnan(value) and present == 0 for value, present in missing.values())
    stack.check_serves_next()


# ---- units damaged after they were acknowledged ----------------------------------------------------------------


def delete(path: Path) -> None:
    path.unlink()


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def grow(path: Path) -> None:
    path.write_bytes(path.read_bytes() + b"\x00" * 64)


DAMAGE = {
    "token-field-deleted": ("routing", delete),
    "token-field-truncated": ("routing", truncate),
    "non-sequence-field-deleted": ("stats", delete),
    "non-sequence-field-truncated": ("stats", truncate),
    "non-sequence-field-grown": ("stats", grow),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_a_damaged_unit_fails_its_minibatch_with_a_typed_error_and_the_sidecar_goes_on(stack: Stack,
                                                                                      kind: str) -> None:
    field, damage = DAMAGE[kind]
    victim, _ = stack.write()
    key = next(unit.key for unit in victim.units if unit.field_name == field)
    damage(stack.unit_path(key))
    before = stack.client.status().failed_minibatches
    partner, _ = stack.write()
    stack.report([victim, partner])

    with pytest.raises(MiniBatchFailed) as caught:
        stack.consume()
    assert caught.value.trajectory_id == victim.trajectory_id, caught.value
    assert caught.value.unit_key == key, caught.value

    status = stack.client.status()
    assert status.failed_minibatches == before + 1
    failure = status.recent_failures[-1]
    assert (failure.trajectory_id, failure.unit_key) == (victim.trajectory_id, key)
    assert failure.consumer.role == "backbone"
    assert stack.sidecar.alive(), stack.sidecar.tail()
    stack.check_serves_next()
