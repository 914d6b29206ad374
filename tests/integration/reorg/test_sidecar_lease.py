"""A sidecar holds its node-local names (issue 15 §5), with ``knittrans reorg serve`` as real processes.

Two jobs run side by side: ``J`` and ``J-backbone-dp0-cp0``, a live other job whose segments began with J's
sidecar's prefix while prefixes ended in ``-``. Each has an admission service, a sidecar and a packed micro-batch
in shared memory.

- a second sidecar for the same (job, role, ranks) is refused, naming the holder, and touches nothing;
- after the holder is killed with kill -9, a new one starts at once, removes the dead holder's segments, and leaves
  the other job's segments alone.
"""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

from knittrans.shm import SHM_DIR

from .single_sidecar_job import Job, segments_of, wait_for


def test_a_sidecar_holds_its_names_and_cleans_up_only_after_a_dead_holder(tmp_path: Path) -> None:
    name = f"lease{uuid.uuid4().hex[:8]}"
    job, other = Job(tmp_path, name), None
    try:
        other = Job(tmp_path, f"{name}-backbone-dp0-cp0")
        other_sidecar = other.start_sidecar()
        other.feed()
        wait_for(lambda: segments_of(other.job), "segments of the other job", other_sidecar)
        other_segments = segments_of(other.job)

        holder = job.start_sidecar()
        job.feed()
        wait_for(lambda: segments_of(job.job), "segments of the holder", holder)
        held_segments = segments_of(job.job)

        try:
            job.start_sidecar()
            raise AssertionError("a second sidecar of the same job and ranks started")
        except RuntimeError as refused:
            message = str(refused)
        assert f"is held by pid {holder.popen.pid} on host {socket.gethostname()}, started " in message, message
        assert holder.alive() and set(held_segments) <= set(segments_of(job.job))  # touched nothing

        holder.kill()  # kill -9: its segments stay behind
        assert all((SHM_DIR / segment).exists() for segment in held_segments)
        successor = job.start_sidecar()  # at once: the kernel freed the dead holder's lock
        assert successor.alive(), successor.tail()
        assert not any((SHM_DIR / segment).exists() for segment in held_segments)
        assert all((SHM_DIR / segment).exists() for segment in other_segments), "another job's segments went"
        assert other_sidecar.alive(), other_sidecar.tail()
    finally:
        job.stop()
        if other is not None:
            other.stop()
