"""Each service freezes its start-up heap: what start-up left is out of later collections, and start-up's garbage
is freed, not frozen (a frozen cycle would never be collected). The admission service's ``tune_garbage_collector``
and the sidecar's ``freeze_startup_heap`` are each called in a fresh interpreter, so the test's own heap and any
freeze by another test do not count."""

from __future__ import annotations

import subprocess
import sys

import pytest

_PROBE = """
import gc, weakref
{imports}

class Node:
    pass

garbage = Node()
garbage.self = garbage  # a cycle: only the cyclic collector frees it
dead = weakref.ref(garbage)
del garbage
gc.disable()  # nothing collects it behind the call's back
{call}
print(dead() is None, gc.get_freeze_count(), len(gc.get_objects()))
"""

ENTRY_POINTS = {
    "reorg sidecar": ("from knittrans.reorg import cli", "cli.freeze_startup_heap()"),
    "admission service": ("from knittrans.admission.service import app", "app.tune_garbage_collector()"),
}


@pytest.mark.parametrize("service", sorted(ENTRY_POINTS))
def test_the_startup_heap_is_frozen_and_its_garbage_freed(service: str) -> None:
    imports, call = ENTRY_POINTS[service]
    probe = _PROBE.format(imports=imports, call=call)
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    freed, frozen, tracked_after = result.stdout.split()
    assert freed == "True"
    assert int(frozen) > 10_000  # the imports' objects (grpc, protobuf, numpy, the service's modules)
    assert int(tracked_after) < 100  # what a collection still walks
