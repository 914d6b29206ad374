"""The names of the tensors a packed backbone micro-batch holds, and which reported names may become one.

The reorg packer names a tensor after each stored field and generates the rest (see
:mod:`knittrans.reorg.packing`). The admission service checks every reported field and scalar name against
these rules at ingest, so a name that the packer could not use, or that would collide with a generated
tensor, is refused with the field named instead of failing a mini-batch later. Pure: no I/O.
"""

from __future__ import annotations

import re

LABELS = "labels"
POSITION_IDS = "position_ids"
CU_SEQLENS = "cu_seqlens"
CU_SEQLENS_GLOBAL = "cu_seqlens_global"
SEQ_LENGTHS = "seq_lengths"
GENERATED_NAMES = frozenset({LABELS, POSITION_IDS, CU_SEQLENS, CU_SEQLENS_GLOBAL, SEQ_LENGTHS})
SCALAR_PREFIX = "scalar."
SCALAR_PRESENT_PREFIX = "scalar_present."
LOOK_AHEAD_SUFFIX = ".next"
MASK_SUFFIX = ".mask"  # a response-only field's mask: 1 where the packed field holds a stored value

TENSOR_NAME_LENGTH = 128
# Room for the longest suffix or prefix the packer adds to a reported name.
REPORTED_NAME_LENGTH = TENSOR_NAME_LENGTH - len(SCALAR_PRESENT_PREFIX)
_REPORTED_NAME = re.compile(rf"^[A-Za-z0-9_.-]{{1,{REPORTED_NAME_LENGTH}}}\Z")
# A non-sequence field whose items differ in shape is split into `<name>.<item>` tensors.
_ITEM_SUFFIX = re.compile(r"\.[0-9]+\Z")


def field_name_problem(name: str) -> str | None:
    """Why a stored field may not be named ``name`` (None when it may)."""
    if not _REPORTED_NAME.match(name):
        return f"must be 1-{REPORTED_NAME_LENGTH} characters of [A-Za-z0-9_.-] (it names a tensor), got {name!r}"
    if name in GENERATED_NAMES:
        return f"{name!r} is the name of a generated tensor"
    if name.startswith((SCALAR_PREFIX, SCALAR_PRESENT_PREFIX)) or name.endswith((LOOK_AHEAD_SUFFIX, MASK_SUFFIX)) \
            or _ITEM_SUFFIX.search(name):
        return (f"{name!r} could collide with a generated tensor (no {SCALAR_PREFIX!r} or {SCALAR_PRESENT_PREFIX!r} "
                f"prefix, no {LOOK_AHEAD_SUFFIX!r}, {MASK_SUFFIX!r} or '.<digits>' suffix)")
    return None


def scalar_name_problem(name: str) -> str | None:
    """Why a scalar may not be named ``name`` (None when it may)."""
    if not _REPORTED_NAME.match(name):
        return f"must be 1-{REPORTED_NAME_LENGTH} characters of [A-Za-z0-9_.-] (it names a tensor), got {name!r}"
    return None
