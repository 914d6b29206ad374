"""A rollout's writes while Mooncake's segment owner is replaced (the chaos run's `mooncake-store` fault), against a
real master and owners on loopback.

The owner is killed with kill -9 and a new one mounted at once. Until the master drops the dead owner (after
its client_ttl), it still places some new units in the dead segment, and those writes fail (TRANSFER_FAIL).
The rollout client retries them: every submit returns, and every unit of every submit reads back byte for byte
from the new segment.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np

from knittrans.launch.mooncake import MooncakeClusterConfig, start_mooncake, start_segment_owner
from knittrans.rollout import RolloutClient
from knittrans.store.factory import open_store
from knittrans.types import VersionSegment

MIB = 1 << 20
SEGMENT = 64 * MIB


def fields_of(index: int) -> dict[str, np.ndarray]:
    """Token ids, a mask and a wide per-token field, of a length of its own for each index."""
    generator = np.random.default_rng(1000 + index)
    tokens = generator.integers(1, 50_000, 100 + 17 * index, dtype=np.int32)
    return {"input_ids": tokens, "loss_mask": (tokens % 2).astype(np.uint8),
            "routing": generator.integers(0, 256, (tokens.size, 16), dtype=np.uint8)}


def test_writes_ride_out_a_replaced_segment_owner(tmp_path: Path) -> None:
    cluster = start_mooncake(MooncakeClusterConfig(segment_size=SEGMENT, lease_ttl_ms=200, client_ttl_s=2),
                             log_dir=tmp_path)
    owners = []
    store = open_store(cluster.store_url, job="ownerswap")
    try:
        rollout = RolloutClient(store, namespace="ownerswap", store_retry_seconds=60.0)
        written = {}

        def submit(index: int) -> None:
            fields = fields_of(index)
            meta = rollout.submit(fields, trajectory_id=f"t{index}", sample_id=f"s{index}", source="A",
                                  rollout_step=0,
                                  segments=(VersionSegment(version=0, num_tokens=len(fields["input_ids"])),))
            written[index] = (meta, fields)

        submit(0)
        os.kill(cluster.owner.pid, signal.SIGKILL)
        cluster.owner.wait()
        owners.append(start_segment_owner(cluster.master_address, segment_size=SEGMENT, log_dir=tmp_path,
                                          log_name="owner-2.log"))
        for index in range(1, 9):  # spread over the master's placements, some in the dead segment
            submit(index)

        for index, (meta, fields) in written.items():
            if index == 0:
                continue  # its units were in the dead segment
            for unit in meta.units:
                buffer = np.empty(unit.header.byte_length, dtype=np.uint8)
                store.get_into(unit.key, buffer)
                assert buffer.tobytes() == np.ascontiguousarray(fields[unit.field_name]).tobytes(), unit.key
    finally:
        store.close()
        for owner in owners:
            owner.stop()
        cluster.stop()
