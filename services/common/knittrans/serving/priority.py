"""Lowering a background process's CPU priority, so that the trainer ranks sharing its cores get them first.

Two levels, because of the kernel's autogroups (``kernel.sched_autogroup_enabled``, the default of many
distributions): the scheduler shares the CPU between sessions first and only then between a session's threads by
their niceness. So a process in a session of its own competes with the trainer's session at full weight, whatever
its threads' niceness; it is lowered only if its session's group is too. Only a session leader sets the group: a
process in the trainer's session must not lower the trainer's priority with its own.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

TASKS = "/proc/self/task"  # one entry per thread of this process (Linux)
AUTOGROUP = Path("/proc/self/autogroup")  # this session's scheduling group, where the kernel has autogroups
MAX_NICE = 19


def lower_cpu_priority(nice: int) -> None:
    """Make every thread of this process, and its session's group if it leads its session, at least ``nice`` nice.

    Linux keeps niceness per thread: each thread already running (the runtime's, the import's) is set, and those
    started later inherit it from their creator. Raising niceness needs no privilege; lowering it does, so a
    thread that started nicer keeps its own."""
    threads = [int(t) for t in os.listdir(TASKS)] if os.path.isdir(TASKS) else [0]
    for thread in threads:
        try:
            if nice > os.getpriority(os.PRIO_PROCESS, thread):
                os.setpriority(os.PRIO_PROCESS, thread, nice)
        except ProcessLookupError:  # it ended meanwhile
            continue
        except PermissionError as error:  # a sandbox that forbids it: go on at the priority we have
            logger.warning("cannot set CPU niceness %d (%s); running at niceness %d", nice, error,
                           os.getpriority(os.PRIO_PROCESS, 0))
            return
    logger.debug("CPU niceness %d for %d threads", nice, len(threads))
    lower_session_priority(nice)


def lower_session_priority(nice: int) -> None:
    """Make this process's session group at least ``nice`` nice, if the process leads its session."""
    if os.getsid(0) != os.getpid() or not AUTOGROUP.exists():
        return
    try:
        current = int(AUTOGROUP.read_text().split()[-1])  # "/autogroup-<id> nice <n>"
        if nice > current:
            AUTOGROUP.write_text(str(nice))
    except (OSError, ValueError, IndexError) as error:
        logger.warning("cannot set the CPU niceness of this session's scheduling group to %d (%s)", nice, error)
