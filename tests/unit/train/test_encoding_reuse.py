"""Single-process encoding reuse: gradients and an optimizer step equal the duplicated path.

The duplicated path is what training does without reuse: every use encodes a private copy of its image and
one joint backward runs through backbone and encoder per micro-batch.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import pytest
import torch
from torch import nn

from knittrans.demo.model import Backbone, BackboneConfig, EncoderConfig, VisionEncoder
from knittrans.demo.multimodal_batch import (
    PackedMicroBatch,
    SyntheticMinibatch,
    chunk,
    duplicated_features,
    feature_positions,
    make_grpo_minibatch,
    micro_batch_loss,
    pack_micro_batch,
    unique_keys,
)
from knittrans.errors import FailedPrecondition, InvalidArgument
from knittrans.train import EncoderMicroBatch, EncodingSchedule
from knittrans.train.reuse import GatheredEncodings, MinibatchEncodingReuse, Phase, train_minibatch
from knittrans.train.schedule import EncodingRoute, EncodingUse, RankSchedule

ENCODER = EncoderConfig(image_size=16, patch_size=4, dim=32, depth=2, heads=4, merge=2, out_dim=32)
BACKBONE = BackboneConfig(vocab_size=64, dim=32, depth=2, heads=4)
TOLERANCE = 2e-5  # relative to the largest gradient entry of each tensor; float32 round-off


def models(seed: int = 0) -> tuple[VisionEncoder, Backbone]:
    torch.manual_seed(seed)
    return VisionEncoder(ENCODER), Backbone(BACKBONE)


def minibatch(*, num_samples: int = 3, group_size: int = 4, repeat: bool = True) -> SyntheticMinibatch:
    return make_grpo_minibatch(
        num_samples=num_samples,
        group_size=group_size,
        images_per_sample=2,
        rows_per_image=ENCODER.num_rows,
        image_shape=(3, ENCODER.image_size, ENCODER.image_size),
        vocab_size=BACKBONE.vocab_size,
        repeat_image_in_response=repeat,
        seed=7,
    )


def micro_batches(batch: SyntheticMinibatch, per_micro_batch: int) -> list[PackedMicroBatch]:
    ids = [t.trajectory_id for t in batch.trajectories]
    return [pack_micro_batch(batch, ids[i : i + per_micro_batch]) for i in range(0, len(ids), per_micro_batch)]


def schedule_for(micros: Sequence[PackedMicroBatch], encoder_batch: int) -> EncodingSchedule:
    keys = unique_keys(micros)
    return EncodingSchedule.single_process(
        encoder_micro_batches=chunk(keys, encoder_batch),
        backbone_micro_batches=[m.uses for m in micros],
        num_rows=dict.fromkeys(keys, ENCODER.num_rows),
    )


def gradients(*modules: nn.Module) -> dict[str, torch.Tensor]:
    return {
        f"{i}.{name}": p.grad.clone()
        for i, module in enumerate(modules)
        for name, p in module.named_parameters()
        if p.grad is not None
    }


def parameters(*modules: nn.Module) -> dict[str, torch.Tensor]:
    return {
        f"{i}.{name}": p.detach().clone() for i, module in enumerate(modules) for name, p in module.named_parameters()
    }


def max_relative_difference(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    assert got.keys() == want.keys()
    return max(float((got[k] - want[k]).abs().max() / want[k].abs().max().clamp_min(1e-30)) for k in want)


def run_duplicated(
    encoder: VisionEncoder, backbone: Backbone, batch: SyntheticMinibatch, micros: Sequence[PackedMicroBatch]
) -> None:
    normalizer = batch.loss_tokens
    for micro in micros:
        features = duplicated_features(encoder, batch, micro.uses)
        micro_batch_loss(backbone, micro, features, feature_positions(micro.uses), normalizer).backward()


def run_deduplicated(
    encoder: nn.Module,
    backbone: Backbone,
    batch: SyntheticMinibatch,
    micros: Sequence[PackedMicroBatch],
    schedule: EncodingSchedule,
) -> list[torch.Tensor | None]:
    normalizer = batch.loss_tokens

    def step(gathered: GatheredEncodings) -> torch.Tensor:
        micro = micros[gathered.micro_batch]
        return micro_batch_loss(backbone, micro, gathered.features, gathered.positions, normalizer)

    losses, _ = train_minibatch(
        encoder=encoder,
        encoder_inputs=lambda m: torch.stack([batch.images[k] for k in m.keys]),
        backbone_step=step,
        schedule=schedule,
    )
    return losses


@pytest.mark.parametrize(
    ("per_micro_batch", "encoder_batch", "repeat"),
    [
        (1, 1, False),  # one trajectory per micro-batch: repeats only across micro-batches
        (3, 2, True),  # repeats inside micro-batches, inside trajectories and across micro-batches
        (5, 4, True),  # micro-batches straddle samples; encoder and backbone partitions differ
        (12, 6, False),  # the whole mini-batch in one backbone micro-batch
    ],
)
def test_gradients_equal_the_duplicated_path(per_micro_batch: int, encoder_batch: int, repeat: bool) -> None:
    batch = minibatch(repeat=repeat)
    micros = micro_batches(batch, per_micro_batch)
    schedule = schedule_for(micros, encoder_batch)
    assert len(schedule.routes) == 6 and schedule.num_uses == (36 if repeat else 24)

    encoder, backbone = models()
    run_duplicated(encoder, backbone, batch, micros)
    want = gradients(encoder, backbone)

    encoder, backbone = models()
    losses = run_deduplicated(encoder, backbone, batch, micros, schedule)
    got = gradients(encoder, backbone)

    assert len(want) == len(list(encoder.parameters())) + len(list(backbone.parameters()))
    assert max_relative_difference(got, want) < TOLERANCE
    assert len(losses) == len(micros) and all(loss is not None and loss.requires_grad is False for loss in losses)


def test_parameters_match_after_one_optimizer_step() -> None:
    batch = minibatch()
    micros = micro_batches(batch, 3)
    schedule = schedule_for(micros, 4)
    results = []
    for deduplicate in (False, True):
        encoder, backbone = models()
        optimizer = torch.optim.SGD(
            [*encoder.parameters(), *backbone.parameters()], lr=0.5, momentum=0.9, weight_decay=0.01
        )
        optimizer.zero_grad()
        if deduplicate:
            run_deduplicated(encoder, backbone, batch, micros, schedule)
        else:
            run_duplicated(encoder, backbone, batch, micros)
        optimizer.step()
        results.append(parameters(encoder, backbone))
    initial = parameters(*models())
    for key in initial:
        moved = float((results[0][key] - initial[key]).abs().max())
        assert moved > 1e-4 * float(initial[key].abs().max())
        assert float((results[1][key] - results[0][key]).abs().max()) <= 1e-6 * float(results[0][key].abs().max())


def test_step_may_run_backward_itself_and_text_only_micro_batches_work() -> None:
    batch = minibatch(repeat=False)
    ids = [t.trajectory_id for t in batch.trajectories]
    response_only = [list(range(batch.trajectory(i).prompt_tokens, batch.trajectory(i).num_tokens)) for i in ids[:2]]
    micros = [pack_micro_batch(batch, ids[:2], response_only), *micro_batches(batch, 4)]
    assert micros[0].uses == ()
    schedule = schedule_for(micros, 3)

    encoder, backbone = models()
    run_duplicated(encoder, backbone, batch, micros)
    want = gradients(encoder, backbone)

    encoder, backbone = models()

    def step(gathered: GatheredEncodings) -> None:
        micro = micros[gathered.micro_batch]
        loss = micro_batch_loss(backbone, micro, gathered.features, gathered.positions, batch.loss_tokens)
        loss.backward()

    losses, report = train_minibatch(
        encoder=encoder,
        encoder_inputs=lambda m: torch.stack([batch.images[k] for k in m.keys]),
        backbone_step=step,
        schedule=schedule,
    )
    assert losses == [None] * len(micros)
    assert report.encodings_computed == 6 and report.uses == 24
    assert max_relative_difference(gradients(encoder, backbone), want) < TOLERANCE


class ListOutput(nn.Module):
    """Returns one (rows, hidden) tensor per image, or one packed (sum rows, hidden) tensor."""

    def __init__(self, encoder: VisionEncoder, packed: bool) -> None:
        super().__init__()
        self.encoder = encoder
        self.packed = packed

    def forward(self, images: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
        encoded = self.encoder(images)
        return encoded.flatten(0, 1) if self.packed else list(encoded.unbind(0))


@pytest.mark.parametrize("packed", [False, True])
def test_encoder_may_return_a_list_or_packed_rows(packed: bool) -> None:
    batch = minibatch()
    micros = micro_batches(batch, 4)
    schedule = schedule_for(micros, 4)
    encoder, backbone = models()
    run_duplicated(encoder, backbone, batch, micros)
    want = gradients(encoder, backbone)
    encoder, backbone = models()
    run_deduplicated(ListOutput(encoder, packed), backbone, batch, micros, schedule)
    assert max_relative_difference(gradients(encoder, backbone), want) < TOLERANCE


def test_micro_batch_local_copies_are_released_before_the_next_micro_batch() -> None:
    batch = minibatch()
    micros = micro_batches(batch, 2)
    encoder, backbone = models()
    earlier: list[weakref.ref[torch.Tensor]] = []
    alive_at_step: list[int] = []

    def step(gathered: GatheredEncodings) -> torch.Tensor:
        alive_at_step.append(sum(ref() is not None for ref in earlier))
        earlier.append(weakref.ref(gathered.features))
        micro = micros[gathered.micro_batch]
        return micro_batch_loss(backbone, micro, gathered.features, gathered.positions, batch.loss_tokens)

    train_minibatch(
        encoder=encoder,
        encoder_inputs=lambda m: torch.stack([batch.images[k] for k in m.keys]),
        backbone_step=step,
        schedule=schedule_for(micros, 3),
    )
    assert alive_at_step == [0] * len(micros)


class WithNorm(nn.Module):
    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 4, stride=4)
        self.norm = norm
        self.out = nn.Linear(8, 32)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(self.conv(images)).flatten(2).transpose(1, 2))


class Marked(nn.Module):
    knittrans_cross_sample_state = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


@pytest.mark.parametrize(
    ("norm", "message"),
    [
        (nn.BatchNorm2d(8), "norm \\(BatchNorm2d\\) normalises with the statistics"),
        (nn.SyncBatchNorm(8), "SyncBatchNorm"),
        (nn.InstanceNorm2d(8, track_running_stats=True), "updates running statistics"),
        (Marked(), "declares knittrans_cross_sample_state=True"),
    ],
)
def test_cross_sample_state_is_refused_before_any_forward(norm: nn.Module, message: str) -> None:
    encoder = WithNorm(norm)
    calls: list[int] = []
    inputs_built: list[EncoderMicroBatch] = []
    schedule = EncodingSchedule.single_process(
        encoder_micro_batches=[("a",)],
        backbone_micro_batches=[[EncodingUse(key="a", position=0, num_rows=16)]],
        num_rows={"a": 16},
    )
    with pytest.raises(InvalidArgument, match=message) as info:
        train_minibatch(
            encoder=encoder,
            encoder_inputs=lambda m: inputs_built.append(m) or torch.randn(1, 3, 16, 16),
            backbone_step=lambda g: calls.append(g.micro_batch),
            schedule=schedule,
        )
    assert info.value.field == "encoder"
    assert inputs_built == [] and calls == []
    assert all(p.grad is None for p in encoder.parameters())


def test_batchnorm_in_eval_mode_is_accepted() -> None:
    encoder = WithNorm(nn.BatchNorm2d(8))
    encoder.norm.eval()
    schedule = EncodingSchedule.single_process(
        encoder_micro_batches=[("a",)],
        backbone_micro_batches=[[EncodingUse(key="a", position=0, num_rows=16)]],
        num_rows={"a": 16},
    )
    train_minibatch(
        encoder=encoder,
        encoder_inputs=lambda m: torch.randn(1, 3, 16, 16),
        backbone_step=lambda g: g.features.square().sum(),
        schedule=schedule,
    )
    assert encoder.conv.weight.grad is not None


@pytest.mark.parametrize(
    ("rows", "encoder_batch", "message"),
    [
        (ENCODER.num_rows + 1, 2, "the schedule expects \\(5, hidden\\)"),
        (ENCODER.num_rows, 2, "returned 1 encodings for 2 keys"),
    ],
)
def test_encoder_output_that_does_not_match_the_schedule_fails_before_any_backward(
    rows: int, encoder_batch: int, message: str
) -> None:
    batch = minibatch()
    micros = micro_batches(batch, 3)
    keys = unique_keys(micros)
    schedule = EncodingSchedule.single_process(
        encoder_micro_batches=chunk(keys, encoder_batch),
        backbone_micro_batches=[m.uses for m in micros],
        num_rows=dict.fromkeys(keys, rows),
    )
    encoder, backbone = models()
    steps: list[int] = []
    drop_one = rows == ENCODER.num_rows  # the second case feeds one image for a two-key micro-batch
    with pytest.raises(FailedPrecondition, match=message):
        train_minibatch(
            encoder=encoder,
            encoder_inputs=lambda m: torch.stack([batch.images[k] for k in m.keys][: 1 if drop_one else None]),
            backbone_step=lambda g: steps.append(g.micro_batch),
            schedule=schedule,
        )
    assert steps == []
    assert all(p.grad is None for p in [*encoder.parameters(), *backbone.parameters()])


def test_schedule_for_more_ranks_than_the_process_group_is_refused() -> None:
    base = schedule_for(micro_batches(minibatch(), 6), 6)
    extra = RankSchedule(rank=1, dp_rank=1, encoder_micro_batches=(), backbone_micro_batches=())
    routes = tuple(EncodingRoute(key=r.key, num_rows=r.num_rows, owner=0, consumers=(0,)) for r in base.routes)
    two_ranks = EncodingSchedule(ranks=(base.ranks[0], extra), routes=routes)
    encoder, _ = models()
    with pytest.raises(InvalidArgument, match="the schedule has 2 ranks, the process group 1"):
        train_minibatch(
            encoder=encoder, encoder_inputs=lambda m: None, backbone_step=lambda g: None, schedule=two_ranks
        )


def test_phases_must_run_in_order() -> None:
    batch = minibatch()
    micros = micro_batches(batch, 6)
    encoder, _ = models()
    run = MinibatchEncodingReuse(
        encoder=encoder,
        encoder_inputs=lambda m: torch.stack([batch.images[k] for k in m.keys]),
        schedule=schedule_for(micros, 6),
    )
    with pytest.raises(FailedPrecondition, match="run_backbone\\(\\) needs phase distributed"):
        run.run_backbone(lambda g: None)
    run.encode()
    assert run.phase is Phase.ENCODED
    with pytest.raises(FailedPrecondition, match="encode\\(\\) needs phase new"):
        run.encode()
    with pytest.raises(FailedPrecondition, match="backward_encoder\\(\\) needs phase backbone_done"):
        run.backward_encoder()
