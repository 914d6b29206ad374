"""Domain-object builders shared by the test suites (metadata only; no bytes are stored)."""

from __future__ import annotations

import hashlib

from knittrans.types import DType, UnitHeader, UnitKind, UnitRef


def digest(text: str) -> str:
    """A valid content hash derived from ``text``."""
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def token_unit(trajectory_id: str, field: str, tokens: int, dtype: DType = DType.INT32, width: int = 1) -> UnitRef:
    """A per-token field unit of ``tokens`` rows of ``width`` elements, keyed ``<trajectory_id>/<field>``."""
    shape = (tokens,) if width == 1 else (tokens, width)
    return UnitRef(
        key=f"{trajectory_id}/{field}",
        field_name=field,
        kind=UnitKind.TOKEN_FIELD,
        header=UnitHeader(dtype=dtype, shape=shape, byte_length=tokens * width * dtype.itemsize,
                          content_hash=digest(f"{trajectory_id}/{field}"), seq_axis=0),
    )
