"""``freeze_startup_heap``: what start-up left is out of later collections, and start-up's garbage is freed, not
frozen (a frozen cycle would never be collected). Run in a fresh interpreter, so the test's own heap and any
freeze by another test do not count."""

from __future__ import annotations

import subprocess
import sys

_PROBE = """
import gc, weakref
from knittrans.reorg import cli

class Node:
    pass

garbage = Node()
garbage.self = garbage  # a cycle: only the cyclic collector frees it
dead = weakref.ref(garbage)
del garbage
gc.disable()  # nothing collects it behind the call's back
cli.freeze_startup_heap()
print(dead() is None, gc.get_freeze_count(), len(gc.get_objects()))
"""


def test_the_startup_heap_is_frozen_and_its_garbage_freed() -> None:
    result = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, check=True)
    freed, frozen, tracked_after = result.stdout.split()
    assert freed == "True"
    assert int(frozen) > 10_000  # the imports' objects (grpc, protobuf, numpy, the sidecar's modules)
    assert int(tracked_after) < 100  # what a collection still walks
