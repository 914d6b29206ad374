"""Shared-memory segments: mode 0600, attachers never delete the owner's segment, prefix cleanup."""

import os
import stat
import subprocess
import sys
import uuid

from knittrans.shm import SHM_DIR, OwnedSegment, list_segments, remove_segments, segment_prefix


def test_attaching_process_exit_does_not_delete_the_segment() -> None:
    prefix = segment_prefix(f"test{uuid.uuid4().hex[:8]}", "backbone/dp0/cp0")
    owned = OwnedSegment(prefix + "slot0", 4096)
    try:
        owned.buf[:5] = b"hello"
        assert stat.S_IMODE(os.stat(SHM_DIR / owned.name).st_mode) == 0o600
        reader = (
            "import sys; from knittrans.shm import AttachedSegment; "
            "s = AttachedSegment(sys.argv[1]); print(bytes(s.buf[:5]).decode()); s.close()"
        )
        out = subprocess.run([sys.executable, "-c", reader, owned.name], capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "hello"
        assert "leaked" not in out.stderr
        assert list_segments(prefix) == [owned.name]
    finally:
        owned.unlink()
    assert list_segments(prefix) == []


def test_remove_segments_cleans_a_crashed_owner() -> None:
    prefix = segment_prefix(f"test{uuid.uuid4().hex[:8]}", "encoder:vision/dp1/cp0")
    crasher = (
        "import os, sys; from knittrans.shm import OwnedSegment; "
        "[OwnedSegment(sys.argv[1] + f'slot{i}', 1024) for i in range(3)]; os._exit(0)"
    )
    subprocess.run([sys.executable, "-c", crasher, prefix], check=True)
    assert len(list_segments(prefix)) == 3  # nobody cleaned up after the crash
    assert len(remove_segments(prefix)) == 3
    assert list_segments(prefix) == []


def test_segments_never_start_or_write_to_multiprocessing_resource_tracker() -> None:
    """A trainer under load had its attach fail with BrokenPipeError on the tracker's pipe: the tracker process was
    gone. Creating, attaching, closing and unlinking must work with a tracker that cannot be reached at all."""
    prefix = segment_prefix(f"test{uuid.uuid4().hex[:8]}", "backbone/dp0/cp0")
    script = (
        "import sys\n"
        "from multiprocessing import resource_tracker\n"
        "def unreachable(*args, **kwargs):\n"
        "    raise BrokenPipeError(32, 'the resource tracker is gone')\n"
        "resource_tracker._resource_tracker.ensure_running = unreachable\n"
        "resource_tracker._resource_tracker._send = unreachable\n"
        "from knittrans.shm import AttachedSegment, OwnedSegment\n"
        "owned = OwnedSegment(sys.argv[1] + 'slot0', 4096)\n"
        "owned.buf[:5] = b'hello'\n"
        "attached = AttachedSegment(owned.name)\n"
        "view = attached.buf[:5]\n"
        "attached.close()  # a view still exported: the mapping is left to it\n"
        "print(bytes(view).decode())\n"
        "owned.unlink()\n"
        "print(resource_tracker._resource_tracker._pid)\n"
    )
    try:
        out = subprocess.run([sys.executable, "-c", script, prefix], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["hello", "None"], out.stdout
        assert list_segments(prefix) == []
    finally:
        remove_segments(prefix)
