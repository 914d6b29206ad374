"""What a read returned: the bytes that left storage, the packed bytes to forward, and integrity checks."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from tensordict import TensorDict
from transfer_workload import fingerprint

from tq.layout import IMAGES_FIELD, StoredImages, StoredRow


class IntegrityError(RuntimeError):
    """TransferQueue returned different bytes or shapes than were written."""


def field_rows(data: TensorDict, field: str) -> list[torch.Tensor]:
    column = data[field]
    if isinstance(column, torch.Tensor) and column.is_nested:
        return list(column.unbind())
    return list(column)


def payload_bytes(data: TensorDict) -> int:
    """Bytes of tensor payload received: what moved out of storage, framing excluded."""
    return sum(row.numel() * row.element_size() for field in data.keys() for row in field_rows(data, field))


def packed(data: TensorDict, field: str) -> np.ndarray:
    """The field's rows as one contiguous byte array (a view when TransferQueue already packed them)."""
    column = data[field]
    if isinstance(column, torch.Tensor) and column.is_nested and column.layout == torch.jagged:
        values = column.values()
    else:
        values = torch.cat([row.reshape(-1) for row in field_rows(data, field)])
    return values.contiguous().numpy().reshape(-1).view(np.uint8)


def check_rows(data: TensorDict, rows: Sequence[StoredRow], fields: Sequence[str], routing_width: int) -> None:
    """Shapes of every row and field, the token ids' CRC of every row, and one row's images' CRC."""
    if data.batch_size[0] != len(rows):
        raise IntegrityError(f"asked for {len(rows)} rows, got {data.batch_size[0]}")
    for field in fields:
        for row, tensor in zip(rows, field_rows(data, field), strict=True):
            if field == IMAGES_FIELD:
                continue
            expected = (row.length,) if field == "input_ids" else (row.length, routing_width)
            if tuple(tensor.shape) != expected:
                raise IntegrityError(f"{row.key}.{field}: shape {tuple(tensor.shape)}, expected {expected}")
    for row, tensor in zip(rows, field_rows(data, "input_ids"), strict=True):
        if fingerprint(tensor.numpy()) != row.input_ids_crc:
            raise IntegrityError(f"{row.key}.input_ids: content differs from what was written")
    if IMAGES_FIELD in fields:
        # Checking every copy would cost more CPU than the read itself; one copy per read shows the path works.
        first = field_rows(data, IMAGES_FIELD)[0]
        if fingerprint(first.numpy()) != rows[0].images_crc:
            raise IntegrityError(f"{rows[0].key}.images: content differs from what was written")


def check_images(data: TensorDict, stored: Sequence[StoredImages]) -> None:
    for entry, tensor in zip(stored, field_rows(data, IMAGES_FIELD), strict=True):
        if fingerprint(tensor.numpy()) != entry.crc:
            raise IntegrityError(f"{entry.key}: content differs from what was written")
