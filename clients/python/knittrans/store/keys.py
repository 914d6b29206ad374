"""Storage keys of atomic units.

``<namespace>/t/<trajectory id>/<field>`` for the units of one trajectory, and
``<namespace>/s/<sample id>/mm/<content hash>`` for a multimodal input, which every trajectory of the
sample shares. Field names and namespaces contain no ``/``, so a key names exactly one unit.
"""

from __future__ import annotations

import re

from knittrans.errors import InvalidArgument
from knittrans.types import SampleId, TrajectoryId, UnitKey, check_id

_SIMPLE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_HEX = re.compile(r"^[0-9a-f]{8,128}$")


def check_simple_name(value: str, field: str) -> None:
    """Namespaces and field names: letters, digits, ``_``, ``.`` and ``-``, at most 64 characters."""
    if not isinstance(value, str) or not _SIMPLE_NAME.match(value) or len(value) > 64:
        raise InvalidArgument(f"must be 1-64 characters of [A-Za-z0-9_.-], got {value!r}", field=field)


def trajectory_unit_key(namespace: str, trajectory_id: TrajectoryId, field_name: str) -> UnitKey:
    check_simple_name(namespace, "namespace")
    check_simple_name(field_name, "field_name")
    check_id(trajectory_id, "trajectory_id")
    key = f"{namespace}/t/{trajectory_id}/{field_name}"
    check_id(key, "key")
    return UnitKey(key)


def multimodal_unit_key(namespace: str, sample_id: SampleId, content_hash: str) -> UnitKey:
    check_simple_name(namespace, "namespace")
    check_id(sample_id, "sample_id")
    if not isinstance(content_hash, str) or not _HEX.match(content_hash):
        raise InvalidArgument("must be a lower-case hex digest", field="content_hash")
    key = f"{namespace}/s/{sample_id}/mm/{content_hash}"
    check_id(key, "key")
    return UnitKey(key)
