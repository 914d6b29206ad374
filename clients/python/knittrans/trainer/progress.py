"""Training progress to the admission service: optimizer steps (units may be released) and policy versions."""

from __future__ import annotations

from datetime import timedelta
from typing import Protocol

from knittrans.client.admission import AdmissionClient, ProgressStage
from knittrans.client.connection import ConnectionSettings
from knittrans.types import ConsumerId


class ProgressReporter(Protocol):
    def optimizer_step(self, consumer: ConsumerId, sequence: int) -> None:
        """The optimizer step of assignment ``sequence``'s mini-batch finished on ``consumer``'s ranks."""
        ...

    def advance_version(self, train_batch_index: int, new_version: int) -> int:
        """Train batch ``train_batch_index`` finished; rollout now uses ``new_version``. Returns the version."""
        ...

    def close(self) -> None: ...


class AdmissionProgressReporter:
    """Reports through :class:`~knittrans.client.admission.AdmissionClient` (idempotent calls, retried)."""

    def __init__(self, connection: ConnectionSettings, *, deadline: timedelta = timedelta(seconds=10)) -> None:
        self._client = AdmissionClient(connection, deadline=deadline)

    def optimizer_step(self, consumer: ConsumerId, sequence: int) -> None:
        self._client.report_progress(consumer, sequence, ProgressStage.OPTIMIZER_STEP)

    def advance_version(self, train_batch_index: int, new_version: int) -> int:
        return self._client.advance_version(train_batch_index, new_version)

    def close(self) -> None:
        self._client.close()
