"""When the admission service collects garbage: at the end of a call, not in the middle of the report path."""

from __future__ import annotations

import gc

YOUNG_COLLECTION = 2_000  # objects allocated since the last collection


def collect_young_objects() -> None:
    """Collect the young generation now if it has grown: a report leaves thousands of new objects (the ledger's
    entries), and collecting them at the end of the call, once its assignments went out, keeps the pause off the
    report-to-assignment path (see app.tune_garbage_collector). Older generations are collected here too, as
    often as the collector's thresholds ask for relative to young collections."""
    counts, thresholds = gc.get_count(), gc.get_threshold()
    if counts[0] < YOUNG_COLLECTION:
        return
    generation = 0
    if counts[1] + 1 >= thresholds[1]:
        generation = 2 if counts[2] + 1 >= thresholds[2] else 1
    gc.collect(generation)
