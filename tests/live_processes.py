"""What a test sees of the machine's processes, read from /proc (no ps, no psutil)."""

from __future__ import annotations

import os
from pathlib import Path


def live_processes() -> dict[int, str]:
    """pid -> command line of every live process but this one (zombies have none)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if command:
            found[int(entry.name)] = command
    return found


def running_with(marker: str) -> list[str]:
    """Command lines of live processes (other than this one) that mention ``marker``."""
    return [command for command in live_processes().values() if marker in command]


def children_of(parent: int) -> dict[int, str]:
    """pid -> command line of every live process whose parent is ``parent``."""
    found = {}
    for pid, command in live_processes().items():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2:].split()[1]) == parent:  # the field after the state
            found[pid] = command
    return found
