"""Config of `knittrans admission serve` (YAML file, then KNITTRANS_* variables, then flags)."""

from __future__ import annotations

from dataclasses import dataclass, field

from knittrans.admission.engine import EngineConfig
from knittrans.admission.service.retention import RetentionPolicy
from knittrans.admission.service.roles import check_roles_against_schema
from knittrans.errors import InvalidArgument
from knittrans.job import check_job
from knittrans.serving.settings import ServerSettings
from knittrans.trajectory_schema import TrajectorySchema
from knittrans.types import Topology

DEFAULT_PORT = 50051


@dataclass(frozen=True, kw_only=True)
class AdmissionServiceSettings:
    """``state`` is ``memory`` or a ``redis://`` URL; ``store`` is the unit store released units are deleted
    from (``file:///dev/shm/knittrans-<job>``, ``mooncake://...``); empty means nothing is deleted.
    ``redis_timeout_seconds`` bounds one Redis command: past it, a journal write's outcome is unknown and changes
    wait until the journal's tail is read. ``mutation_wait_seconds`` is how long a mutating call waits for its
    turn (during such a wait, or behind other calls) before it fails UNAVAILABLE. ``lease_ttl_seconds`` is how long
    the job's lease in Redis outlives its last renewal: a service of the job that died on another machine is
    replaced at most this long after (see job_lease). ``unreported_unit_ttl_seconds`` is how long a reservation of
    units outlives its trajectory's missing report: then its units are deleted (a rollout that died between
    writing and reporting; see expiry). ``unfinished_step_warning_seconds``: a mini-batch that some consumers
    reported their optimizer step on and others have not, this long after the first, is logged as a warning naming
    those that owe it (a rank that never finished its step). ``schema`` is the trajectory schema every report is
    held to (:mod:`knittrans.trajectory_schema`); without one, the job's first accepted trajectory fixes it.
    ``retain_steps`` and ``retain_until_checkpoint`` keep the units of mini-batches every consumer stepped on for
    a job restored from a checkpoint (see retention)."""

    engine: EngineConfig
    topology: Topology
    job: str = "default"
    state: str = "memory"
    store: str = ""
    label_fields: tuple[str, ...] = ("input_ids",)
    schema: TrajectorySchema | None = None
    initial_version: int = 0
    max_report_batch: int = 10_000
    delete_batch_size: int = 1024
    redis_timeout_seconds: float = 10.0
    mutation_wait_seconds: float = 10.0
    lease_ttl_seconds: float = 20.0
    snapshot_every_records: int = 1000
    unreported_unit_ttl_seconds: float = 600.0
    unfinished_step_warning_seconds: float = 300.0
    retain_steps: int = 0
    retain_until_checkpoint: bool = False
    server: ServerSettings = field(default_factory=lambda: ServerSettings(port=DEFAULT_PORT))

    def __post_init__(self) -> None:
        check_job(self.job)
        if self.initial_version < 0:
            raise InvalidArgument("must not be negative", field="initial_version")
        if not 1 <= self.max_report_batch <= 100_000:
            raise InvalidArgument("must be in [1, 100000]", field="max_report_batch")
        if self.delete_batch_size < 1:
            raise InvalidArgument("must be positive", field="delete_batch_size")
        for name in ("redis_timeout_seconds", "mutation_wait_seconds", "lease_ttl_seconds"):
            if not 0 < getattr(self, name) <= 3600:
                raise InvalidArgument("must be in (0, 3600] seconds", field=name)
        if not 0 < self.unreported_unit_ttl_seconds <= 7 * 86400:
            raise InvalidArgument("must be in (0, 604800] seconds", field="unreported_unit_ttl_seconds")
        if not 0 < self.unfinished_step_warning_seconds <= 86400:
            raise InvalidArgument("must be in (0, 86400] seconds", field="unfinished_step_warning_seconds")
        _ = self.retention  # validates retain_steps and retain_until_checkpoint
        if not 0 <= self.snapshot_every_records <= 1_000_000_000:
            raise InvalidArgument("must be in [0, 1000000000] (0: no snapshots)", field="snapshot_every_records")
        if not self.label_fields:
            raise InvalidArgument("name at least one field that labels come from", field="label_fields")
        if self.schema is not None:
            try:
                self.schema.check_label_fields(self.label_fields)
            except InvalidArgument as exc:
                raise InvalidArgument(exc.message, field=f"schema.{exc.field}") from exc
        check_roles_against_schema(self.topology, self.schema)

    @property
    def retention(self) -> RetentionPolicy:
        return RetentionPolicy(retain_steps=self.retain_steps, retain_until_checkpoint=self.retain_until_checkpoint)
