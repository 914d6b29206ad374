"""Synthetic GRPO-style multimodal mini-batches for the demo, the tests and the deduplication benchmark.

A sample has a prompt with ``images_per_sample`` images; its ``group_size`` trajectories share the prompt
(text and images at the same token positions) and differ in their responses. :func:`pack_micro_batch`
packs trajectories, or any subset of each trajectory's tokens (a CP rank's chunks), into one backbone
micro-batch and derives its :class:`~knittrans.train.EncodingUse` runs. :func:`duplicated_features` is the
baseline that encodes a private copy of the image for every use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from knittrans.demo.model import PLACEHOLDER_TOKEN, Backbone, token_loss
from knittrans.errors import InvalidArgument
from knittrans.train.schedule import EncodingUse
from knittrans.types import UnitKey


@dataclass(frozen=True, kw_only=True)
class ImagePlacement:
    """Rows of image ``key`` fill tokens ``start .. start + rows - 1`` of a trajectory."""

    key: UnitKey
    start: int


@dataclass(frozen=True, kw_only=True)
class SyntheticTrajectory:
    trajectory_id: str
    sample_id: str
    token_ids: tuple[int, ...]
    prompt_tokens: int
    images: tuple[ImagePlacement, ...]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def labels_and_mask(self) -> tuple[list[int], list[float]]:
        """Next-token labels; the loss covers response tokens only, as in RL."""
        labels = [*self.token_ids[1:], PLACEHOLDER_TOKEN]
        mask = [
            1.0 if t + 1 < self.num_tokens and t + 1 >= self.prompt_tokens and self.token_ids[t + 1] else 0.0
            for t in range(self.num_tokens)
        ]
        return labels, mask


@dataclass(frozen=True, kw_only=True, eq=False)
class SyntheticMinibatch:
    images: Mapping[UnitKey, torch.Tensor]
    trajectories: tuple[SyntheticTrajectory, ...]
    rows_per_image: int

    def trajectory(self, trajectory_id: str) -> SyntheticTrajectory:
        for trajectory in self.trajectories:
            if trajectory.trajectory_id == trajectory_id:
                return trajectory
        raise InvalidArgument(f"no trajectory {trajectory_id!r}", field="trajectory_id")

    @property
    def loss_tokens(self) -> int:
        return int(sum(sum(t.labels_and_mask()[1]) for t in self.trajectories))


def make_grpo_minibatch(
    *,
    num_samples: int,
    group_size: int,
    images_per_sample: int,
    rows_per_image: int,
    image_shape: tuple[int, int, int],
    vocab_size: int,
    text_tokens: tuple[int, int] = (2, 6),
    response_tokens: tuple[int, int] = (4, 12),
    repeat_image_in_response: bool = False,
    seed: int = 0,
) -> SyntheticMinibatch:
    """A mini-batch of ``num_samples × group_size`` trajectories.

    With ``repeat_image_in_response`` every response also re-references the sample's first image, so one
    trajectory uses the same encoding twice.
    """
    generator = torch.Generator().manual_seed(seed)

    def randint(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (1,), generator=generator))

    def text(count: int) -> list[int]:
        return torch.randint(1, vocab_size, (count,), generator=generator).tolist()

    images: dict[UnitKey, torch.Tensor] = {}
    trajectories: list[SyntheticTrajectory] = []
    for s in range(num_samples):
        sample_id = f"s{s}"
        prompt: list[int] = []
        placements: list[ImagePlacement] = []
        for i in range(images_per_sample):
            key = UnitKey(f"{sample_id}/img{i}")
            images[key] = torch.randn(image_shape, generator=generator)
            prompt += text(randint(*text_tokens))
            placements.append(ImagePlacement(key=key, start=len(prompt)))
            prompt += [PLACEHOLDER_TOKEN] * rows_per_image
        prompt += text(randint(*text_tokens))
        for g in range(group_size):
            tokens = list(prompt)
            trajectory_placements = list(placements)
            tokens += text(randint(*response_tokens))
            if repeat_image_in_response and placements:
                trajectory_placements.append(ImagePlacement(key=placements[0].key, start=len(tokens)))
                tokens += [PLACEHOLDER_TOKEN] * rows_per_image
                tokens += text(randint(*response_tokens))
            trajectories.append(
                SyntheticTrajectory(
                    trajectory_id=f"{sample_id}/t{g}",
                    sample_id=sample_id,
                    token_ids=tuple(tokens),
                    prompt_tokens=len(prompt),
                    images=tuple(trajectory_placements),
                )
            )
    return SyntheticMinibatch(images=images, trajectories=tuple(trajectories), rows_per_image=rows_per_image)


@dataclass(frozen=True, kw_only=True, eq=False)
class PackedMicroBatch:
    """One backbone micro-batch in its local token layout."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor
    position_ids: torch.Tensor
    segment_ids: torch.Tensor
    uses: tuple[EncodingUse, ...]

    def to(self, device: torch.device | str) -> PackedMicroBatch:
        return PackedMicroBatch(
            input_ids=self.input_ids.to(device),
            labels=self.labels.to(device),
            loss_mask=self.loss_mask.to(device),
            position_ids=self.position_ids.to(device),
            segment_ids=self.segment_ids.to(device),
            uses=self.uses,
        )


def pack_micro_batch(
    minibatch: SyntheticMinibatch,
    trajectory_ids: Sequence[str],
    token_indices: Sequence[Sequence[int | None]] | None = None,
) -> PackedMicroBatch:
    """Concatenate the trajectories (or the listed tokens of each, in the given order) into one layout.

    ``None`` in ``token_indices`` is a padding token: no loss, and a segment of its own so no real token
    attends to it. Placeholder tokens become :class:`EncodingUse` runs: consecutive local positions that take
    consecutive rows of one placement.
    """
    input_ids: list[int] = []
    labels: list[int] = []
    loss_mask: list[float] = []
    position_ids: list[int] = []
    segment_ids: list[int] = []
    uses: list[EncodingUse] = []
    for segment, trajectory_id in enumerate(trajectory_ids):
        trajectory = minibatch.trajectory(trajectory_id)
        all_labels, all_mask = trajectory.labels_and_mask()
        placement_of: dict[int, tuple[int, int]] = {}
        for p, placement in enumerate(trajectory.images):
            for row in range(minibatch.rows_per_image):
                placement_of[placement.start + row] = (p, row)
        indices = range(trajectory.num_tokens) if token_indices is None else token_indices[segment]
        run: list[int] | None = None  # [placement, first_row, position, rows]
        for index in indices:
            local = len(input_ids)
            if index is None:
                input_ids.append(PLACEHOLDER_TOKEN)
                labels.append(PLACEHOLDER_TOKEN)
                loss_mask.append(0.0)
                position_ids.append(0)
                segment_ids.append(-1 - segment)
            else:
                input_ids.append(trajectory.token_ids[index])
                labels.append(all_labels[index])
                loss_mask.append(all_mask[index])
                position_ids.append(index)
                segment_ids.append(segment)
            hit = placement_of.get(index) if index is not None else None
            if hit is not None and run is not None and hit == (run[0], run[1] + run[3]) and local == run[2] + run[3]:
                run[3] += 1
                continue
            if run is not None:
                uses.append(_use(trajectory, run))
                run = None
            if hit is not None:
                run = [hit[0], hit[1], local, 1]
        if run is not None:
            uses.append(_use(trajectory, run))
    return PackedMicroBatch(
        input_ids=torch.tensor(input_ids, dtype=torch.long),
        labels=torch.tensor(labels, dtype=torch.long),
        loss_mask=torch.tensor(loss_mask, dtype=torch.float32),
        position_ids=torch.tensor(position_ids, dtype=torch.long),
        segment_ids=torch.tensor(segment_ids, dtype=torch.long),
        uses=tuple(uses),
    )


def _use(trajectory: SyntheticTrajectory, run: list[int]) -> EncodingUse:
    placement, first_row, position, rows = run
    return EncodingUse(key=trajectory.images[placement].key, position=position, first_row=first_row, num_rows=rows)


def unique_keys(micro_batches: Sequence[PackedMicroBatch]) -> list[UnitKey]:
    """Keys in first-use order."""
    return list(dict.fromkeys(use.key for micro in micro_batches for use in micro.uses))


def chunk(keys: Sequence[UnitKey], size: int) -> list[tuple[UnitKey, ...]]:
    """Encoder micro-batches of at most ``size`` keys."""
    return [tuple(keys[i : i + size]) for i in range(0, len(keys), size)]


def feature_positions(uses: Sequence[EncodingUse], device: torch.device | str = "cpu") -> torch.Tensor:
    if not uses:
        return torch.empty(0, dtype=torch.long, device=device)
    return torch.cat([torch.arange(u.position, u.end_position, device=device) for u in uses])


def duplicated_features(
    encoder: nn.Module, minibatch: SyntheticMinibatch, uses: Sequence[EncodingUse], device: torch.device | str = "cpu"
) -> torch.Tensor:
    """The baseline: every use encodes its own copy of its image (graph attached)."""
    if not uses:
        return torch.empty(0, encoder.config.out_dim, device=device)
    encoded = encoder(torch.stack([minibatch.images[u.key] for u in uses]).to(device))
    return torch.cat([encoded[i, u.first_row : u.end_row] for i, u in enumerate(uses)])


def micro_batch_loss(
    backbone: Backbone,
    micro: PackedMicroBatch,
    features: torch.Tensor,
    positions: torch.Tensor,
    normalizer: float,
) -> torch.Tensor:
    logits = backbone(
        micro.input_ids,
        segment_ids=micro.segment_ids,
        position_ids=micro.position_ids,
        features=features,
        feature_positions=positions,
    )
    return token_loss(logits, micro.labels, micro.loss_mask, normalizer)
