"""Mooncake-specific behaviour against a real master and segment owner."""

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from knittrans.errors import StoreError, StoreFullError, Unavailable, UnitNotFound
from knittrans.launch.mooncake import MooncakeClusterConfig, start_mooncake
from knittrans.launch.ports import free_port
from knittrans.store.arrays import array_bytes, header_of
from knittrans.store.factory import open_store
from knittrans.store.keys import trajectory_unit_key
from knittrans.store.mooncake import MooncakeStoreConfig, MooncakeUnitStore
from knittrans.store.mooncake_errors import MooncakeCode
from knittrans.store.protocol import UnitWrite
from knittrans.types import ByteRange, DType, TrajectoryId, UnitKey, VersionSegment
from tests.fixtures.mooncake import mooncake_store_config

MIB = 1 << 20


def mib_unit(key: str, seed: int, mib: int = 1) -> tuple[UnitWrite, np.ndarray]:
    array = np.random.default_rng(seed).integers(0, 255, size=mib * MIB, dtype=np.uint8)
    return UnitWrite.of(key, header_of(array, DType.UINT8, sequence=True), array_bytes(array)), array


@pytest.fixture
def small_store(small_mooncake_cluster):
    store = MooncakeUnitStore(mooncake_store_config(small_mooncake_cluster, full_retry_seconds=1.0))
    yield store
    store.close()


def test_filling_past_the_eviction_watermark_loses_no_acknowledged_unit(small_store, small_mooncake_cluster):
    capacity = small_mooncake_cluster.config.segment_size
    raw = small_store.raw_client
    acknowledged: dict[str, np.ndarray] = {}
    # pinned units up to about a third of the store
    for i in range(10):
        write, array = mib_unit(f"evict/pinned/{i}", i)
        small_store.put_many([write])
        acknowledged[write.key] = array
    # unpinned objects written with the raw client push it far past the 90% watermark
    from mooncake.store import ReplicateConfig

    filler = np.zeros(MIB, dtype=np.uint8)
    unpinned = [f"evict/unpinned/{i}" for i in range(40)]
    stored_unpinned = [k for k in unpinned if raw.put_from(k, filler.ctypes.data, MIB, ReplicateConfig()) == 0]
    # keep writing pinned units until the store refuses: eviction makes room by dropping unpinned objects only
    with pytest.raises(StoreFullError):
        for i in range(10, 100):
            write, array = mib_unit(f"evict/pinned/{i}", i)
            small_store.put_many([write])
            acknowledged[write.key] = array
    assert len(acknowledged) * MIB > 0.9 * capacity
    time.sleep(1.0)  # eviction runs asynchronously on the master
    keys = [UnitKey(k) for k in acknowledged]
    assert small_store.exists(keys) == [True] * len(keys)
    for key, array in acknowledged.items():
        out = np.empty_like(array)
        small_store.get_into(UnitKey(key), out)
        np.testing.assert_array_equal(out, array)
    surviving_unpinned = sum(raw.batch_is_exist(stored_unpinned)) if stored_unpinned else 0
    assert surviving_unpinned < len(stored_unpinned), "eviction never ran, so this test proved nothing"
    small_store.delete_many([UnitKey(k) for k in unpinned] + keys)


def test_a_put_that_does_not_fit_raises_store_full_and_leaves_nothing(small_store, small_mooncake_cluster):
    capacity_mib = small_mooncake_cluster.config.segment_size // MIB
    fillers = [mib_unit(f"full/filler/{i}", i)[0] for i in range(capacity_mib - 3)]
    small_store.put_many(fillers)
    fits, _ = mib_unit("full/fits", 100)
    too_big, _ = mib_unit("full/too-big", 101, mib=4)
    with pytest.raises(StoreFullError):
        small_store.put_many([fits, too_big])  # after waiting full_retry_seconds for space
    assert small_store.exists([fits.key, too_big.key]) == [False, False]
    small_store.delete_many([w.key for w in fillers])
    assert small_store.put_many([too_big]).created == (too_big.key,)
    small_store.delete_many([too_big.key])


def test_delete_waits_out_a_read_lease(mooncake_store):
    write, array = mib_unit("lease/a", 7)
    mooncake_store.put_many([write])
    out = np.empty_like(array)
    mooncake_store.get_into(write.key, out)  # the read takes a lease on the unit
    assert mooncake_store.raw_client.remove(write.key, False) == MooncakeCode.OBJECT_HAS_LEASE
    assert mooncake_store.delete_many([write.key]) == 1
    assert mooncake_store.exists([write.key]) == [False]


class PausedAfterReplicaQuery:
    """The real client, pausing past the master's lease (200 ms in these tests) between a get session's replica
    query and its transfer, for the first ``sessions`` sessions, as a descheduled reader would."""

    def __init__(self, client, *, sessions: int, pause: float = 0.5) -> None:
        self._client = client
        self._left = sessions
        self._pause = pause

    def batch_get_session_start(self, keys):
        codes = self._client.batch_get_session_start(keys)
        if self._left:
            self._left -= 1
            time.sleep(self._pause)
        return codes

    def __getattr__(self, name):
        return getattr(self._client, name)


@pytest.mark.parametrize("sessions", [1, 3])
def test_ranges_whose_lease_ran_out_before_the_transfer_are_read_again(mooncake_cluster, sessions):
    store = MooncakeUnitStore(mooncake_store_config(mooncake_cluster))
    try:
        write, array = mib_unit(f"lease-out/{sessions}", sessions)
        store.put_many([write])
        store._client = PausedAfterReplicaQuery(store._client, sessions=sessions)
        out = np.zeros(3000, dtype=np.uint8)
        ranges = [ByteRange(offset=10, length=1000), ByteRange(offset=MIB - 2000, length=2000)]
        if sessions == 1:  # the read's own session reads it
            assert store.get_into(write.key, out, ranges) == 3000
            np.testing.assert_array_equal(out, np.r_[array[10:1010], array[MIB - 2000:]])
        else:  # the call's session and the read's own two ran out: a StoreError, which readers retry
            with pytest.raises(StoreError, match="LEASE_EXPIRED"):
                store.get_into(write.key, out, ranges)
        store.delete_many([write.key])
    finally:
        store.close()


@contextlib.contextmanager
def owner_stopped(cluster, seconds: float) -> Iterator[None]:
    """The segment owner SIGSTOPped now and resumed after ``seconds`` (and at the latest when the block ends)."""
    owner = cluster.owner.pid
    os.kill(owner, signal.SIGSTOP)
    resume = threading.Timer(seconds, os.kill, (owner, signal.SIGCONT))
    resume.start()
    try:
        yield
    finally:
        resume.join()
        os.kill(owner, signal.SIGCONT)


def test_a_reader_uses_no_cpu_while_its_transfer_waits_on_a_stopped_owner(mooncake_cluster, mooncake_store):
    """Mooncake's client polls a transfer's status in a loop; the store makes that loop spin on its idle-priority
    thread, so the reading thread itself sleeps however long the segment owner takes (here: stopped for 0.15 s,
    inside the tests' 200 ms lease)."""
    write, array = mib_unit("idle-wait/a", 11)
    mooncake_store.put_many([write])
    out = np.zeros_like(array)
    with owner_stopped(mooncake_cluster, 0.15):
        wall, cpu = time.perf_counter(), time.thread_time()
        mooncake_store.get_into(write.key, out)
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    np.testing.assert_array_equal(out, array)
    assert wall >= 0.1  # the read did wait for the owner
    assert cpu < 0.3 * wall
    mooncake_store.delete_many([write.key])


def test_a_whole_read_whose_lease_ran_out_is_read_again(mooncake_cluster, mooncake_store):
    """The segment owner stopped past the tests' 200 ms lease in the middle of a whole read: Mooncake ends the
    transfer with LEASE_EXPIRED once the owner resumes, and the store reads the unit again instead of failing (a
    suite run on the loaded machine failed that way when the idle-priority transfer thread was starved)."""
    write, array = mib_unit("lease-out/whole", 12)
    mooncake_store.put_many([write])
    out = np.zeros_like(array)
    with owner_stopped(mooncake_cluster, 0.4):
        assert mooncake_store.get_into(write.key, out) == array.nbytes
    np.testing.assert_array_equal(out, array)
    mooncake_store.delete_many([write.key])


WRITER = """
import sys, numpy as np
from knittrans.store.arrays import array_bytes, header_of
from knittrans.store.factory import open_store
from knittrans.store.mooncake import MooncakeStoreConfig, MooncakeUnitStore
from knittrans.store.protocol import UnitWrite
from knittrans.types import DType
store = MooncakeUnitStore(MooncakeStoreConfig(master_address=sys.argv[1]))
array = np.arange(1 << 16, dtype=np.int32)
store.put_many([UnitWrite.of("outlive/a", header_of(array, DType.INT32, sequence=True), array_bytes(array))])
store.close()
"""


def test_units_outlive_the_process_that_wrote_them(mooncake_cluster, mooncake_store):
    subprocess.run([sys.executable, "-c", WRITER, mooncake_cluster.master_address], check=True, capture_output=True,
                   timeout=60)
    out = np.zeros(1 << 16, dtype=np.int32)
    mooncake_store.get_into(UnitKey("outlive/a"), out)
    np.testing.assert_array_equal(out, np.arange(1 << 16, dtype=np.int32))
    mooncake_store.delete_many([UnitKey("outlive/a")])


def test_unreachable_master_is_unavailable():
    with pytest.raises(Unavailable):
        MooncakeUnitStore(MooncakeStoreConfig(master_address=f"127.0.0.1:{free_port()}", connect_timeout_seconds=1))


def test_a_submit_that_fills_the_store_leaves_none_of_its_units(small_store, small_mooncake_cluster):
    from knittrans.rollout import RolloutClient

    capacity_mib = small_mooncake_cluster.config.segment_size // MIB
    fillers = [mib_unit(f"submit-full/filler/{i}", i)[0] for i in range(capacity_mib - 6)]
    small_store.put_many(fillers)
    tokens = 1 << 18
    fields = {  # batches of 2 + 1 MiB, then 4 MiB, which does not fit: the first batch must be removed again
        "input_ids": np.arange(tokens, dtype=np.int64),
        "logprobs": np.zeros(tokens, dtype=np.float32),
        "routing": np.ones((tokens, 16), dtype=np.uint8),
    }
    client = RolloutClient(small_store, namespace="submit-full", batch_bytes=3 * MIB)
    with pytest.raises(StoreFullError):
        client.submit(fields, trajectory_id="big", sample_id="s", source="math", rollout_step=0,
                      segments=[VersionSegment(version=0, num_tokens=tokens)], loss_mask_field=None)
    keys = [trajectory_unit_key("submit-full", TrajectoryId("big"), name) for name in fields]
    assert small_store.exists(keys) == [False, False, False]
    small_store.delete_many([w.key for w in fillers])


def test_a_unit_larger_than_the_whole_store_fails_at_once_naming_key_and_sizes(small_mooncake_cluster):
    """Opened from the launcher's URL, the store knows its largest segment; no space could ever be freed."""
    store = open_store(small_mooncake_cluster.store_url + "&full_retry_seconds=3600")
    too_big, _ = mib_unit("huge/a", 5, mib=40)
    outcome: queue.Queue = queue.Queue()

    def attempt() -> None:
        try:
            outcome.put(store.put_many([too_big]))
        except Exception as exc:
            outcome.put(exc)

    threading.Thread(target=attempt, daemon=True).start()
    # liveness bound only: before the fix the put waited full_retry_seconds (an hour) for space
    error = outcome.get(timeout=120)
    assert isinstance(error, StoreFullError), error
    assert error.field == "huge/a"
    assert str(40 * MIB) in str(error) and str(32 * MIB) in str(error)
    assert store.exists([too_big.key]) == [False]
    store.close()


# -- leases: the launcher sets them, and deletion does not wait for them --------------------------------------

LONG_LEASE_MS = 5000  # outlasts the few calls the tests make while a lease must still hold


def child_command_lines(pid: int) -> list[str]:
    lines = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
            if int(fields[1]) == pid:
                lines.append((stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except (OSError, ValueError, IndexError):
            continue
    return lines


@pytest.fixture(scope="module")
def launched_cluster(tmp_path_factory):
    """The documented command, run verbatim: ``python -m knittrans.launch.mooncake --lease-ttl-ms N``."""
    log = open(tmp_path_factory.mktemp("launcher") / "launcher.log", "wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "knittrans.launch.mooncake", "--segment-size-mib", "64",
         "--lease-ttl-ms", str(LONG_LEASE_MS)],
        stdout=subprocess.PIPE, stderr=log, text=True,
    )
    url = process.stdout.readline().strip()
    try:
        assert url.startswith("mooncake://"), f"the launcher printed {url!r} and exited with {process.poll()}"
        yield url, process.pid
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        log.close()


def test_the_launcher_passes_the_lease_to_the_master(launched_cluster):
    _, pid = launched_cluster
    masters = [line for line in child_command_lines(pid) if "mooncake_master" in line]
    assert len(masters) == 1
    assert f"--default_kv_lease_ttl={LONG_LEASE_MS}" in masters[0].split()


def test_delete_right_after_a_read_returns_while_the_lease_holds_and_the_unit_goes_later(launched_cluster):
    url, _ = launched_cluster
    store, observer = open_store(url), open_store(url)
    try:
        write, array = mib_unit("leased/a", 11)
        store.put_many([write])
        store.get_into(write.key, np.empty_like(array))  # the read leases the unit for LONG_LEASE_MS
        assert store.delete_many([write.key]) == 1
        # delete_many has returned, and the lease still holds: it did not wait for the lease
        assert store.raw_client.remove(write.key, False) == MooncakeCode.OBJECT_HAS_LEASE
        assert store.exists([write.key]) == [False]
        with pytest.raises(UnitNotFound):
            store.get_into(write.key, np.empty_like(array))
        assert store.delete_many([write.key]) == 0
        # the background removal ends once the lease does (polling only the store's own bookkeeping: any
        # Mooncake read of the unit would renew its lease)
        deadline = time.monotonic() + 120
        while store.pending_removals() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert store.pending_removals() == 0
        assert observer.exists([write.key]) == [False]
    finally:
        store.close()
        observer.close()


def test_a_key_deleted_under_a_lease_can_be_written_again_with_new_content(launched_cluster):
    url, _ = launched_cluster
    store = open_store(url)
    try:
        old, old_array = mib_unit("leased/b", 12)
        store.put_many([old])
        store.get_into(old.key, np.empty_like(old_array))
        store.delete_many([old.key])
        new, new_array = mib_unit("leased/b", 13)
        assert store.put_many([new]).created == (new.key,)
        out = np.empty_like(new_array)
        store.get_into(new.key, out)
        np.testing.assert_array_equal(out, new_array)
        assert store.pending_removals() == 0  # the background removal cannot take the new unit
        store.delete_many([new.key])
    finally:
        store.close()


def test_closing_a_store_whose_master_died_does_not_wait_out_the_leases(tmp_path):
    """A killed job's processes all stop at once, Mooncake's master among them. A client that still owes the
    removal of leased units then gets no answer from anyone: its close() must stop waiting for the leases at the
    first unanswered round, not after ``lease_retry_seconds``."""
    cluster = start_mooncake(MooncakeClusterConfig(segment_size=32 * MIB, lease_ttl_ms=600_000), log_dir=tmp_path)
    store = MooncakeUnitStore(mooncake_store_config(cluster, lease_retry_seconds=3600.0))
    try:
        write, array = mib_unit("orphan/a", 21)
        store.put_many([write])
        store.get_into(write.key, np.empty_like(array))  # leased for ten minutes
        store.delete_many([write.key])
        assert store.pending_removals() == 1
        cluster.master.kill()
        cluster.master.wait()
        # What the admission service's deleter waits on: it must fail, naming the unit, not wait out the hour.
        waited: queue.Queue = queue.Queue()

        def wait_removed() -> None:
            try:
                store.wait_removed([write.key])
                waited.put(None)
            except Exception as exc:
                waited.put(exc)

        threading.Thread(target=wait_removed, daemon=True).start()
        error = waited.get(timeout=120)  # a liveness bound, far below the hour
        assert isinstance(error, StoreError) and error.field == write.key, error
        closing = threading.Thread(target=store.close, daemon=True)
        closing.start()
        closing.join(timeout=120)  # a liveness bound, far below the hour it waited for before
        assert not closing.is_alive(), "close() still waits for a lease the dead master cannot end"
        assert store.pending_removals() == 1  # left in the store, and said so
    finally:
        cluster.stop()
