"""When the admission service collects garbage: at the end of a call, not in the middle of the report path."""

from __future__ import annotations

import gc

YOUNG_COLLECTION = 2_000  # objects allocated since the last collection


def collect_young_objects() -> None:
    """Collect the young generation now if it has grown: a report leaves thousands of new objects (the ledger's
    entries), and collecting them at the end of the call keeps the pause out of the middle of the next report
    (see app.tune_garbage_collector). A report that admitted a mini-batch pays it before that mini-batch's
    streams run (they run once the call returns); skipping it there was measured worse, as the young
    generation then grew until the backstop thresholds collected it in bigger pauses. Older generations are
    collected here too, as often as the collector's thresholds ask for relative to young collections."""
    counts, thresholds = gc.get_count(), gc.get_threshold()
    if counts[0] < YOUNG_COLLECTION:
        return
    generation = 0
    if counts[1] + 1 >= thresholds[1]:
        generation = 2 if counts[2] + 1 >= thresholds[2] else 1
    gc.collect(generation)
