"""A private, loopback-only Ray cluster running TransferQueue with its in-memory SimpleStorage backend.

Never the Mooncake backend: its bootstrap runs ``pkill -f mooncake_master`` on the whole host, which
would kill other people's servers. :func:`loopback_transferqueue` refuses any other backend.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import ray
import transfer_queue as tq
from omegaconf import OmegaConf

logger = logging.getLogger(__name__)

SIMPLE_STORAGE = "SimpleStorage"
# Logical CPUs for Ray, so that the controller and storage actors (one CPU each) start on a 2-core host.
RAY_LOGICAL_CPUS = 8
# TransferQueue moves its data over ZMQ, not through the object store, so a small store suffices.
RAY_OBJECT_STORE_BYTES = 256 * 2**20


@contextlib.contextmanager
def loopback_transferqueue(*, storage_units: int, controller: dict[str, Any] | None = None) -> Iterator[Any]:
    """Start Ray on 127.0.0.1 (a fresh local cluster in a private temp dir) and TransferQueue on it.

    Ray's servers and agents, and everything TransferQueue binds (controller and storage-unit ZMQ sockets,
    which use Ray's node address), listen on 127.0.0.1 once :func:`tq.environment.prepare_process_environment`
    has run; this refuses to start otherwise. On exit TransferQueue is closed, Ray shut down and the temp dir
    removed. ``controller`` overrides the controller's settings (its sampler, polling mode). Yields TransferQueue's
    merged config, which other processes' clients need.
    """
    temp_dir = tempfile.mkdtemp(prefix="kt-tq-ray-")
    logger.info("starting a loopback Ray cluster in %s", temp_dir)
    ray.init(
        address="local",
        num_cpus=RAY_LOGICAL_CPUS,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        object_store_memory=RAY_OBJECT_STORE_BYTES,
        _temp_dir=temp_dir,
        log_to_driver=False,
    )
    try:
        node_address = ray.util.get_node_ip_address()
        if not ipaddress.ip_address(node_address.strip("[]")).is_loopback:
            raise RuntimeError(f"Ray's node address is {node_address}, not loopback; see tq/environment.py")
        requested = OmegaConf.create(
            {
                "metrics": {"enabled": False},
                "controller": dict(controller or {}),
                "backend": {
                    "storage_backend": SIMPLE_STORAGE,
                    SIMPLE_STORAGE: {"num_data_storage_units": storage_units},
                },
            }
        )
        merged = tq.init(requested)
        if merged is None or merged.backend.storage_backend != SIMPLE_STORAGE:
            raise RuntimeError("TransferQueue did not start with its SimpleStorage backend")
        logger.info("TransferQueue %s up with %d SimpleStorage units", tq.__version__, storage_units)
        try:
            yield merged
        finally:
            tq.close()
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
