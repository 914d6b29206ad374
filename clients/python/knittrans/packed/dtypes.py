"""How a unit's dtype is viewed in numpy: little-endian, with bfloat16 (which numpy lacks) as its 16-bit pattern."""

from __future__ import annotations

from typing import Any

import numpy as np

from knittrans.types import DType

_TO_NUMPY: dict[DType, np.dtype[Any]] = {
    d: np.dtype("<u2") if d is DType.BFLOAT16 else np.dtype(d.value).newbyteorder("<") for d in DType
}


def numpy_dtype(dtype: DType) -> np.dtype[Any]:
    """The numpy dtype that views a unit's bytes (``uint16`` for bfloat16)."""
    return _TO_NUMPY[dtype]
