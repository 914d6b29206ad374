"""``kill -USR1 PID`` on a KnitTrans process writes every thread's Python stack to its stderr; it goes on running.

A stalled job (a step that never ends, a mini-batch never released) logs nothing by itself: whoever waits has
no error to report. The stacks say which call each thread of each process is in, without stopping the job or
installing a profiler on the node. Entry points register it (the ``knittrans`` command, and programs that run
trainer ranks of their own); a library never claims a signal for itself.
"""

from __future__ import annotations

import faulthandler
import io
import signal
import sys

STACK_DUMP_SIGNAL = signal.SIGUSR1


def dump_stacks_on_signal() -> None:
    """Register the dump, to stderr's file descriptor; where stderr has none (the command run in a process that
    captures its output, as a test does), leave the signal alone."""
    try:
        sys.stderr.fileno()
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return
    faulthandler.register(STACK_DUMP_SIGNAL, file=sys.stderr, all_threads=True, chain=False)
