"""The Mooncake process that holds the store's segment dies (issue 15 §4, DESIGN.md §9), through real processes:
a Mooncake master and segment owner (``mooncake_client``), ``knittrans admission serve`` and one ``knittrans reorg
serve`` sidecar on that store, and a real :class:`TrainerClient` per TP rank (dp = cp = 1, tp = 2).

The owner is killed with kill -9 after a mini-batch's units were written into its segment and before they are
reported. Then: the mini-batch raises MiniBatchFailed on every TP rank, naming one of its trajectories and that
trajectory's unit; the admission status lists the same failure; nothing hangs (every wait has a deadline, the
hang guards of the client raise otherwise); the sidecar and the service stay up, and once a new segment owner
is mounted, the next mini-batch arrives with every byte as written.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from knittrans.client.admission import AdmissionClient
from knittrans.client.connection import ConnectionSettings
from knittrans.errors import MiniBatchFailed
from knittrans.launch.mooncake import MooncakeCluster, MooncakeClusterConfig, start_mooncake, start_segment_owner
from knittrans.reorg.settings import ReorgSettings
from knittrans.rollout import RolloutClient
from knittrans.shm import list_segments
from knittrans.store.factory import open_store
from knittrans.trainer import TrainerClient, TrainerSettings
from knittrans.types import TrajectoryMeta, VersionSegment

from .processes import Process, start_admission, start_sidecar

MIB = 1 << 20
SEGMENT = 64 * MIB
TP = 2
TOPOLOGY = {"backbone": {"dp": 1, "cp": 1, "tp": TP, "max_tokens_per_microbatch": 4096}}


def fields_of(index: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(index)
    length = 20 + 3 * index
    return {"input_ids": rng.integers(1, 50_000, length, dtype=np.int32),
            "loss_mask": np.ones(length, dtype=np.uint8),
            "routing": rng.integers(0, 256, (length, 4), dtype=np.uint8)}


def submit(rollout: RolloutClient, indices: range) -> dict[str, tuple[TrajectoryMeta, dict[str, np.ndarray]]]:
    written = {}
    for index in indices:
        fields = fields_of(index)
        meta = rollout.submit(fields, trajectory_id=f"t{index}", sample_id=f"s{index}", source="A", rollout_step=0,
                              segments=(VersionSegment(version=0, num_tokens=len(fields["input_ids"])),))
        written[meta.trajectory_id] = (meta, fields)
    return written


def on_every_rank(ranks: list[Iterator], consume: Callable[[Iterator], object]) -> list[object]:
    """The next mini-batch on every TP rank at once (they share the sidecar's ring slots)."""
    with ThreadPoolExecutor(len(ranks)) as pool:
        return list(pool.map(consume, ranks))


def failure_of(minibatches: Iterator) -> MiniBatchFailed:
    with pytest.raises(MiniBatchFailed) as caught:
        for _ in next(minibatches):
            pass
    return caught.value


def consume_intact(minibatches: Iterator, written: dict[str, tuple[TrajectoryMeta, dict[str, np.ndarray]]]) -> None:
    seen = []
    for micro in next(minibatches):
        tensors = {name: tensor.numpy() for name, tensor in micro.tensors.items()}
        cu = tensors["cu_seqlens"]
        for i, trajectory_id in enumerate(micro.trajectory_ids):
            fields = written[trajectory_id][1]
            rows = slice(int(cu[i]), int(cu[i]) + len(fields["input_ids"]))
            for name in ("input_ids", "routing"):
                np.testing.assert_array_equal(tensors[name][rows], fields[name])
            seen.append(trajectory_id)
    assert sorted(seen) == sorted(written)


def start_service_and_sidecar(tmp_path: Path, job: str, cluster: MooncakeCluster, processes: list[Process], *,
                              sidecar_settings: dict) -> tuple[Process, Process]:
    """The admission service (mini-batches of two trajectories) and the one sidecar of TOPOLOGY on the cluster's
    store, each appended to ``processes`` as it starts, so the caller stops whatever did."""
    admission = start_admission(tmp_path, job=job, store=cluster.store_url, topology=TOPOLOGY,
                                train_batch_size=2, num_minibatches=1)
    processes.append(admission)
    sidecar = start_sidecar(tmp_path, job=job, store=cluster.store_url, admission=admission.ready["address"],
                            dp_rank=0, cp_rank=0, settings=sidecar_settings)
    processes.append(sidecar)
    return admission, sidecar


def test_the_store_process_dying_fails_the_minibatch_naming_the_unit(tmp_path: Path) -> None:
    job = f"md{uuid.uuid4().hex[:8]}"
    # The master drops a silent owner's segment after client_ttl_s: until then it still lists the dead units.
    cluster = start_mooncake(MooncakeClusterConfig(segment_size=SEGMENT, lease_ttl_ms=200, client_ttl_s=2),
                             log_dir=tmp_path / "mooncake")
    processes: list[Process] = []
    owners = []
    try:
        admission, sidecar = start_service_and_sidecar(tmp_path, job, cluster, processes,
                                                       sidecar_settings={"read_retry_seconds": 2.0})
        address = admission.ready["address"]
        store = open_store(cluster.store_url, job=job)
        rollout = RolloutClient(store, namespace=job)
        client = AdmissionClient(address, deadline=timedelta(seconds=10))
        # Hang guards only: a trainer that gets nothing raises instead of waiting forever.
        trainers = [TrainerClient(TrainerSettings(sidecar=sidecar.ready["address"], tp_rank=tp, global_rank=tp,
                                                  device="cpu", admission=ConnectionSettings(target=address),
                                                  poll_seconds=2.0, sidecar_timeout_seconds=10.0,
                                                  wait_timeout_seconds=120.0)) for tp in range(TP)]
        ranks = [trainer.mini_batches() for trainer in trainers]
        try:
            first = submit(rollout, range(0, 2))
            client.report([meta for meta, _ in first.values()])
            on_every_rank(ranks, lambda rank: consume_intact(rank, first))

            doomed = submit(rollout, range(2, 4))
            os.kill(cluster.owner.pid, signal.SIGKILL)  # the process holding the segment, with their units
            cluster.owner.wait()
            client.report([meta for meta, _ in doomed.values()])
            failures = on_every_rank(ranks, failure_of)
            failed = failures[0]
            assert failed.trajectory_id in doomed, failed
            assert failed.unit_key in {unit.key for unit in doomed[failed.trajectory_id][0].units}, failed
            assert all((f.trajectory_id, f.unit_key) == (failed.trajectory_id, failed.unit_key) for f in failures)

            status = client.status()
            assert status.failed_minibatches == 1
            recorded = status.recent_failures[-1]
            assert (recorded.trajectory_id, recorded.unit_key) == (failed.trajectory_id, failed.unit_key)
            assert sidecar.alive(), sidecar.tail()
            assert admission.alive(), admission.tail()

            owners.append(start_segment_owner(cluster.master_address, segment_size=SEGMENT,
                                              log_dir=tmp_path / "mooncake", log_name="owner-2.log"))
            after = submit(rollout, range(4, 6))
            client.report([meta for meta, _ in after.values()])
            on_every_rank(ranks, lambda rank: consume_intact(rank, after))
            assert sidecar.alive(), sidecar.tail()
        finally:
            for trainer in trainers:
                trainer.close()
            client.close()
            store.close()
    finally:
        for process in reversed(processes):
            process.stop()
        for owner in owners:
            owner.stop()
        cluster.stop()


def test_a_sidecar_stopped_while_its_read_hangs_exits_and_removes_its_segments(tmp_path: Path) -> None:
    """A killed job's processes all get SIGTERM at once, so a sidecar may be stopped while its store read waits
    on a segment owner that no longer answers. Here the owner is frozen (SIGSTOP) under the read, which then
    waits for Mooncake's transfer time-out. The sidecar must still exit at once on SIGTERM, with its shared memory
    and socket gone, and without freeing the memory the read writes into (that would crash it)."""
    job = f"mh{uuid.uuid4().hex[:8]}"
    cluster = start_mooncake(MooncakeClusterConfig(segment_size=SEGMENT, lease_ttl_ms=200),
                             log_dir=tmp_path / "mooncake")
    processes: list[Process] = []
    try:
        admission, sidecar = start_service_and_sidecar(
            tmp_path, job, cluster, processes,
            sidecar_settings={"read_retry_seconds": 3600.0, "server": {"grace_seconds": 1.0, "metrics": {"port": -1}}})
        address = admission.ready["address"]
        prefix = ReorgSettings(job=job, store=cluster.store_url).segment_prefix
        store = open_store(cluster.store_url, job=job)
        try:
            written = submit(RolloutClient(store, namespace=job), range(0, 2))
        finally:
            store.close()
        os.kill(cluster.owner.pid, signal.SIGSTOP)
        with AdmissionClient(address, deadline=timedelta(seconds=10)) as client:
            client.report([meta for meta, _ in written.values()])
            deadline = time.monotonic() + 60
            while client.status().admitted_total < 2:
                assert time.monotonic() < deadline, admission.tail()
                time.sleep(0.05)
        time.sleep(2.0)  # the assignment reaches the sidecar in milliseconds; its read then waits on the owner
        assert list_segments(prefix), "the sidecar has no ring to remove"

        sidecar.signal(signal.SIGTERM)
        code = sidecar.popen.wait(timeout=60)  # a liveness bound: before, it waited for the read to fail
        assert code == 0, sidecar.tail()
        assert "a store call is still in flight" in sidecar.log.read_text(), sidecar.tail()
        assert list_segments(prefix) == []
        assert not Path(sidecar.ready["address"].removeprefix("unix:")).exists()
    finally:
        os.kill(cluster.owner.pid, signal.SIGCONT)
        for process in reversed(processes):
            process.stop()
        cluster.stop()
