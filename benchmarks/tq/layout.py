"""How the step's data is laid out in TransferQueue, and writing it there.

Three layouts of the sample-level baseline:

- ``a`` (as its users use it): one row per trajectory, and every row carries its prompt's images.
- ``b`` (as the paper configured it): one row per trajectory with the per-token fields only, and the images
  stored once per prompt, in rows of their own.
- ``b-tp-shared``: stored like ``b``; only the read side differs (see ``transferqueue_arm.py``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import torch
import transfer_queue as tq
from tensordict import TensorDict
from transfer_workload import Workload, fingerprint, prompt_images, trajectory_fields

TRAJECTORY_PARTITION = "trajectories"
IMAGE_PARTITION = "prompt-images"
IMAGES_FIELD = "images"


class Layout(StrEnum):
    ROWS_WITH_IMAGES = "a"
    IMAGES_ONCE = "b"
    IMAGES_ONCE_TP_SHARED = "b-tp-shared"

    @property
    def rows_carry_images(self) -> bool:
        return self is Layout.ROWS_WITH_IMAGES

    @property
    def arm_name(self) -> str:
        return {
            Layout.ROWS_WITH_IMAGES: "transferqueue-a-as-users",
            Layout.IMAGES_ONCE: "transferqueue-b-paper",
            Layout.IMAGES_ONCE_TP_SHARED: "transferqueue-b-tp-shared",
        }[self]


def trajectory_key(trajectory: int) -> str:
    return f"traj-{trajectory:06d}"


def images_key(prompt: int) -> str:
    return f"prompt-{prompt:05d}-images"


@dataclass(frozen=True, kw_only=True)
class StoredRow:
    """What one trajectory row holds, for checking what comes back."""

    key: str
    length: int
    input_ids_crc: int
    images_crc: int | None  # only when the row carries its prompt's images


@dataclass(frozen=True, kw_only=True)
class StoredImages:
    key: str
    prompt: int
    crc: int


@dataclass(frozen=True, kw_only=True)
class StoredStep:
    layout: Layout
    rows: Mapping[int, StoredRow]  # by trajectory
    images: Mapping[int, StoredImages]  # by prompt; empty when rows carry their images
    token_fields: tuple[str, ...]
    write_s: float

    @property
    def row_fields(self) -> list[str]:
        has_images = self.layout.rows_carry_images and any(row.images_crc is not None for row in self.rows.values())
        return [*self.token_fields, *([IMAGES_FIELD] if has_images else [])]


def jagged(arrays: Sequence[np.ndarray]) -> torch.Tensor:
    """Variable-length rows as a jagged nested tensor, the form TransferQueue stores per-sample tensors in."""
    return torch.nested.as_nested_tensor([torch.from_numpy(array) for array in arrays], layout=torch.jagged)


async def write_step(workload: Workload, layout: Layout) -> StoredStep:
    """Write every trajectory (and, for ``b``, every prompt's images once), prompt by prompt."""
    config = workload.config
    field_names = tuple(spec.name for spec in config.token_fields)
    carry_images = layout.rows_carry_images and config.images_per_prompt > 0
    rows: dict[int, StoredRow] = {}
    images: dict[int, StoredImages] = {}
    started = time.perf_counter()
    for prompt in range(config.num_prompts):
        members = list(workload.trajectories_of_prompt(prompt))
        per_trajectory = [trajectory_fields(workload, i) for i in members]
        columns: dict[str, torch.Tensor] = {name: jagged([f[name] for f in per_trajectory]) for name in field_names}
        prompt_pixels = prompt_images(workload, prompt) if config.images_per_prompt > 0 else None
        if carry_images:
            assert prompt_pixels is not None
            columns[IMAGES_FIELD] = torch.from_numpy(np.repeat(prompt_pixels[None], len(members), axis=0))
        keys = [trajectory_key(i) for i in members]
        await tq.async_kv_batch_put(
            keys=keys, partition_id=TRAJECTORY_PARTITION, fields=TensorDict(columns, batch_size=len(members))
        )
        images_crc = fingerprint(prompt_pixels) if carry_images and prompt_pixels is not None else None
        for trajectory, fields in zip(members, per_trajectory, strict=True):
            rows[trajectory] = StoredRow(
                key=trajectory_key(trajectory),
                length=workload.lengths[trajectory],
                input_ids_crc=fingerprint(fields["input_ids"]),
                images_crc=images_crc,
            )
        if not layout.rows_carry_images and prompt_pixels is not None:
            await tq.async_kv_batch_put(
                keys=[images_key(prompt)],
                partition_id=IMAGE_PARTITION,
                fields=TensorDict({IMAGES_FIELD: torch.from_numpy(prompt_pixels[None].copy())}, batch_size=1),
            )
            images[prompt] = StoredImages(key=images_key(prompt), prompt=prompt, crc=fingerprint(prompt_pixels))
    return StoredStep(
        layout=layout,
        rows=rows,
        images=images,
        token_fields=field_names,
        write_s=time.perf_counter() - started,
    )


async def clear_step(stored: StoredStep) -> None:
    await tq.async_kv_clear(keys=[row.key for row in stored.rows.values()], partition_id=TRAJECTORY_PARTITION)
    if stored.images:
        await tq.async_kv_clear(keys=[entry.key for entry in stored.images.values()], partition_id=IMAGE_PARTITION)
