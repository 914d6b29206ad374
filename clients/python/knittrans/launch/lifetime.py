"""Child processes tied to the life of the process that starts them.

Every local launcher (the stack's process group, Redis, Mooncake, the chaos supervisor's restarts) starts its
children through :func:`tied_to_this_process`: a small launcher asks the kernel (``PR_SET_PDEATHSIG``) for SIGTERM
when its parent dies, even by SIGKILL, then execs the real command, so that a killed driver leaves no orphaned
server (each child is its own session, out of reach of the terminal's signals). The request follows the thread
that started the child, so start them from the main thread.

Not ``preexec_fn``: that makes subprocess fork and run Python in the child before exec, and a parent with busy
gRPC threads must not fork that way (gRPC skips its fork handlers then, and the children's pollers failed with
EBADF and aborted). The launcher is spawned like any command, with no code between fork and exec.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Sequence

_PR_SET_PDEATHSIG = 1  # prctl(2)


def die_with_parent() -> None:
    """Ask for SIGTERM when the parent dies. (Linux; elsewhere the process simply survives its parent.)"""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def tied_to_this_process(argv: Sequence[str]) -> list[str]:
    """``argv`` behind the launcher that ties it to this process's life (see the module docstring)."""
    return [sys.executable, "-m", "knittrans.launch.lifetime", str(os.getpid()), *argv]


def _exec_tied(parent: int, argv: list[str]) -> None:
    die_with_parent()
    if os.getppid() != parent:  # the parent died before the request: do not outlive it
        sys.exit(128 + signal.SIGTERM)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    _exec_tied(int(sys.argv[1]), sys.argv[2:])
