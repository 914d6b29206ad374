"""Helpers shared by the store tests."""

import numpy as np

from knittrans.store.arrays import array_bytes, header_of, to_numpy
from knittrans.store.protocol import UnitWrite


def unit(key: str, array: np.ndarray, *, sequence: bool = True, content_addressed: bool = False) -> UnitWrite:
    """A write of ``array`` under ``key``, with its header computed from the array."""
    array, dtype = to_numpy(array, field=key)
    return UnitWrite.of(
        key, header_of(array, dtype, sequence=sequence), array_bytes(array), content_addressed=content_addressed
    )
