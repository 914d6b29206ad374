"""One rank of the encoding wire-order tests (run by test_encoding_wire_order.py).

Every rank of one gloo launch runs:

- ``repro``: the two-rank regression case. Rank 0 owns encodings ``("b", "a")``, computed by a bias-free
  ``Linear(2, 1)`` on one-hot inputs; rank 1 consumes both with loss ``1·E(a) + 10·E(b)``. The encoder's
  gradient must be ``[1, 10]`` whichever order the routes are listed in.
- ``examples``: every example the parent drew with hypothesis (the same list on every rank). Each one is a
  synthetic GRPO mini-batch planned by the real planner, turned into a schedule by ``schedule_from_plan`` with
  random encoder owners, then shuffled (route order, encoder micro-batch order and key order within each). Two
  encoder families (a ViT-like encoder with attention over patches, and a conv encoder with GroupNorm) train
  one step with deduplication and, in this process, on a naive path that re-encodes every reference on its
  own. The worker only measures; the parent asserts, so ranks never diverge while a collective is pending.

Results go to ``<out>/rank<r>.json``. Everything runs in float64, so any difference beyond round-off is a bug.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from gloo_worker import run_worker
from torch import nn

from knittrans.admission.planning import plan_minibatch
from knittrans.plan import Plan
from knittrans.train import (
    BackboneMicroBatch,
    EncoderMicroBatch,
    EncodingRoute,
    EncodingSchedule,
    EncodingUse,
    RankSchedule,
    schedule_from_plan,
)
from knittrans.train.reuse import GatheredEncodings, train_minibatch
from knittrans.types import (
    BackboneTopology,
    EncoderTopology,
    MultimodalRef,
    TokenSpan,
    Topology,
    TrajectoryMeta,
    UnitKey,
    VersionSegment,
)

VOCAB = 24
HIDDEN = 12
IMAGE = 8  # pixels per side; both encoders turn an image into ROWS rows
ROWS = 4
PLACEHOLDER_ID = 0  # also the padding id; text tokens are 1 .. VOCAB-1
LEARNING_RATE = 1e-2


# The regression case ---------------------------------------------------------------------------------


def repro(routes_order: Sequence[str]) -> list[float]:
    """The encoder gradient on rank 0 (empty elsewhere) with the routes listed in ``routes_order``."""
    one_hot = {"a": torch.tensor([1.0, 0.0]), "b": torch.tensor([0.0, 1.0])}
    weight_of = {"a": 1.0, "b": 10.0}
    owner = RankSchedule(rank=0, encoder_micro_batches=(EncoderMicroBatch(keys=(UnitKey("b"), UnitKey("a"))),))
    consumer = RankSchedule(
        rank=1,
        dp_rank=1,
        backbone_micro_batches=(
            BackboneMicroBatch(
                uses=(
                    EncodingUse(key=UnitKey("a"), position=0, num_rows=1),
                    EncodingUse(key=UnitKey("b"), position=1, num_rows=1),
                )
            ),
        ),
    )
    schedule = EncodingSchedule(
        ranks=(owner, consumer),
        routes=tuple(EncodingRoute(key=UnitKey(k), num_rows=1, owner=0, consumers=(1,)) for k in routes_order),
    )
    encoder = nn.Linear(2, 1, bias=False, dtype=torch.float64)
    with torch.no_grad():
        encoder.weight.fill_(0.5)

    def step(gathered: GatheredEncodings) -> torch.Tensor:
        scale = torch.tensor([weight_of[u.key] for u in gathered.uses], dtype=gathered.features.dtype)
        return (gathered.features[:, 0] * scale).sum()

    train_minibatch(
        encoder=encoder,
        encoder_inputs=lambda micro: torch.stack([one_hot[k] for k in micro.keys]).double(),
        backbone_step=step,
        schedule=schedule,
    )
    return [] if encoder.weight.grad is None else encoder.weight.grad[0].tolist()


# Workload --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Trajectory:
    trajectory_id: str
    sample_id: str
    tokens: torch.Tensor  # input ids; placeholder spans hold PLACEHOLDER_ID
    targets: torch.Tensor  # the class each token's output is scored against
    loss_mask: torch.Tensor  # bool
    images: tuple[tuple[str, int], ...]  # (key, first placeholder token)


@dataclass(frozen=True, kw_only=True)
class Workload:
    trajectories: tuple[Trajectory, ...]
    images: dict[str, torch.Tensor]

    @property
    def loss_tokens(self) -> int:
        return int(sum(int(t.loss_mask.sum()) for t in self.trajectories))


def make_workload(example: dict) -> Workload:
    """GRPO-shaped: every trajectory of a sample shares the prompt and its images, then has its own response."""
    generator = torch.Generator().manual_seed(example["seed"])

    def integers(low: int, high: int, size: tuple[int, ...] = ()) -> torch.Tensor:
        return torch.randint(low, high, size, generator=generator)

    images: dict[str, torch.Tensor] = {}
    trajectories = []
    for s in range(example["samples"]):
        keys = [f"s{s}/img{i}" for i in range(example["images_per_sample"])]
        for key in keys:
            images[key] = torch.randn(3, IMAGE, IMAGE, generator=generator, dtype=torch.float64)
        prompt: list[int] = []
        placements = []
        for key in keys:
            prompt += integers(1, VOCAB, (int(integers(1, 4)),)).tolist()
            placements.append((key, len(prompt)))
            prompt += [PLACEHOLDER_ID] * ROWS
        prompt += integers(1, VOCAB, (int(integers(1, 3)),)).tolist()
        for g in range(example["group_size"]):
            response = integers(1, VOCAB, (int(integers(2, 12)),)).tolist()
            tokens = torch.tensor(prompt + response)
            trajectories.append(
                Trajectory(
                    trajectory_id=f"s{s}/t{g}",
                    sample_id=f"s{s}",
                    tokens=tokens,
                    targets=integers(1, VOCAB, (len(tokens),)),
                    loss_mask=torch.rand(len(tokens), generator=generator) < 0.8,
                    images=tuple(placements),
                )
            )
    return Workload(trajectories=tuple(trajectories), images=images)


def metadata(workload: Workload) -> list[TrajectoryMeta]:
    return [
        TrajectoryMeta(
            trajectory_id=t.trajectory_id,
            sample_id=t.sample_id,
            source="wire-order",
            rollout_step=0,
            num_tokens=len(t.tokens),
            num_loss_tokens=int(t.loss_mask.sum()),
            segments=(VersionSegment(version=0, num_tokens=len(t.tokens)),),
            multimodal=tuple(
                MultimodalRef(
                    key=key, encoder="vision", cost=1.0, placeholder=TokenSpan(start=start, end=start + ROWS)
                )
                for key, start in t.images
            ),
        )
        for t in workload.trajectories
    ]


def plan_for(example: dict, workload: Workload) -> Plan:
    topology = Topology(
        backbone=BackboneTopology(
            dp=example["dp"], cp=example["cp"], tp=example["tp"], max_tokens_per_microbatch=64
        ),
        encoders=(
            EncoderTopology(
                name="vision", dp=example["encoder_dp"], max_cost_per_microbatch=example["encoder_max_cost"]
            ),
        ),
    )
    plan = plan_minibatch(metadata(workload), topology)
    plan.validate()
    return plan


def shuffled_schedule(schedule: EncodingSchedule, seed: int) -> EncodingSchedule:
    """The same schedule with routes, encoder micro-batches and keys within them in a random order."""
    rng = random.Random(seed)
    routes = list(schedule.routes)
    rng.shuffle(routes)
    ranks = []
    for rank in schedule.ranks:
        micros = [list(micro.keys) for micro in rank.encoder_micro_batches]
        rng.shuffle(micros)
        for keys in micros:
            rng.shuffle(keys)
        ranks.append(
            RankSchedule(
                rank=rank.rank,
                dp_rank=rank.dp_rank,
                cp_rank=rank.cp_rank,
                tp_rank=rank.tp_rank,
                encoder_micro_batches=tuple(EncoderMicroBatch(keys=tuple(keys)) for keys in micros),
                backbone_micro_batches=rank.backbone_micro_batches,
            )
        )
    return EncodingSchedule(ranks=tuple(ranks), routes=tuple(routes), tp_size=schedule.tp_size)


# Models ----------------------------------------------------------------------------------------------


class PatchAttentionEncoder(nn.Module):
    """ViT-like: 2×2 patches, one pre-norm attention block over the 16 patches, 2×2 patch merge to 4 rows.

    The key projection has no bias: a key bias only shifts every logit of a query by the same amount, so
    its gradient is zero up to round-off, and AdamW would turn that round-off into full-size steps.
    """

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.patch = nn.Linear(3 * 2 * 2, dim)
        self.position = nn.Parameter(0.1 * torch.randn(16, dim))
        self.norm1 = nn.LayerNorm(dim)
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim, bias=False)
        self.value = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.merge = nn.Linear(4 * dim, HIDDEN)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        n = images.shape[0]
        patches = images.unfold(2, 2, 2).unfold(3, 2, 2)  # (n, 3, 4, 4, 2, 2)
        x = self.patch(patches.permute(0, 2, 3, 1, 4, 5).reshape(n, 16, 12)) + self.position
        h = self.norm1(x)
        split = lambda t: t.view(n, 16, self.heads, -1).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.query(h)), split(self.key(h)), split(self.value(h))
        attention = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
        x = x + self.out((attention @ v).transpose(1, 2).reshape(n, 16, -1))
        x = x + self.mlp(self.norm2(x))
        grid = x.view(n, 2, 2, 2, 2, -1).permute(0, 1, 3, 2, 4, 5)  # (n, row, col, dy, dx, dim)
        return self.merge(grid.reshape(n, ROWS, -1))


class GroupNormConvEncoder(nn.Module):
    """Convolutions with GroupNorm, 8×8 down to 2×2 = 4 rows; convolutions before a norm have no bias (a
    per-group constant is removed by the norm, so that bias would only get round-off gradients)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, bias=False),
            nn.GroupNorm(2, 8),
            nn.GELU(),
            nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False),
            nn.GroupNorm(4, 16),
            nn.GELU(),
            nn.Conv2d(16, HIDDEN, 2, stride=2),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.body(images).flatten(2).transpose(1, 2)  # (n, 4, HIDDEN)


class TokenwiseBackbone(nn.Module):
    """A per-token network, so a CP rank's share of the loss needs nothing from the other CP ranks."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.mlp = nn.Sequential(nn.Linear(HIDDEN, 2 * HIDDEN), nn.Tanh(), nn.Linear(2 * HIDDEN, HIDDEN))
        self.head = nn.Linear(HIDDEN, VOCAB)

    def loss(
        self, tokens: torch.Tensor, features: torch.Tensor, positions: torch.Tensor, targets, mask, normalizer
    ) -> torch.Tensor:
        x = self.embed(tokens).index_put((positions,), features)
        logits = self.head(x + self.mlp(x))
        return F.cross_entropy(logits[mask], targets[mask], reduction="sum") / normalizer


ENCODERS: dict[str, Callable[[], nn.Module]] = {
    "vit": PatchAttentionEncoder,
    "conv_groupnorm": GroupNormConvEncoder,
}


def models(family: str, seed: int) -> tuple[nn.Module, TokenwiseBackbone]:
    torch.manual_seed(seed)
    return ENCODERS[family]().double(), TokenwiseBackbone().double()


# The two paths ---------------------------------------------------------------------------------------


def naive_path(workload: Workload, encoder: nn.Module, backbone: TokenwiseBackbone) -> None:
    """Every reference encoded on its own, every trajectory whole, one process: no deduplication at all."""
    for t in workload.trajectories:
        features, positions = [], []
        for key, start in t.images:
            features.append(encoder(workload.images[key].unsqueeze(0))[0])
            positions.append(torch.arange(start, start + ROWS))
        backbone.loss(
            t.tokens, torch.cat(features), torch.cat(positions), t.targets, t.loss_mask, workload.loss_tokens
        ).backward()


@dataclass(frozen=True, kw_only=True)
class LocalMicroBatch:
    tokens: torch.Tensor
    targets: torch.Tensor
    loss_mask: torch.Tensor


def local_micro_batches(plan: Plan, workload: Workload, dp_rank: int, cp_rank: int) -> list[LocalMicroBatch]:
    """This rank's packed micro-batches, written from the layout's definition (not from the adapter): the
    micro-batch's trajectories in plan order, each holding CP chunks r and 2cp−1−r of its padded length."""
    by_id = {t.trajectory_id: t for t in workload.trajectories}
    cp = plan.topology.backbone.cp
    micros = []
    for trajectories in plan.microbatches(dp_rank):
        tokens, targets, mask = [], [], []
        for index in trajectories:
            t = by_id[plan.trajectories[int(index)].trajectory_id]
            chunk = int(plan.backbone.padded_tokens[int(index)]) // (2 * cp)
            for c in (cp_rank, 2 * cp - 1 - cp_rank):
                for g in range(c * chunk, (c + 1) * chunk):
                    real = g < len(t.tokens)
                    tokens.append(int(t.tokens[g]) if real else PLACEHOLDER_ID)
                    targets.append(int(t.targets[g]) if real else 0)
                    mask.append(bool(t.loss_mask[g]) if real else False)
        micros.append(
            LocalMicroBatch(
                tokens=torch.tensor(tokens, dtype=torch.long),
                targets=torch.tensor(targets, dtype=torch.long),
                loss_mask=torch.tensor(mask, dtype=torch.bool),
            )
        )
    return micros


def dedup_path(
    schedule: EncodingSchedule,
    micros: list[LocalMicroBatch],
    workload: Workload,
    encoder: nn.Module,
    backbone: TokenwiseBackbone,
) -> None:
    def step(gathered: GatheredEncodings) -> torch.Tensor:
        micro = micros[gathered.micro_batch]
        return backbone.loss(
            micro.tokens, gathered.features, gathered.positions, micro.targets, micro.loss_mask, workload.loss_tokens
        )

    train_minibatch(
        encoder=encoder,
        encoder_inputs=lambda micro: torch.stack([workload.images[k] for k in micro.keys]),
        backbone_step=step,
        schedule=schedule,
    )


def summed_grads(module: nn.Module, weight: float) -> list[torch.Tensor]:
    """The module's gradients summed over every rank, this rank's counted ``weight`` times."""
    grads = []
    for p in module.parameters():
        grad = (p.grad if p.grad is not None else torch.zeros_like(p)) * weight
        dist.all_reduce(grad)
        grads.append(grad)
    return grads


def relative_error(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> float:
    """Largest difference relative to each tensor's largest entry."""
    return max(float((g - w).abs().max() / w.abs().max().clamp_min(1e-300)) for g, w in zip(got, want, strict=True))


def adamw_step(modules: Sequence[nn.Module], grads: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
    params = [p for m in modules for p in m.parameters()]
    if grads is not None:
        for p, g in zip(params, grads, strict=True):
            p.grad = g
    torch.optim.AdamW(params, lr=LEARNING_RATE, weight_decay=0.01).step()
    return [p.detach().clone() for p in params]


def run_example(example: dict, rank: int) -> dict[str, object]:
    workload = make_workload(example)
    plan = plan_for(example, workload)
    planned = sorted(
        plan.trajectories[int(i)].trajectory_id for d in range(example["dp"]) for m in plan.microbatches(d) for i in m
    )
    owners = example["owners"]
    schedule = shuffled_schedule(
        schedule_from_plan(plan, encoder="vision", encoder_rank=lambda d: owners[d]), example["seed"]
    )
    me = schedule.ranks[rank]
    micros = local_micro_batches(plan, workload, me.dp_rank, me.cp_rank)
    outcome: dict[str, object] = {
        "all_trajectories_planned": planned == sorted(t.trajectory_id for t in workload.trajectories),
        "cross_rank_routes": sum(1 for r in schedule.routes if any(c != r.owner for c in r.consumers)),
    }
    for family in ENCODERS:
        encoder, backbone = models(family, example["seed"])
        want_encoder, want_backbone = copy.deepcopy(encoder), copy.deepcopy(backbone)
        dedup_path(schedule, micros, workload, encoder, backbone)
        # Encoder gradients: each encoding's full gradient sits on its one owner, so sum over ranks. Backbone
        # gradients: TP replicas hold the same full gradient, so count one replica per TP group.
        encoder_grads = summed_grads(encoder, 1.0)
        backbone_grads = summed_grads(backbone, 1.0 if me.tp_rank == 0 else 0.0)
        naive_path(workload, want_encoder, want_backbone)
        want_encoder_grads = [p.grad.clone() for p in want_encoder.parameters()]
        want_backbone_grads = [p.grad.clone() for p in want_backbone.parameters()]
        got_params = adamw_step((encoder, backbone), [*encoder_grads, *backbone_grads])
        want_params = adamw_step((want_encoder, want_backbone))
        outcome[family] = {
            "encoder": relative_error(encoder_grads, want_encoder_grads),
            "backbone": relative_error(backbone_grads, want_backbone_grads),
            "params_after_adamw": relative_error(got_params, want_params),
            "encoder_gradient_scale": max(float(g.abs().max()) for g in want_encoder_grads),
        }
    return outcome


def scenario(args) -> dict[str, object]:
    results: dict[str, object] = {}
    if args.world_size == 2:
        results["repro"] = {"ba": repro(("b", "a")), "ab": repro(("a", "b"))}
    results["examples"] = [run_example(example, args.rank) for example in json.loads(args.examples.read_text())]
    return results


def main() -> None:
    run_worker(scenario, extra=lambda parser: parser.add_argument("--examples", type=Path, required=True),
               timeout_seconds=120)


if __name__ == "__main__":
    main()
