"""A micro-batch's metadata (DESIGN.md §10): verl's ``non_tensor_batch``, typed.

Each trajectory's metadata values (``str``, ``bytes`` or JSON, see :mod:`knittrans.values`) travel inline with its
report and assignment; the sidecar puts them in the micro-batch's descriptor, one entry per packed item, and the
trainer reads them here as one column per name, aligned with ``MicroBatch.trajectory_ids`` (``None`` where an item
lacks an optional value; a name no item of the micro-batch has is absent).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from knittrans.errors import InvalidArgument
from knittrans.values import MetadataValue


@dataclass(frozen=True, kw_only=True, eq=False)
class NonTensorBatch(Mapping[str, tuple[Any, ...]]):
    """Metadata columns by name: ``batch["uid"][k]`` is item k's value (the string, the bytes or the parsed
    JSON; None where it has none). A read-only mapping; :meth:`to_numpy` gives verl's object arrays."""

    trajectory_ids: tuple[str, ...]
    columns: Mapping[str, tuple[Any, ...]]

    def __post_init__(self) -> None:
        for name, column in self.columns.items():
            if len(column) != len(self.trajectory_ids):
                raise InvalidArgument(f"has {len(column)} values for {len(self.trajectory_ids)} items",
                                      field=f"columns.{name}")

    @staticmethod
    def of(trajectory_ids: Sequence[str], items: Sequence[Sequence[tuple[str, MetadataValue]]]) -> NonTensorBatch:
        """The columns of per-item metadata (``items[k]``: item k's (name, value) pairs)."""
        if len(items) not in (0, len(trajectory_ids)):
            raise InvalidArgument("needs one entry per item", field="item_metadata")
        names = sorted({name for item in items for name, _ in item})
        by_item = [dict(item) for item in items]
        columns = {name: tuple(None if (value := values.get(name)) is None else value.decoded()
                               for values in by_item) for name in names}
        return NonTensorBatch(trajectory_ids=tuple(trajectory_ids), columns=columns)

    def __getitem__(self, name: str) -> tuple[Any, ...]:
        try:
            return self.columns[name]
        except KeyError:
            raise InvalidArgument(f"no metadata {name!r}; have {sorted(self.columns)}", field="name") from None

    def get(self, name: str, default: Any = None) -> Any:
        """The column, or ``default`` when no item of the micro-batch has this metadata."""
        return self.columns.get(name, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self.columns)

    def __len__(self) -> int:
        return len(self.columns)

    def to_numpy(self) -> dict[str, np.ndarray]:
        """verl's ``non_tensor_batch``: one object array per name, aligned with the items."""
        arrays = {}
        for name, column in self.columns.items():
            array = np.empty(len(column), dtype=object)
            array[:] = column
            arrays[name] = array
        return arrays
