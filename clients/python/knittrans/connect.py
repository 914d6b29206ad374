"""Clients of a running local stack, from its connection file: no address in user code.

``knittrans up`` writes the connection file (:mod:`knittrans.connection_file`). A rollout worker and each trainer
rank then need only::

    rollout = RolloutClient.from_env()                 # writes units to the stack's store, reports to admission
    trainer = TrainerClient.from_env(rank)             # this global rank's sidecar, progress to admission
    admission = AdmissionClient.from_env()             # status, policy version, checkpoints

The file's path is ``KNITTRANS_CONNECTION_FILE`` or ``knittrans-connection.json`` in the current directory
(:func:`knittrans.config.connection_file_path`), or ``connection_file=`` given to each call. A stack still
starting writes it once every server is ready, so each call waits up to ``wait_seconds`` for it to appear.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from knittrans.config import connection_file_path
from knittrans.connection_file import StackConnection, read_connection_file
from knittrans.types import BACKBONE_ROLE

if TYPE_CHECKING:
    from knittrans.client.admission import AdmissionClient
    from knittrans.rollout import RolloutClient
    from knittrans.steps import RestorePoint, StepId
    from knittrans.trainer.client import TrainerClient

DEFAULT_WAIT_SECONDS = 60.0


def load_connection(connection_file: str | Path | None = None, *,
                    wait_seconds: float = DEFAULT_WAIT_SECONDS) -> StackConnection:
    """The running stack's connection file (see the module docstring for where it is)."""
    return read_connection_file(connection_file_path(connection_file), wait_seconds=wait_seconds)


def admission_client(connection_file: str | Path | None = None, *,
                     wait_seconds: float = DEFAULT_WAIT_SECONDS) -> AdmissionClient:
    from knittrans.client.admission import AdmissionClient

    return AdmissionClient(load_connection(connection_file, wait_seconds=wait_seconds).admission)


def rollout_client(connection_file: str | Path | None = None, *, namespace: str = "default",
                   wait_seconds: float = DEFAULT_WAIT_SECONDS, **options: Any) -> RolloutClient:
    """A :class:`RolloutClient` on the stack's store that reports through a batching reporter to its admission
    service; its ``close()`` flushes the reports and closes the reporter, the admission client and the store."""
    from knittrans.client.admission import AdmissionClient
    from knittrans.client.reporter import BatchingReporter
    from knittrans.rollout import RolloutClient
    from knittrans.store.factory import open_store

    connection = load_connection(connection_file, wait_seconds=wait_seconds)
    store = open_store(connection.store, job=connection.job)
    admission = AdmissionClient(connection.admission)
    reporter = BatchingReporter(admission)
    try:
        return RolloutClient(store, namespace=namespace, reporter=reporter, closes=(reporter, admission, store),
                             **options)
    except BaseException:
        for resource in (reporter, admission, store):
            resource.close()
        raise


def trainer_client(global_rank: int, connection_file: str | Path | None = None, *, role: str = BACKBONE_ROLE,
                   wait_seconds: float = DEFAULT_WAIT_SECONDS, restored_step: StepId | RestorePoint | None = None,
                   **settings: Any) -> TrainerClient:
    """The :class:`TrainerClient` of global trainer rank ``global_rank`` for ``role`` (``backbone``, or
    ``encoder:<name>`` for a rank that reads an encoder's sidecar): its sidecar's socket and TP rank come from
    the connection file, progress goes to the stack's admission service. ``restored_step``: as for
    :class:`TrainerClient`, when the job restarts. ``settings`` are further :class:`TrainerSettings` fields
    (``device``, ``prefetch``, ...)."""
    from knittrans.client.connection import ConnectionSettings
    from knittrans.trainer.client import TrainerClient
    from knittrans.trainer.settings import TrainerSettings

    connection = load_connection(connection_file, wait_seconds=wait_seconds)
    sidecar, tp_rank = connection.sidecar_for(global_rank, role)
    return TrainerClient(TrainerSettings(sidecar=sidecar.socket, tp_rank=tp_rank, global_rank=global_rank,
                                         admission=ConnectionSettings(target=connection.admission), **settings),
                         restored_step=restored_step)
