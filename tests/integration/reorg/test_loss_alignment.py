"""A mini-batch submitted through ``RolloutClient``, reported in the columnar form, checked at ingest, planned by
the service's dispatch, read from a real file store and packed by the sidecar's packer trains exactly like the
textbook causal-LM loss over the whole trajectories (``logits[:, :-1]`` against ``input_ids[:, 1:]``, masked on
the response tokens), whichever way the rollout aligned its loss mask and per-target fields.

The model is a tiny embedding + linear head that nothing in KnitTrans knows about; since it looks at one token
at a time, the CP split and the packing cannot change its logits, only which targets and weights meet them.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.admission.planning import plan_minibatch
from knittrans.admission.service.assignments import MiniBatchDispatch, gather_rows
from knittrans.admission.service.ingest.rules import IngestLimits, check_columns
from knittrans.admission.service.trajectory_columns import TrajectoryColumns
from knittrans.errors import InvalidArgument
from knittrans.plan.rank_proto import consumer_assignment_from_rank_proto
from knittrans.reorg.packing import LABELS, PackSettings, backbone_layout, fill_backbone, tensor_view
from knittrans.reorg.reader import MicroBatchReader
from knittrans.rollout import RolloutClient
from knittrans.store.file import FileUnitStore
from knittrans.types import BackboneTopology, ConsumerId, FieldAlignment, Topology, TrajectoryMeta, VersionSegment
from knittrans.v1 import plan_pb2
from knittrans.wire.columns import batch_from_metas

VOCAB = 53
WIDTH = 6
IGNORE = -100
PACK = PackSettings(pad_token_id=5, label_ignore_index=IGNORE, pack_multiple=8)
LIMITS = IngestLimits(sources={"math"}, encoders=())


@dataclass(frozen=True, kw_only=True)
class Rollout:
    """One trajectory as the rollout engine sees it: tokens, where the response starts, per-token advantages."""

    trajectory_id: str
    input_ids: np.ndarray
    prompt_tokens: int
    advantages: np.ndarray  # float32, one per token; only response tokens' values matter

    @property
    def response(self) -> np.ndarray:
        """verl's ``response_mask``, over the whole sequence: 1 on each response token itself."""
        return (np.arange(len(self.input_ids)) >= self.prompt_tokens).astype(np.uint8)


def rollouts(seed: int, count: int) -> list[Rollout]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        length = int(rng.integers(2, 70))
        out.append(Rollout(
            trajectory_id=f"t{i}",
            input_ids=rng.integers(0, VOCAB, size=length, dtype=np.int32),
            prompt_tokens=int(rng.integers(1, length)),  # at least one prompt and one response token
            advantages=rng.standard_normal(length).astype(np.float32),
        ))
    return out


def label_aligned(values: np.ndarray) -> np.ndarray:
    """What the rollout would hold label-aligned: position t carries what concerns token t+1."""
    shifted = np.zeros_like(values)
    shifted[:-1] = values[1:]
    return shifted


# How a user submits the same rollout: (fields, submit keyword arguments, whether advantages weight the loss).
MODES = ("verl default", "token", "label", "no mask")


def submission(rollout: Rollout, mode: str) -> tuple[dict, dict, bool]:
    ids = rollout.input_ids
    response = rollout.response
    advantages = (rollout.advantages * response).astype(np.float32)
    if mode == "verl default":  # verl's response mask passed straight in, nothing declared
        return {"input_ids": ids, "loss_mask": response}, {}, False
    if mode == "token":
        return ({"input_ids": ids, "loss_mask": response, "advantages": advantages},
                {"field_alignment": {"loss_mask": "token", "advantages": "token"}}, True)
    if mode == "label":
        return ({"input_ids": ids, "loss_mask": label_aligned(response), "advantages": label_aligned(advantages)},
                {"field_alignment": {"loss_mask": "label", "advantages": "label"}}, True)
    assert mode == "no mask"
    return {"input_ids": ids}, {"loss_mask_field": None}, False


def submit_all(store: FileUnitStore, items: list[Rollout], mode: str) -> tuple[list[TrajectoryMeta], bool]:
    client = RolloutClient(store, namespace="align")
    metas = []
    weighted = False
    for rollout in items:
        fields, extra, weighted = submission(rollout, mode)
        metas.append(client.submit(
            fields, trajectory_id=rollout.trajectory_id, sample_id=f"s-{rollout.trajectory_id}", source="math",
            rollout_step=0, segments=(VersionSegment(version=0, num_tokens=len(rollout.input_ids)),), finished_at=0.0,
            **extra,
        ))
    return metas, weighted


# ---- the naive reference -----------------------------------------------------------------------------------------


class TinyLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH, dtype=torch.float64)
        self.head = torch.nn.Linear(WIDTH, VOCAB, dtype=torch.float64)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(input_ids)))


def naive_loss(model: TinyLM, items: list[Rollout], *, masked: bool, weighted: bool) -> tuple[torch.Tensor, int]:
    """The textbook causal-LM loss, one whole sequence at a time: the logits at t predict token t+1."""
    total = torch.zeros((), dtype=torch.float64)
    count = 0
    for rollout in items:
        ids = torch.from_numpy(rollout.input_ids.astype(np.int64))[None]
        logits = model(ids)
        losses = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1), reduction="none")
        targets = torch.from_numpy(rollout.response[1:].astype(bool)) if masked else torch.ones(len(losses), dtype=bool)
        weights = torch.from_numpy(rollout.advantages[1:].astype(np.float64)) if weighted else 1.0
        total = total + (losses * weights * targets).sum()
        count += int(targets.sum())
    return total / count, count


# ---- the packed mini-batch ---------------------------------------------------------------------------------------


def dispatch_of(metas: list[TrajectoryMeta], topology: Topology) -> MiniBatchDispatch:
    """The admission service's path: a columnar report, checked at ingest, planned and split per consumer."""
    columns = TrajectoryColumns.from_proto(batch_from_metas(metas))
    check_columns(columns, LIMITS, 0, max_batch=len(metas))
    return MiniBatchDispatch(gather_rows([(columns, i) for i in range(len(metas))]), topology, ("input_ids",))


def packed_step(model: TinyLM, store: FileUnitStore, dispatch: MiniBatchDispatch, topology: Topology,
                *, weighted: bool) -> tuple[float, int]:
    """Every consumer's micro-batches as its sidecar packs them; each micro-batch's loss, normalised by the
    mini-batch's global loss-token count, is backpropagated on its own (gradient accumulation over micro-batches,
    summed over DP and CP ranks as their all-reduce would). Returns the loss and the loss positions counted."""
    cp = topology.backbone.cp
    reader = MicroBatchReader(store)
    loss, counted = 0.0, 0
    for dp_rank in range(topology.backbone.dp):
        for cp_rank in range(cp):
            consumer = ConsumerId(role="backbone", dp_rank=dp_rank, cp_rank=cp_rank)
            rank = plan_pb2.RankAssignment(**dispatch.rank_fields(dp_rank))  # what the sidecar receives
            assignment = consumer_assignment_from_rank_proto(rank, consumer)
            for micro in assignment.microbatches:
                layout = backbone_layout(micro, cp=cp, settings=PACK)
                slot = np.zeros(max(layout.used_bytes, 1), dtype=np.uint8)
                reader.read(layout, slot)
                fill_backbone(layout, micro, slot, reader.scratch(layout.scratch_bytes), settings=PACK)
                tensors = {spec.name: torch.from_numpy(tensor_view(slot, spec).copy()) for spec in layout.tensors}
                labels = tensors[LABELS]
                selected = (labels != IGNORE) & (tensors["loss_mask"] != 0)
                logits = model(tensors["input_ids"].long())
                losses = F.cross_entropy(logits, torch.where(selected, labels, 0), reduction="none")
                weights = tensors["advantages"].double() if weighted else 1.0
                micro_loss = (losses * weights * selected).sum() / dispatch.minibatch_loss_tokens
                micro_loss.backward()
                loss += float(micro_loss.detach())
                counted += int(selected.sum())
    reader.close()
    return loss, counted


def gradients(model: TinyLM) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("cp", [1, 2])
@pytest.mark.parametrize("mode", MODES)
def test_packed_cp_split_loss_and_gradient_equal_the_naive_causal_lm_loss(mode: str, cp: int, tmp_path) -> None:
    items = rollouts(seed=11 + cp, count=9)
    store = FileUnitStore(tmp_path)
    metas, weighted = submit_all(store, items, mode)
    topology = Topology(backbone=BackboneTopology(dp=2, cp=cp, max_tokens_per_microbatch=64))
    dispatch = dispatch_of(metas, topology)

    torch.manual_seed(0)
    model = TinyLM()
    expected, naive_count = naive_loss(model, items, masked=mode != "no mask", weighted=weighted)
    expected.backward()
    expected_grads = gradients(model)
    model.zero_grad()
    loss, counted = packed_step(model, store, dispatch, topology, weighted=weighted)
    store.close()

    assert dispatch.minibatch_loss_tokens == naive_count, "global_loss_tokens counts the positions the loss uses"
    assert counted == naive_count, "the packed labels and loss mask select exactly the naive targets"
    assert loss == pytest.approx(float(expected.detach()), rel=1e-5)
    for got, want in zip(gradients(model), expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), count=st.integers(1, 12), mode=st.sampled_from(MODES))
def test_global_loss_tokens_equal_the_naive_count(seed: int, count: int, mode: str) -> None:
    items = rollouts(seed, count)
    with tempfile.TemporaryDirectory() as root:
        store = FileUnitStore(root)
        metas, _ = submit_all(store, items, mode)
        store.close()
    masked = mode != "no mask"
    naive = sum(int(r.response[1:].sum()) if masked else len(r.input_ids) - 1 for r in items)
    plan = plan_minibatch(metas, Topology(backbone=BackboneTopology(dp=2, cp=2, max_tokens_per_microbatch=64)))
    assert plan.backbone.minibatch_loss_tokens == naive
    assert sum(m.num_loss_tokens for m in metas) == naive


# ---- declaring alignments at submit -----------------------------------------------------------------------------


def test_units_carry_the_declared_alignment_and_the_loss_mask_defaults_to_token(tmp_path) -> None:
    store = FileUnitStore(tmp_path)
    client = RolloutClient(store, namespace="align")
    rng = np.random.default_rng(0)
    fields = {"input_ids": rng.integers(0, VOCAB, 12, dtype=np.int32), "loss_mask": np.ones(12, np.uint8),
              "old_log_probs": rng.standard_normal(12).astype(np.float32), "routing": np.zeros((12, 2), np.uint8),
              "stats": np.zeros(3, np.float32)}
    common = dict(sample_id="s", source="math", rollout_step=0, segments=(VersionSegment(version=0, num_tokens=6),))
    default = client.submit(fields, trajectory_id="a", **common)
    declared = client.submit(fields, trajectory_id="b", **common,
                             field_alignment={"loss_mask": "label", "old_log_probs": "token"})
    store.close()
    alignment = {u.field_name: u.alignment for u in default.units}
    assert alignment == {"input_ids": None, "loss_mask": FieldAlignment.TOKEN, "old_log_probs": None,
                         "routing": None, "stats": None}
    assert {u.field_name: u.alignment for u in declared.units} == dict(
        alignment, loss_mask=FieldAlignment.LABEL, old_log_probs=FieldAlignment.TOKEN)
    assert (default.num_loss_tokens, declared.num_loss_tokens) == (11, 11)  # the last token predicts nothing


@pytest.mark.parametrize(
    ("field_alignment", "extra", "field"),
    [
        ({"logprobs": "token"}, {}, "trajectories[0].field_alignment.logprobs"),  # not a field
        ({"input_ids": "token"}, {}, "trajectories[0].field_alignment.input_ids"),  # the tokens field
        ({"stats": "label"}, {}, "trajectories[0].field_alignment.stats"),  # not per-token
        ({"loss_mask": "label"}, {"non_sequence_fields": ("loss_mask",)}, "trajectories[0].field_alignment.loss_mask"),
        ({"loss_mask": "shifted"}, {}, "trajectories[0].field_alignment.loss_mask"),  # not an alignment
        ({"loss_mask": 1}, {}, "trajectories[0].field_alignment.loss_mask"),
    ],
)
def test_a_bad_declaration_is_named_and_nothing_is_written(field_alignment, extra, field, tmp_path) -> None:
    store = FileUnitStore(tmp_path)
    client = RolloutClient(store, namespace="align")
    fields = {"input_ids": np.arange(8, dtype=np.int32), "loss_mask": np.ones(8, np.uint8),
              "stats": np.zeros(3, np.float32)}
    with pytest.raises(InvalidArgument) as info:
        client.submit(fields, trajectory_id="t", sample_id="s", source="math", rollout_step=0,
                      segments=(VersionSegment(version=0, num_tokens=4),), field_alignment=field_alignment, **extra)
    assert info.value.field == field
    assert not any((tmp_path / "units").iterdir())
    store.close()
