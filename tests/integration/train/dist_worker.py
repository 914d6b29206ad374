"""One rank of the distributed encoding-reuse tests (run by test_distributed_encoding_reuse.py).

Every rank builds the same synthetic mini-batch, the same global schedule and the duplicated-path reference
(computed locally on the whole mini-batch), runs its part of the deduplicated mini-batch over gloo, reduces
gradients the way a trainer would and writes how far they are from the reference to ``<out>/rank<r>.json``.

Layout: rank = ((dp_rank · cp) + cp_rank) · tp + tp_rank. TP is simulated: each TP replica holds a full
backbone and runs the same micro-batches, so the encoding gradients it holds are the full ones, as after
Megatron's input-gradient all-reduce; only the helper's row ownership keeps them from being counted twice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from gloo_worker import run_worker
from torch import nn

from knittrans.demo.model import Backbone, BackboneConfig, EncoderConfig, VisionEncoder, token_loss
from knittrans.demo.multimodal_batch import (
    PackedMicroBatch,
    SyntheticMinibatch,
    chunk,
    duplicated_features,
    feature_positions,
    make_grpo_minibatch,
    micro_batch_loss,
    pack_micro_batch,
)
from knittrans.errors import KnitTransError
from knittrans.train import BackboneMicroBatch, EncoderMicroBatch, EncodingRoute, EncodingSchedule, RankSchedule
from knittrans.train.reuse import GatheredEncodings, train_minibatch
from knittrans.types import UnitKey

ENCODER = EncoderConfig(image_size=16, patch_size=4, dim=32, depth=2, heads=4, merge=2, out_dim=32)
BACKBONE = BackboneConfig(vocab_size=64, dim=32, depth=2, heads=4)


class TokenwiseBackbone(nn.Module):
    """A backbone whose loss is a sum over tokens, so CP ranks need no attention across chunks."""

    def __init__(self, config: BackboneConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.dim)
        self.mlp = nn.Sequential(
            nn.Linear(config.dim, 2 * config.dim), nn.GELU(), nn.Linear(2 * config.dim, config.dim)
        )
        self.head = nn.Linear(config.dim, config.vocab_size)

    def forward(self, input_ids: torch.Tensor, *, features: torch.Tensor, feature_positions: torch.Tensor, **_: object):
        x = self.embed(input_ids)
        if features.numel():
            x = x.index_put((feature_positions,), features)
        return self.head(x + self.mlp(x))


@dataclass(frozen=True, kw_only=True)
class Layout:
    dp: int
    cp: int
    tp: int

    @property
    def world(self) -> int:
        return self.dp * self.cp * self.tp

    def coordinate(self, rank: int) -> tuple[int, int, int]:
        return rank // (self.cp * self.tp), (rank // self.tp) % self.cp, rank % self.tp


@dataclass(frozen=True, kw_only=True, eq=False)
class Scenario:
    layout: Layout
    batch: SyntheticMinibatch
    trajectories_by_dp: list[list[list[str]]]  # dp rank -> micro-batches -> trajectory ids
    owner_of: Callable[[int, UnitKey], int]  # (key index, key) -> owner rank
    encoder_batch: int
    tokenwise: bool


def zigzag(length: int, cp: int, cp_rank: int) -> list[int]:
    """Token indices of CP rank ``cp_rank``: chunks r and 2cp-1-r of 2cp near-equal chunks."""
    size = -(-length // (2 * cp))
    chunks = [list(range(i * size, min((i + 1) * size, length))) for i in range(2 * cp)]
    return chunks[cp_rank] + chunks[2 * cp - 1 - cp_rank]


def local_micro_batches(scenario: Scenario, rank: int) -> list[PackedMicroBatch]:
    dp_rank, cp_rank, _ = scenario.layout.coordinate(rank)
    micros = []
    for ids in scenario.trajectories_by_dp[dp_rank]:
        if scenario.layout.cp == 1:
            micros.append(pack_micro_batch(scenario.batch, ids))
        else:
            indices = [zigzag(scenario.batch.trajectory(i).num_tokens, scenario.layout.cp, cp_rank) for i in ids]
            micros.append(pack_micro_batch(scenario.batch, ids, indices))
    return micros


def build_schedule(scenario: Scenario) -> EncodingSchedule:
    layout = scenario.layout
    micros = {rank: local_micro_batches(scenario, rank) for rank in range(layout.world)}
    keys = list(scenario.batch.images)
    owners = {key: scenario.owner_of(i, key) for i, key in enumerate(keys)}
    ranks = []
    for rank in range(layout.world):
        dp_rank, cp_rank, tp_rank = layout.coordinate(rank)
        owned = [key for key in keys if owners[key] == rank]
        ranks.append(
            RankSchedule(
                rank=rank,
                dp_rank=dp_rank,
                cp_rank=cp_rank,
                tp_rank=tp_rank,
                encoder_micro_batches=tuple(EncoderMicroBatch(keys=c) for c in chunk(owned, scenario.encoder_batch)),
                backbone_micro_batches=tuple(BackboneMicroBatch(uses=m.uses) for m in micros[rank]),
            )
        )
    routes = tuple(
        EncodingRoute(
            key=key,
            num_rows=ENCODER.num_rows,
            owner=owners[key],
            consumers=tuple(r.rank for r in ranks if key in r.referenced_keys()),
        )
        for key in keys
    )
    return EncodingSchedule(ranks=tuple(ranks), routes=routes, tp_size=layout.tp)


def models(tokenwise: bool) -> tuple[VisionEncoder, nn.Module]:
    torch.manual_seed(0)
    encoder = VisionEncoder(ENCODER)
    return encoder, (TokenwiseBackbone(BACKBONE) if tokenwise else Backbone(BACKBONE))


def loss_of(backbone: nn.Module, micro: PackedMicroBatch, features, positions, normalizer: float) -> torch.Tensor:
    if isinstance(backbone, Backbone):
        return micro_batch_loss(backbone, micro, features, positions, normalizer)
    logits = backbone(micro.input_ids, features=features, feature_positions=positions)
    return token_loss(logits, micro.labels, micro.loss_mask, normalizer)


def reference(scenario: Scenario) -> tuple[VisionEncoder, nn.Module]:
    """The duplicated path over the whole mini-batch in this process (full sequences, no CP split)."""
    encoder, backbone = models(scenario.tokenwise)
    for dp_micro_batches in scenario.trajectories_by_dp:
        for ids in dp_micro_batches:
            micro = pack_micro_batch(scenario.batch, ids)
            features = duplicated_features(encoder, scenario.batch, micro.uses)
            loss_of(backbone, micro, features, feature_positions(micro.uses), scenario.batch.loss_tokens).backward()
    return encoder, backbone


def flat_grads(module: nn.Module) -> list[torch.Tensor]:
    return [p.grad if p.grad is not None else torch.zeros_like(p) for p in module.parameters()]


def max_relative_difference(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> float:
    return max(float((g - w).abs().max() / w.abs().max().clamp_min(1e-30)) for g, w in zip(got, want, strict=True))


def run_dedup(scenario: Scenario, rank: int, schedule: EncodingSchedule, encoder_inputs=None):
    encoder, backbone = models(scenario.tokenwise)
    micros = local_micro_batches(scenario, rank)
    normalizer = scenario.batch.loss_tokens

    def step(gathered: GatheredEncodings) -> torch.Tensor:
        return loss_of(backbone, micros[gathered.micro_batch], gathered.features, gathered.positions, normalizer)

    _, report = train_minibatch(
        encoder=encoder,
        encoder_inputs=encoder_inputs or (lambda m: torch.stack([scenario.batch.images[k] for k in m.keys])),
        backbone_step=step,
        schedule=schedule,
    )
    return encoder, backbone, report


def check_gradients(scenario: Scenario, rank: int) -> dict[str, object]:
    schedule = build_schedule(scenario)
    encoder, backbone, report = run_dedup(scenario, rank, schedule)
    tp_rank = scenario.layout.coordinate(rank)[2]
    # Encoder DP spans every rank; backbone DP counts one replica per TP group.
    encoder_grads = flat_grads(encoder)
    backbone_grads = [g * (1.0 if tp_rank == 0 else 0.0) for g in flat_grads(backbone)]
    for grad in [*encoder_grads, *backbone_grads]:
        dist.all_reduce(grad)
    want_encoder, want_backbone = reference(scenario)

    for p, g in zip([*encoder.parameters(), *backbone.parameters()], [*encoder_grads, *backbone_grads], strict=True):
        p.grad = g
    step_params = []
    for module_pair in ((encoder, backbone), (want_encoder, want_backbone)):
        params = [p for m in module_pair for p in m.parameters()]
        torch.optim.SGD(params, lr=0.5, momentum=0.9).step()
        step_params.append([p.detach().clone() for p in params])
    start_encoder, start_backbone = models(scenario.tokenwise)
    start = [p.detach() for m in (start_encoder, start_backbone) for p in m.parameters()]
    moved = [w - s for w, s in zip(step_params[1], start, strict=True)]
    return {
        "encoder": max_relative_difference(encoder_grads, flat_grads(want_encoder)),
        "backbone": max_relative_difference(backbone_grads, flat_grads(want_backbone)),
        "params_after_step": max_relative_difference(step_params[0], step_params[1]),
        "smallest_parameter_move": min(float(m.abs().max() / s.abs().max()) for m, s in zip(moved, start, strict=True)),
        "report": report.__dict__,
        "uses": [[u.__dict__ for u in m.uses] for m in schedule.ranks[rank].backbone_micro_batches],
    }


def expect_failure(scenario: Scenario, rank: int, schedule: EncodingSchedule, encoder_inputs=None) -> dict:
    """Run a mini-batch that must fail on every rank before any backward pass."""
    encoder, backbone = models(scenario.tokenwise)
    steps: list[int] = []
    outcome: dict[str, object] = {"error_type": None, "message": ""}
    try:
        train_minibatch(
            encoder=encoder,
            encoder_inputs=encoder_inputs or (lambda m: torch.stack([scenario.batch.images[k] for k in m.keys])),
            backbone_step=lambda g: steps.append(g.micro_batch),
            schedule=schedule,
        )
    except KnitTransError as exc:
        outcome = {"error_type": type(exc).__name__, "message": str(exc)}
    outcome["backbone_steps"] = len(steps)
    outcome["any_gradient"] = any(p.grad is not None for m in (encoder, backbone) for p in m.parameters())
    return outcome


def trajectories(batch: SyntheticMinibatch, sample: int) -> list[str]:
    return [t.trajectory_id for t in batch.trajectories if t.sample_id == f"s{sample}"]


def grpo_batch(num_samples: int, group_size: int) -> SyntheticMinibatch:
    return make_grpo_minibatch(
        num_samples=num_samples,
        group_size=group_size,
        images_per_sample=2,
        rows_per_image=ENCODER.num_rows,
        image_shape=(3, ENCODER.image_size, ENCODER.image_size),
        vocab_size=BACKBONE.vocab_size,
        repeat_image_in_response=True,
        seed=11,
    )


def two_rank_scenario() -> Scenario:
    """Samples 0 and 1 are spread over both DP ranks; sample 2 trains only on rank 0 but is encoded on rank 1."""
    batch = grpo_batch(3, 4)
    s0, s1, s2 = (trajectories(batch, s) for s in range(3))
    by_dp = [
        [[s0[0], s0[2]], [s1[0], s2[0], s2[1]], [s2[2], s2[3], s0[1]]],
        [[s0[3], s1[1]], [s1[2], s1[3]], []],
    ]
    return Scenario(
        layout=Layout(dp=2, cp=1, tp=1),
        batch=batch,
        trajectories_by_dp=by_dp,
        owner_of=lambda i, key: 1 if key.startswith("s2/") else (i + 1) % 2,
        encoder_batch=2,
        tokenwise=False,
    )


def dp_tp_scenario() -> Scenario:
    batch = grpo_batch(3, 4)
    s0, s1, s2 = (trajectories(batch, s) for s in range(3))
    by_dp = [[[s0[0], s0[1], s1[0]], [s2[0], s0[2]]], [[s1[1], s1[2], s1[3]], [s0[3], s2[1], s2[2], s2[3]]]]
    return Scenario(
        layout=Layout(dp=2, cp=1, tp=2),
        batch=batch,
        trajectories_by_dp=by_dp,
        owner_of=lambda i, key: (3 * i + 1) % 4,
        encoder_batch=2,
        tokenwise=False,
    )


def cp_tp_scenario() -> Scenario:
    batch = grpo_batch(2, 3)
    s0, s1 = (trajectories(batch, s) for s in range(2))
    return Scenario(
        layout=Layout(dp=1, cp=2, tp=2),
        batch=batch,
        trajectories_by_dp=[[[s0[0], s1[0]], [s0[1], s0[2], s1[1]], [s1[2]]]],
        owner_of=lambda i, key: (i + 2) % 4,
        encoder_batch=3,
        tokenwise=True,
    )


def scenario_results(world: int, rank: int) -> dict[str, object]:
    results: dict[str, object] = {}
    if world == 2:
        scenario = two_rank_scenario()
        results["dp2"] = check_gradients(scenario, rank)
        # Rank 1 builds its encoder micro-batches of one key instead of two: schedules differ.
        changed = Scenario(**{**scenario.__dict__, "encoder_batch": 1 if rank == 1 else 2})
        results["mismatched_schedules"] = expect_failure(changed, rank, build_schedule(changed))
        # Rank 1's encoder sees one image too few: only rank 1 can tell, every rank must stop.
        short = (lambda m: torch.stack([scenario.batch.images[k] for k in m.keys][:-1])) if rank == 1 else None
        results["bad_encoder_output"] = expect_failure(scenario, rank, build_schedule(scenario), short)
    else:
        results["dp2tp2"] = check_gradients(dp_tp_scenario(), rank)
        results["cp2tp2"] = check_gradients(cp_tp_scenario(), rank)
    return results


def main() -> None:
    run_worker(lambda args: scenario_results(args.world_size, args.rank))


if __name__ == "__main__":
    main()
