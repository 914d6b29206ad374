"""A job's declared trajectory schema (DESIGN.md §10), through the real stack: ``knittrans admission serve`` with
a ``schema:`` in its config, one ``knittrans reorg serve`` sidecar on a file store, and a real
:class:`TrainerClient` (dp = cp = tp = 1, two trajectories a mini-batch).

- every valid report (float, int and bool scalars, str, bytes and JSON metadata, optional ones left out, either
  report form) reaches the trainer exactly: scalars in ``scalar.<name>`` tensors of their kind with presence
  masks, metadata in ``MicroBatch.metadata`` aligned with the trajectory ids;
- every report that breaks the schema is refused at ingest with INVALID_ARGUMENT naming the field, and the stack
  then serves the next mini-batch intact.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from knittrans.client.admission import AdmissionClient
from knittrans.client.connection import ConnectionSettings
from knittrans.errors import InvalidArgument
from knittrans.rollout import RolloutClient
from knittrans.store.factory import open_store
from knittrans.trainer import TrainerClient, TrainerSettings
from knittrans.types import TrajectoryMeta, VersionSegment
from knittrans.values import INT64_MAX, INT64_MIN, MetadataKind, MetadataValue, TrajectoryValues

from .processes import start_admission, start_sidecar

TOPOLOGY = {"backbone": {"dp": 1, "cp": 1, "tp": 1, "max_tokens_per_microbatch": 4096}}
SCHEMA = {
    "token_fields": {"input_ids": {"dtype": "int32"}, "loss_mask": {"dtype": "uint8"}},
    "fields": {"stats": {"dtype": "float32"}},
    "scalars": {"reward": {"kind": "float"}, "index": {"kind": "int"}, "correct": {"kind": "bool", "required": False}},
    "metadata": {
        "uid": {"kind": "str", "max_bytes": 64},
        "ground_truth": {"kind": "json", "max_bytes": 512, "required": False},
        "blob": {"kind": "bytes", "max_bytes": 48, "required": False},
    },
}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@st.composite
def trajectory_values(draw: st.DrawFn) -> dict[str, Any]:
    """The values one valid trajectory reports under SCHEMA."""
    values: dict[str, Any] = {
        "reward": draw(st.floats(allow_nan=False, allow_infinity=False)),
        "index": draw(st.integers(INT64_MIN, INT64_MAX)),
        "uid": draw(st.text(max_size=64).filter(lambda s: len(s.encode()) <= 64)),
    }
    if draw(st.booleans()):
        values["correct"] = draw(st.booleans())
    if draw(st.booleans()):
        values["ground_truth"] = draw(json_values.filter(
            lambda v: len(json.dumps(v, sort_keys=True, separators=(",", ":"))) <= 512))
    if draw(st.booleans()):
        values["blob"] = draw(st.binary(max_size=48))
    return values


@dataclasses.dataclass
class Stack:
    client: AdmissionClient
    rollout: RolloutClient
    minibatches: Iterator
    counter: Iterator[int]

    def write(self, values: dict[str, Any]) -> tuple[TrajectoryMeta, dict[str, np.ndarray]]:
        index = next(self.counter)
        rng = np.random.default_rng(index)
        length = 5 + index % 9
        fields = {"input_ids": rng.integers(1, 50_000, length, dtype=np.int32),
                  "loss_mask": np.ones(length, dtype=np.uint8), "stats": rng.random(3).astype(np.float32)}
        metadata = {name: values[name] for name in ("uid", "blob") if name in values}
        if "ground_truth" in values:  # declared json: a str ground truth is JSON text too, not a str value
            metadata["ground_truth"] = MetadataValue(kind=MetadataKind.JSON, value=json.dumps(values["ground_truth"]))
        meta = self.rollout.submit(
            fields, trajectory_id=f"t{index}", sample_id=f"s{index}", source="A", rollout_step=0,
            segments=(VersionSegment(version=0, num_tokens=length),), non_sequence_fields=("stats",),
            scalars={"reward": values["reward"]}, int_scalars={"index": values["index"]},
            bool_scalars={"correct": values["correct"]} if "correct" in values else None, metadata=metadata,
        )
        return meta, fields

    def round_trip(self, batch: list[dict[str, Any]], *, columnar: bool) -> None:
        """Submit and report the trajectories, then check what the trainer receives, byte for byte."""
        written = [self.write(values) for values in batch]
        self.client.report([meta for meta, _ in written], columnar=columnar)
        expected = {meta.trajectory_id: (values, fields) for (meta, fields), values in zip(written, batch, strict=True)}
        seen = []
        for micro in next(self.minibatches):
            tensors = {name: tensor.numpy().copy() for name, tensor in micro.tensors.items()}
            metadata = micro.metadata
            assert tensors["scalar.reward"].dtype == np.float64
            assert tensors["scalar.index"].dtype == np.int64
            cu = tensors["cu_seqlens"]
            for i, trajectory_id in enumerate(micro.trajectory_ids):
                values, fields = expected[trajectory_id]
                rows = slice(int(cu[i]), int(cu[i]) + len(fields["input_ids"]))
                np.testing.assert_array_equal(tensors["input_ids"][rows], fields["input_ids"])
                np.testing.assert_array_equal(tensors["stats"][i], fields["stats"])
                assert tensors["scalar.reward"][i] == values["reward"]
                assert int(tensors["scalar.index"][i]) == values["index"]
                if "scalar.correct" in tensors:
                    assert tensors["scalar.correct"].dtype == np.bool_
                    assert bool(tensors["scalar_present.correct"][i]) == ("correct" in values)
                    if "correct" in values:
                        assert bool(tensors["scalar.correct"][i]) == values["correct"]
                else:
                    assert "correct" not in values
                assert metadata["uid"][i] == values["uid"]
                for name in ("ground_truth", "blob"):
                    column = metadata.get(name)
                    assert (None if column is None else column[i]) == values.get(name)
                seen.append(trajectory_id)
        assert sorted(seen) == sorted(expected)


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    directory = tmp_path_factory.mktemp("schema")
    job = f"sc{uuid.uuid4().hex[:8]}"
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
        yield Stack(client=client, rollout=RolloutClient(store, namespace=job), minibatches=trainer.mini_batches(),
                    counter=itertools.count())
        trainer.close()
        client.close()
        store.close()
    finally:
        if sidecar is not None:
            sidecar.stop()
        admission.stop()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(trajectory_values(), min_size=2, max_size=2), columnar=st.booleans())
def test_every_valid_report_reaches_the_trainer_exactly(stack: Stack, batch: list[dict[str, Any]],
                                                         columnar: bool) -> None:
    stack.round_trip(batch, columnar=columnar)


GOOD = {"reward": 1.0, "index": 3, "uid": "u"}


def _with_values(meta: TrajectoryMeta, *, scalars: dict | None = None, ints: dict | None = None,
                 bools: dict | None = None, metadata: dict | None = None) -> TrajectoryMeta:
    old = meta.values
    return dataclasses.replace(
        meta,
        scalars=tuple((scalars if scalars is not None else dict(meta.scalars)).items()),
        values=TrajectoryValues(
            int_scalars=tuple((ints if ints is not None else dict(old.int_scalars)).items()),
            bool_scalars=tuple((bools if bools is not None else dict(old.bool_scalars)).items()),
            metadata=tuple((metadata if metadata is not None else dict(old.metadata)).items())))


_TEXT = MetadataValue(kind=MetadataKind.STR, value="u")
# (how the second trajectory of a report breaks the schema, the field the error must name)
BREAKS = {
    "missing required float": (dict(scalars={}), "trajectories[1].scalars"),
    "missing required int": (dict(ints={}), "trajectories[1].values.int_scalars"),
    "missing required metadata": (dict(metadata={}), "trajectories[1].values.metadata"),
    "undeclared float": (dict(scalars={"reward": 1.0, "extra": 2.0}), "trajectories[1].scalars.extra"),
    "int as float": (dict(scalars={"reward": 1.0, "index": 3.0}, ints={}), "trajectories[1].scalars.index"),
    "float as int": (dict(scalars={}, ints={"index": 3, "reward": 1}), "trajectories[1].values.int_scalars.reward"),
    "bool as int": (dict(ints={"index": 3, "correct": 1}), "trajectories[1].values.int_scalars.correct"),
    "undeclared metadata": (dict(metadata={"uid": _TEXT, "note": _TEXT}), "trajectories[1].values.metadata.note"),
    "metadata of another kind": (dict(metadata={"uid": MetadataValue(kind=MetadataKind.BYTES, value=b"u")}),
                                 "trajectories[1].values.metadata.uid"),
    "metadata over its bound": (dict(metadata={"uid": MetadataValue(kind=MetadataKind.STR, value="é" * 33)}),
                                "trajectories[1].values.metadata.uid"),
    "json over its bound": (dict(metadata={"uid": _TEXT, "ground_truth": MetadataValue.of(["x" * 600])}),
                            "trajectories[1].values.metadata.ground_truth"),
}


@pytest.mark.parametrize("columnar", [True, False], ids=["batch", "messages"])
@pytest.mark.parametrize("case", sorted(BREAKS))
def test_a_report_that_breaks_the_schema_is_refused_naming_the_field(stack: Stack, case: str, columnar: bool) -> None:
    change, field = BREAKS[case]
    good, _ = stack.write(GOOD)
    bad, _ = stack.write(GOOD)
    with pytest.raises(InvalidArgument) as caught:
        stack.client.report([good, _with_values(bad, **change)], columnar=columnar)
    assert caught.value.field == field, caught.value
    stack.round_trip([GOOD, {**GOOD, "index": -7, "uid": "v"}], columnar=columnar)  # nothing was applied
