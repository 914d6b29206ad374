"""Child processes tied to the life of the process that starts them.

Every local launcher (the stack's process group, Redis, Mooncake, the chaos supervisor's restarts) passes
:func:`die_with_parent` as ``preexec_fn``: the kernel then sends the child SIGTERM when its parent dies, even by
SIGKILL, so that a killed driver leaves no orphaned server (each child is its own session, out of reach of the
terminal's signals). The signal follows the thread that started the child, so start them from the main thread.
"""

from __future__ import annotations

import ctypes
import signal

_PR_SET_PDEATHSIG = 1  # prctl(2)


def die_with_parent() -> None:
    """Runs in the child before exec: ask for SIGTERM when the parent dies. (Linux; elsewhere the child simply
    survives its parent.)"""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
