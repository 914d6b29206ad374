"""The tensors of a packed micro-batch in shared memory: where each lies, and which packed positions an
encoding's rows fill. Pure (no protobuf), so the sidecar's packer shares them with the descriptor.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from knittrans.errors import InvalidArgument
from knittrans.types import DType, UnitKey

TENSOR_ALIGNMENT = 64
_TENSOR_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


def aligned(offset: int, alignment: int = TENSOR_ALIGNMENT) -> int:
    """``offset`` rounded up to a multiple of ``alignment``."""
    return -(-offset // alignment) * alignment


def check_tensor_name(name: str, field: str = "name") -> None:
    if not isinstance(name, str) or not _TENSOR_NAME.match(name):
        raise InvalidArgument(f"must be 1-128 characters of [A-Za-z0-9_.-], got {name!r}", field=field)


@dataclass(frozen=True, kw_only=True)
class TensorSpec:
    """One tensor of a packed micro-batch: ``shape`` elements of ``dtype`` at byte ``offset`` of the segment."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    offset: int

    def __post_init__(self) -> None:
        check_tensor_name(self.name)
        if not isinstance(self.dtype, DType):
            object.__setattr__(self, "dtype", DType.parse(str(self.dtype)))
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if any(d < 0 for d in self.shape):
            raise InvalidArgument(f"dimensions must be non-negative, got {self.shape}", field=f"{self.name}.shape")
        if not isinstance(self.offset, int) or self.offset < 0 or self.offset % TENSOR_ALIGNMENT:
            raise InvalidArgument(
                f"must be a non-negative multiple of {TENSOR_ALIGNMENT}, got {self.offset!r}",
                field=f"{self.name}.offset",
            )

    @property
    def num_elements(self) -> int:
        return math.prod(self.shape)

    @property
    def byte_length(self) -> int:
        return self.num_elements * self.dtype.itemsize

    @property
    def end(self) -> int:
        return self.offset + self.byte_length


@dataclass(frozen=True, kw_only=True)
class PackedEncodingUse:
    """Encoder output rows ``row_start …`` fill packed positions ``[packed_start, packed_end)``."""

    encoding_id: int
    key: UnitKey
    packed_start: int
    packed_end: int
    row_start: int
    trajectory_id: str
    reference: int

    def __post_init__(self) -> None:
        if not 0 <= self.packed_start < self.packed_end:
            raise InvalidArgument(
                f"needs 0 <= packed_start < packed_end, got [{self.packed_start}, {self.packed_end})",
                field="packed_start",
            )
        if self.row_start < 0:
            raise InvalidArgument("must be non-negative", field="row_start")

    @property
    def num_rows(self) -> int:
        return self.packed_end - self.packed_start
