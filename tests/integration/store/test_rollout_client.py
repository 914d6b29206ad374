"""RolloutClient.submit: split trajectories into units, write them in batches, return typed metadata."""

import numpy as np
import pytest

from knittrans.errors import InvalidArgument
from knittrans.rollout import MultimodalInput, RolloutClient, Trajectory
from knittrans.store.arrays import view_unit
from knittrans.store.keys import trajectory_unit_key
from knittrans.types import TokenSpan, TrajectoryId, TrajectoryMeta, UnitKey, UnitKind, VersionSegment


class RecordingReporter:
    def __init__(self) -> None:
        self.reports: list[list[TrajectoryMeta]] = []

    def report(self, trajectories) -> None:
        self.reports.append(list(trajectories))


def trajectory_fields(length: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    mask = np.zeros(length, dtype=bool)
    mask[length // 4 :] = True
    return {
        "input_ids": rng.integers(0, 50_000, size=length, dtype=np.int64),
        "logprobs": rng.standard_normal(length).astype(np.float32),
        "loss_mask": mask,
        "routing": rng.integers(0, 64, size=(length, 4, 2), dtype=np.uint8),
        "ref_lens": np.array([3, 5, 7], dtype=np.int32),
        "reward": 0.5,
        "advantage": np.float32(-1.25),
    }


def read_unit(store, ref) -> np.ndarray:
    buffer = bytearray(ref.header.byte_length)
    store.get_into(ref.key, buffer)
    return view_unit(buffer, ref.header)


def submit(client, fields, tid, sample="s1", **overrides):
    values = dict(trajectory_id=tid, sample_id=sample, source="math", rollout_step=3,
                  segments=[VersionSegment(version=7, num_tokens=10)])
    values.update(overrides)
    return client.submit(fields, **values)


def test_submit_splits_writes_and_returns_metadata(unit_store, prefix):
    reporter = RecordingReporter()
    client = RolloutClient(unit_store, namespace=prefix, reporter=reporter)
    fields = trajectory_fields(200)
    image = np.random.default_rng(5).integers(0, 255, size=(3, 32, 32), dtype=np.uint8)
    meta = submit(client, fields, "t1", multimodal=[
        MultimodalInput(data=image, encoder="vit", cost=16.0, placeholder=TokenSpan(start=10, end=26))])
    assert reporter.reports == [[meta]]
    assert meta.num_tokens == 200 and meta.num_loss_tokens == 150
    assert dict(meta.scalars) == {"reward": 0.5, "advantage": -1.25}
    kinds = {u.field_name: u.kind for u in meta.units}
    assert kinds == {"input_ids": UnitKind.TOKEN_FIELD, "logprobs": UnitKind.TOKEN_FIELD,
                     "loss_mask": UnitKind.TOKEN_FIELD, "routing": UnitKind.TOKEN_FIELD, "ref_lens": UnitKind.FIELD}
    for ref in meta.units:
        np.testing.assert_array_equal(read_unit(unit_store, ref), fields[ref.field_name])
    [mm] = meta.multimodal
    assert mm.key.startswith(f"{prefix}/s/s1/mm/") and mm.header.content_hash in mm.key
    np.testing.assert_array_equal(read_unit(unit_store, mm), image)
    # a token slice of a per-token field is one contiguous byte range
    routing = next(u for u in meta.units if u.field_name == "routing")
    span = TokenSpan(start=50, end=60)
    buffer = bytearray(routing.header.byte_range(span).length)
    unit_store.get_into(routing.key, buffer, [routing.header.byte_range(span)])
    np.testing.assert_array_equal(view_unit(buffer, routing.header, num_tokens=10), fields["routing"][50:60])


def test_a_group_stores_its_shared_image_once(unit_store, prefix):
    image = np.full((3, 8, 8), 9, dtype=np.uint8)
    mm = MultimodalInput(data=image, encoder="vit", cost=4.0, placeholder=TokenSpan(start=0, end=4))
    first_worker = RolloutClient(unit_store, namespace=prefix)
    second_worker = RolloutClient(unit_store, namespace=prefix)
    metas = [submit(w, trajectory_fields(40, seed=i), f"g-{i}", sample="g", multimodal=[mm])
             for i, w in enumerate([first_worker, first_worker, second_worker, second_worker])]
    keys = {m.multimodal[0].key for m in metas}
    assert len(keys) == 1
    assert unit_store.exists(list(keys)) == [True]


def test_torch_tensors_are_accepted(unit_store, prefix):
    torch = pytest.importorskip("torch")
    fields = {
        "input_ids": torch.arange(64),
        "logprobs": torch.linspace(-1, 0, 64, dtype=torch.bfloat16),
        "loss_mask": torch.ones(64, dtype=torch.bool),
        "reward": torch.tensor(1.0),
    }
    meta = RolloutClient(unit_store, namespace=prefix).submit(
        fields, trajectory_id="tt", sample_id="s", source="code", rollout_step=0,
        segments=[VersionSegment(version=0, num_tokens=64)])
    logprobs = next(u for u in meta.units if u.field_name == "logprobs")
    assert logprobs.header.dtype == "bfloat16"
    raw = read_unit(unit_store, logprobs)
    assert raw.tobytes() == fields["logprobs"].view(torch.int16).numpy().tobytes()
    assert dict(meta.scalars) == {"reward": 1.0}


def test_submit_many_writes_several_trajectories_in_shared_batches(unit_store, prefix):
    client = RolloutClient(unit_store, namespace=prefix, batch_bytes=4096)
    trajectories = [
        Trajectory(trajectory_id=f"m{i}", sample_id="s", source="math", rollout_step=1,
                   segments=[VersionSegment(version=1, num_tokens=100)], fields=trajectory_fields(100, seed=i))
        for i in range(3)
    ]
    metas = client.submit_many(trajectories)
    assert [m.trajectory_id for m in metas] == ["m0", "m1", "m2"]
    keys = [u.key for m in metas for u in m.units]
    assert unit_store.exists(keys) == [True] * len(keys)


def would_be_keys(prefix: str, tid: str) -> list[UnitKey]:
    return [trajectory_unit_key(prefix, TrajectoryId(tid), f) for f in ("input_ids", "logprobs", "loss_mask",
                                                                           "routing", "ref_lens", "bad")]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda f: f.update(bad=np.zeros(3, dtype=np.complex64)), "trajectories[0].fields.bad"),
        (lambda f: f.update(bad=np.zeros(3, dtype=np.uint64)), "trajectories[0].fields.bad"),
        (lambda f: f.update(bad=["not", "an", "array"]), "trajectories[0].fields.bad"),
        (lambda f: f.update(bad=np.zeros((0, 3), dtype=np.float32)), "trajectories[0].fields.bad"),
        (lambda f: f.update(loss_mask=np.ones(7, dtype=bool)), "trajectories[0].fields.loss_mask"),
        (lambda f: f.pop("input_ids"), "trajectories[0].fields.input_ids"),
        (lambda f: f.pop("loss_mask"), "trajectories[0].fields.loss_mask"),
        (lambda f: f.update({"bad/name": np.zeros(3)}), "trajectories[0].fields.bad/name"),
        (lambda f: f.update(bad=float("nan")), "trajectories[0].fields.bad"),
    ],
)
def test_bad_input_is_rejected_before_anything_is_written(unit_store, prefix, change, field):
    reporter = RecordingReporter()
    fields = trajectory_fields(50)
    change(fields)
    with pytest.raises(InvalidArgument) as excinfo:
        submit(RolloutClient(unit_store, namespace=prefix, reporter=reporter), fields, "bad-1")
    assert excinfo.value.field == field
    assert unit_store.exists(would_be_keys(prefix, "bad-1")) == [False] * 6
    assert reporter.reports == []


def test_bad_metadata_is_rejected_before_anything_is_written(unit_store, prefix):
    client = RolloutClient(unit_store, namespace=prefix)
    fields = trajectory_fields(50)
    with pytest.raises(InvalidArgument, match="segments"):
        submit(client, fields, "bad-2", segments=[VersionSegment(version=1, num_tokens=51)])
    with pytest.raises(InvalidArgument) as excinfo:
        outside = TokenSpan(start=45, end=55)
        submit(client, fields, "bad-2", multimodal=[
            MultimodalInput(data=np.ones(4, np.uint8), encoder="vit", cost=1.0, placeholder=outside)])
    assert excinfo.value.field == "trajectories[0].multimodal[0].placeholder"
    with pytest.raises(InvalidArgument, match="twice"):
        client.submit_many([
            Trajectory(trajectory_id="dup", sample_id="s", source="m", rollout_step=0, fields=trajectory_fields(10),
                       segments=[VersionSegment(version=0, num_tokens=5)]),
        ] * 2)
    assert unit_store.exists(would_be_keys(prefix, "bad-2") + would_be_keys(prefix, "dup")) == [False] * 12
