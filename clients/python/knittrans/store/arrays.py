"""Numpy arrays and torch tensors as unit bytes, and unit bytes as numpy arrays.

Units are little-endian and C-contiguous. Torch is imported only when a tensor is passed; bfloat16,
which numpy lacks, travels as its 16-bit pattern and is viewed back as ``uint16`` (or as bfloat16 by
torch / ml_dtypes callers).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from knittrans.errors import InvalidArgument
from knittrans.packed.dtypes import numpy_dtype
from knittrans.store.buffers import BufferLike, byte_view
from knittrans.types import DType, UnitHeader

_FROM_NUMPY_NAME = {d.value: d for d in DType}


def is_tensor(value: Any) -> bool:
    return type(value).__module__.split(".", 1)[0] == "torch"


def to_numpy(value: Any, *, field: str) -> tuple[np.ndarray, DType]:
    """A C-contiguous little-endian numpy array with the bytes of ``value``, and its unit dtype."""
    if is_tensor(value):
        return _tensor_to_numpy(value, field=field)
    if not isinstance(value, np.ndarray):
        raise InvalidArgument(f"must be a numpy array or a torch tensor, got {type(value).__name__}", field=field)
    dtype = _FROM_NUMPY_NAME.get(value.dtype.name)
    if dtype is None:
        raise InvalidArgument(
            f"unknown dtype {value.dtype}; expected one of {', '.join(d.value for d in DType)}", field=field
        )
    if value.dtype.byteorder == ">" or (value.dtype.byteorder == "=" and sys.byteorder == "big"):
        value = value.astype(value.dtype.newbyteorder("<"))
    return np.ascontiguousarray(value), dtype


def _tensor_to_numpy(tensor: Any, *, field: str) -> tuple[np.ndarray, DType]:
    import torch

    name = str(tensor.dtype).removeprefix("torch.")
    if name not in _FROM_NUMPY_NAME:
        raise InvalidArgument(
            f"unknown dtype {tensor.dtype}; expected one of {', '.join(d.value for d in DType)}", field=field
        )
    tensor = tensor.detach().to("cpu").contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(np.uint16), DType.BFLOAT16
    return to_numpy(tensor.numpy(), field=field)


def array_bytes(array: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array as a flat unsigned-byte view (no copy)."""
    return memoryview(array.reshape(-1).view(np.uint8).data)


def header_of(array: np.ndarray, dtype: DType, *, sequence: bool) -> UnitHeader:
    """The header of a C-contiguous array; ``sequence`` makes its leading axis the token axis."""
    from knittrans.store.hashing import content_hash

    return UnitHeader(
        dtype=dtype,
        shape=tuple(int(d) for d in array.shape),
        byte_length=int(array.nbytes),
        content_hash=content_hash(array_bytes(array)),
        seq_axis=0 if sequence else None,
    )



def view_unit(data: BufferLike, header: UnitHeader, *, num_tokens: int | None = None) -> np.ndarray:
    """View stored bytes as an array of the header's dtype and shape, without copying.

    ``num_tokens`` views a token slice (its leading axis) instead of the whole unit.
    """
    shape = header.shape
    if num_tokens is not None:
        if header.seq_axis != 0:
            raise InvalidArgument("only sequence units can be viewed as a token slice", field="num_tokens")
        shape = (num_tokens, *shape[1:])
    count = int(np.prod(shape, dtype=np.int64))
    view = byte_view(data)
    needed = count * header.dtype.itemsize
    if view.nbytes < needed:
        raise InvalidArgument(f"needs {needed} bytes, got {view.nbytes}", field="data")
    return np.frombuffer(view, dtype=numpy_dtype(header.dtype), count=count).reshape(shape)
